"""Which workers are hung. No I/O, no clock: the arbiter passes in the time and kills what this names.

- a worker that is up (READY or DRAINING) and sent no heartbeat for ``timeout_s`` is hung;
- a worker still STARTING is hung only past ``start_timeout_s`` (at least 30 s: an interpreter that imports
  its libraries on a loaded machine is slow, not hung);
- when the supervisor itself did not run for a while (the tree was frozen: docker pause, SIGSTOP, a suspended
  laptop), its workers could not beat either: ``frozen_for`` says by how much to move their clocks on, so that
  none is taken for hung.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from evalsup.supervisor.workers import State

__all__ = ["HangWatch", "Hung"]


class Beating(Protocol):
    """What hang detection reads of a worker."""

    @property
    def id(self) -> int: ...
    @property
    def state(self) -> State: ...
    @property
    def alive(self) -> bool: ...
    @property
    def last_beat(self) -> float: ...
    @property
    def started(self) -> float: ...


@dataclass(frozen=True)
class Hung:
    id: int  # the worker's id (its ledger account)
    silent_s: float  # since its last heartbeat, or since its start when it never came up
    starting: bool  # it never sent READY


class HangWatch:
    def __init__(self, timeout_s: float, period_s: float = 0.25, frozen_after_s: float = 2.0,
                 min_start_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self.start_timeout_s = max(min_start_s, timeout_s)
        self.period_s = period_s  # how often the arbiter asks
        self.frozen_after_s = frozen_after_s

    def frozen_for(self, prev: float, now: float) -> float:
        """How long the supervisor did not run between two ticks (at ``prev`` and ``now``), when that is more
        than ``frozen_after_s`` late; else 0."""
        missed = now - prev - self.period_s
        return missed if missed > self.frozen_after_s else 0.0

    def hung(self, workers: Iterable[Beating], now: float) -> list[Hung]:
        out: list[Hung] = []
        for w in workers:
            if w.state is State.STARTING:
                if now - w.started > self.start_timeout_s:
                    out.append(Hung(w.id, now - w.started, True))
            elif w.alive and now - w.last_beat > self.timeout_s:
                out.append(Hung(w.id, now - w.last_beat, False))
        return out
