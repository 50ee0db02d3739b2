"""SIGTERM/SIGINT that arrive while a run is still starting (imports, the lock, the worker start-up) are kept,
not fatal: the supervisor takes them over once its loop runs (supervisor/run.py), so even an early stop ends
with a checkpoint and exit 75 instead of death by signal (143)."""

from __future__ import annotations

import signal
from types import FrameType

_pending: list[int] = []


def _keep(signum: int, frame: FrameType | None) -> None:
    _pending.append(signum)


def hold() -> None:
    """From now on, keep SIGTERM and SIGINT for later (call first thing in `evalsup run`)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _keep)


def take() -> list[int]:
    """The signals kept so far (each once)."""
    got = list(_pending)
    _pending.clear()
    return got
