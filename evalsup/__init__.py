"""evalsup: a memory-safe, crash-safe batch runner for OpenAI-compatible endpoints.

From Python: ``evalsup.run(tasks, base_url=..., model=..., out=...)`` runs a job as ``evalsup run`` does and
returns a ``RunResult``; ``evalsup.read_results(run_dir)`` streams the records; ``evalsup.to_pandas(run_dir)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["BadInput", "BadSettings", "EndpointUnavailable", "EvalsupError", "Judge", "Record", "ResultsDamaged",
           "RunResult", "RunStopped", "read_results", "run", "to_pandas"]

if TYPE_CHECKING:
    from evalsup.api.exceptions import (
        BadInput,
        BadSettings,
        EndpointUnavailable,
        EvalsupError,
        ResultsDamaged,
        RunStopped,
    )
    from evalsup.api.options import Judge
    from evalsup.api.results import Record, read_results, to_pandas
    from evalsup.api.run import RunResult, run

_WHERE = {"run": "api.run", "RunResult": "api.run", "read_results": "api.results", "to_pandas": "api.results",
          "Record": "api.results", "Judge": "api.options",
          "BadInput": "api.exceptions", "BadSettings": "api.exceptions", "EndpointUnavailable": "api.exceptions",
          "EvalsupError": "api.exceptions", "ResultsDamaged": "api.exceptions",
          "RunStopped": "api.exceptions"}


def __getattr__(name: str) -> Any:
    """Loaded on first use, so the CLI and the worker processes (which import evalsup) pay nothing for the API."""
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"evalsup.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'evalsup' has no attribute {name!r}")
