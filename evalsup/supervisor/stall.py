"""The tail of a run, visible and bounded (issue 28): which requests have been on the wire longest, and when
the run has stalled on them.

Each worker's heartbeat names its oldest requests on the wire (``ipc.messages.Heartbeat`` ``old``, at most
``WIRE_TOP``: key, endpoint, seconds, attempt, bytes so far, whether a hedge's copy). ``on_wire`` merges them
across workers, their ages carried forward to now. A hedged task (``--hedge``) is on the wire twice under one
id: its second copy is marked ``hedge``, and `evalsup status` and the stall line say so.

``StallWatch`` decides: when no result has come from any worker for ``--stall-after``
seconds while some request has been on the wire at least that long, the run is stalled on those requests, and
the arbiter sends STALL to the workers holding them (they cut those attempts, which fail as ``timeout_stall``
and are retried like any timeout, an attempt used). The supervisor decides because only it sees results come
from every worker: a worker whose own requests are all stuck cannot tell a slow run from a stalled one.

No I/O and no clock: the arbiter passes the time in (monotonic) and carries out what ``check`` returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from evalsup.ipc.messages import WIRE_TOP


@dataclass(frozen=True, slots=True)
class OnWire:
    """One request on the wire, as its worker's last heartbeat reported it, its age as of now."""

    worker: int  # WorkerHandle.id
    key: int  # the task's key
    endpoint: int
    age_s: float
    attempt: int
    got: int  # bytes of the answer received so far
    hedge: bool = False  # a hedge's second copy of the task's request (--hedge): the task is on the wire twice


def on_wire(reports: Iterable[tuple[int, float, Sequence[Sequence[float]] | None]], now: float) -> list[OnWire]:
    """Every request the heartbeats name, oldest first. ``reports``: (worker id, when its last heartbeat came,
    its ``old`` rows). An age is the worker's at the heartbeat plus the time since it came: never more than the
    request's true age (the heartbeat was sent before it came), so a STALL for that age finds the request."""
    out = []
    for worker, beat_t, rows in reports:
        later = max(0.0, now - beat_t)
        for r in rows or ():
            if len(r) >= 5:
                out.append(OnWire(worker, int(r[0]), int(r[1]), float(r[2]) + later, int(r[3]), int(r[4]),
                                  len(r) > 5 and bool(r[5])))
    out.sort(key=lambda w: -w.age_s)
    return out


@dataclass(frozen=True, slots=True)
class Stalled:
    """The run is stalled: STALL ``{"age": age_s}`` goes to each of ``workers``; ``oldest`` is what the line
    names; ``quiet_s``: seconds since the last result."""

    age_s: float
    workers: tuple[int, ...]
    oldest: tuple[OnWire, ...]
    quiet_s: float


class StallWatch:
    """``--stall-after`` (0: never). The clock of quiet starts at the run's start and again at each result, at
    each stall acted on, and while every endpoint is down (the breaker's probes own that wait)."""

    def __init__(self, after_s: float, now: float) -> None:
        self.after_s = after_s
        self.since = now

    def result(self, now: float) -> None:
        self.since = now

    def check(self, now: float, wire: Sequence[OnWire], paused: bool = False) -> Stalled | None:
        """Stalled on the requests of ``wire`` (``on_wire``'s) on the wire for ``after_s`` or more, when no result
        came for ``after_s``; else None. Once acted on, the clock starts again: the retried attempts are young,
        and are judged only once they too have been on the wire that long."""
        if self.after_s <= 0:
            return None
        if paused:
            self.since = now
            return None
        quiet = now - self.since
        if quiet < self.after_s:
            return None
        stuck = [w for w in wire if w.age_s >= self.after_s]
        if not stuck:
            return None
        self.since = now
        return Stalled(self.after_s, tuple(sorted({w.worker for w in stuck})), tuple(stuck[:WIRE_TOP]), quiet)
