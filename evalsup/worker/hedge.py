"""When to hedge (issue 28, ``--hedge``): which requests on the wire get a second copy now. Pure: no clock, no I/O.

A hedge is a second copy of a request that has been on the wire much longer than its peers, sent where it may
be answered sooner (another endpoint, when there is one); the first answer is the record, the other copy is
cancelled (``worker.race``). It costs a duplicate request, so it is sent only where a duplicate is cheap and
where waiting is what the run is doing:

- **the tail of the run**: this worker has no task queued and fewer requests active than it may have (its
  limit). The supervisor keeps each worker's queue filled ahead of need (its credit window, twice the
  worker's concurrency), so an empty queue with free capacity means the input is exhausted (or, briefly, the
  supervisor is behind: then only requests far past the p95 qualify, which is what a hedge is for anyway). A
  worker that is paused (memory) never hedges: a copy costs memory too.
- **old**: on the wire (the current attempt, from its request written) at least ``factor`` times the p95 of
  this worker's recent latencies (``LatencyWindow``: its last ``WINDOW`` answered requests, the server's time
  of each; none before ``MIN_SAMPLES`` of them, so a run's first requests are never hedged on no evidence).
- **silent**: no byte of its answer received yet. A request receiving an answer (a stream that is generating)
  is alive, and a copy would start the generation over: never hedged.
- **once**: a task is hedged at most once, and a copy is never hedged itself.
- **within the limit**: at most as many copies start as the worker has free capacity (its limit less its
  active requests, copies counted), the oldest requests first.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Container, Iterable
from dataclasses import dataclass

WINDOW = 256  # the latencies the p95 is read from: this worker's last answered requests
MIN_SAMPLES = 10  # fewer answered requests than this: no p95, no hedge
DEFAULT_FACTOR = 2.0  # --hedge-factor


class LatencyWindow:
    """The server's time of this worker's last ``size`` answered requests (successful ones: a failure's time
    says nothing about how long an answer takes), and their p95."""

    def __init__(self, size: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        self.times: collections.deque[float] = collections.deque(maxlen=size)
        self.min_samples = min_samples

    def add(self, seconds: float) -> None:
        self.times.append(seconds)

    def p95(self) -> float | None:
        """The 95th percentile (nearest rank) of the window; None with fewer than ``min_samples`` in it."""
        n = len(self.times)
        if n < self.min_samples:
            return None
        return sorted(self.times)[max(0, math.ceil(0.95 * n) - 1)]


@dataclass(frozen=True, slots=True)
class Tail:
    """What this worker knows of its share of the run now."""

    queued: int  # tasks waiting in its queue for a slot
    active: int  # requests active (copies included; not those resting in a retry's back-off)
    allowed: int  # requests it may have active (its endpoints' limits under the supervisor's cap)
    paused: bool  # the memory throttle holds it

    @property
    def room(self) -> int:
        """Copies that may start now: its free capacity, in the tail of the run; else none."""
        if self.paused or self.queued > 0:
            return 0
        return max(0, self.allowed - self.active)


def hedges_due(wire: Iterable[tuple[int, float, int]], hedged: Container[int], p95: float | None, factor: float,
               tail: Tail) -> list[int]:
    """The tasks to hedge now, oldest first: of the requests on the wire ``wire`` (task key, seconds on the
    wire, bytes of the answer received), those at least ``factor`` x ``p95`` old, silent, and not of a task
    already hedged (``hedged``: each has a copy, or is a copy), at most ``tail.room`` of them."""
    room = tail.room
    if room <= 0 or p95 is None:
        return []
    after = factor * p95
    due = sorted(((age, key) for key, age, got in wire if got == 0 and age >= after and key not in hedged),
                 reverse=True)
    out: list[int] = []
    for _, key in due:
        if key not in out:
            out.append(key)
            if len(out) == room:
                break
    return out


def tick_s(factor: float, p95: float | None) -> float:
    """How often the worker looks for requests to hedge: a tenth of the hedging age (between 50 ms and 1 s), so
    a request is hedged within ~10 % of its due age; every second while there is no p95 yet."""
    if p95 is None:
        return 1.0
    return min(1.0, max(0.05, factor * p95 / 10))
