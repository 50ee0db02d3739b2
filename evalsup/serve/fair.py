"""Which queued batch starts next, and each running batch's share of an upstream (pure: no I/O, time passed in).

The policy (docs/serve.md): at most --max-running-batches runs at once. When a slot frees, the key (owner) that
has waited longest since one of its batches last started goes next (a key never served first), and of its batches
the oldest: keys are served round-robin, so a key's large batch, or many of its batches, never starve another
key's small one that came later. And when every slot is taken, a key with a batch waiting and none running gets
one at once: the newest batch of the key that holds the most slots (at least two) yields its slot (its run
drains and checkpoints, and the batch waits in line again, in_progress, to resume exactly once where it stopped).
Each run gets an equal, fixed share of each upstream's concurrency (the total
divided by --max-running-batches), whatever else runs: the running batches together never ask an upstream for
more than the total, and each adapts its own limit within its share."""

from __future__ import annotations

from collections import Counter
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


@dataclass(frozen=True)
class Running:
    batch_id: str
    owner: str
    started: float


def preempt(running: Sequence[Running], queued: Sequence[Queued], max_running: int) -> str | None:
    """The running batch that yields its slot now (see the module's doc), or None."""
    if len(running) < max_running or not queued:
        return None
    held = Counter(r.owner for r in running)
    if all(held[q.owner] for q in queued):
        return None
    owner, n = max(held.items(), key=lambda kv: kv[1])
    if n < 2:
        return None
    return max((r for r in running if r.owner == owner), key=lambda r: (r.started, r.batch_id)).batch_id
