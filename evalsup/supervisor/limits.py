"""The supervisor's view of the workers' concurrency limits (issue 21): each worker runs its own adaptive limit
(``evalsup.worker.adaptive``) under the supervisor's LIMIT cap and reports it in its heartbeats; the sum is what
the progress line, Prometheus (``evalsup_concurrency_limit``) and ``memory.jsonl`` (``concurrency_limit``) show.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class _Limited(Protocol):
    conc_limit: int

    @property
    def alive(self) -> bool: ...


def limit_total(workers: Iterable[_Limited]) -> int:
    """Requests the live workers may have in flight now, by their last heartbeats (0 before the first)."""
    return sum(w.conc_limit for w in workers if w.alive)
