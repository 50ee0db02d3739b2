"""Which queued batch starts next, and each running batch's share of an upstream (pure: no I/O, time passed in).

The policy (docs/serve.md): at most --max-running-batches runs at once. When a slot frees, the key (owner) that
has waited longest since one of its batches last started goes next (a key never served first), and of its batches
the oldest: keys are served round-robin, so a key's large batch, or many of its batches, never starve another
key's small one that came later. Each run gets an equal, fixed share of each upstream's concurrency (the total
divided by --max-running-batches), whatever else runs: the running batches together never ask an upstream for
more than the total, and each adapts its own limit within its share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Queued:
    batch_id: str
    owner: str
    created_at: float


def next_batch(queued: Sequence[Queued], last_start: Mapping[str, float]) -> str | None:
    """The batch to start now, of those queued, given when each owner's last batch started."""
    if not queued:
        return None
    best = min(queued, key=lambda q: (last_start.get(q.owner, float("-inf")), q.created_at, q.batch_id))
    return best.batch_id


def share(total: int, max_running: int) -> int:
    """A run's share of an upstream's concurrency: at least 1."""
    return max(1, total // max(1, max_running))
