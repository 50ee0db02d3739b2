"""Hang detection without processes: which workers are hung, given their heartbeats and the time passed in."""

from __future__ import annotations

from dataclasses import dataclass

from evalsup.supervisor.hang import HangWatch, Hung
from evalsup.supervisor.workers import State


@dataclass
class W:
    id: int
    state: State
    last_beat: float = 0.0
    started: float = 0.0

    @property
    def alive(self) -> bool:
        return self.state in (State.STARTING, State.READY, State.DRAINING)


def test_a_worker_that_stopped_beating_is_hung() -> None:
    h = HangWatch(timeout_s=10.0)
    ws = [W(1, State.READY, last_beat=100.0), W(2, State.READY, last_beat=95.0), W(3, State.DRAINING, last_beat=99.0)]
    assert h.hung(ws, 105.0) == []
    assert h.hung(ws, 105.5) == [Hung(2, 10.5, False)]  # strictly past the timeout
    assert [x.id for x in h.hung(ws, 110.5)] == [1, 2, 3]  # a draining worker must beat too


def test_a_worker_gone_or_killed_is_not_hung_again() -> None:
    h = HangWatch(timeout_s=10.0)
    assert h.hung([W(1, State.KILLED, last_beat=0.0), W(2, State.GONE, last_beat=0.0)], 1000.0) == []


def test_a_starting_worker_gets_at_least_30s_and_its_beats_do_not_count() -> None:
    h = HangWatch(timeout_s=10.0)
    w = W(1, State.STARTING, last_beat=0.0, started=0.0)
    assert h.hung([w], 29.0) == []  # no heartbeat yet: not hung while it starts
    assert h.hung([w], 30.5) == [Hung(1, 30.5, True)]
    long = HangWatch(timeout_s=60.0)
    assert long.hung([w], 59.0) == [] and long.hung([w], 61.0) == [Hung(1, 61.0, True)]


def test_a_frozen_supervisor_moves_the_clocks_on() -> None:
    h = HangWatch(timeout_s=10.0, period_s=0.25)
    assert h.frozen_for(100.0, 100.25) == 0.0
    assert h.frozen_for(100.0, 102.25) == 0.0  # 2 s late: an ordinary stall, not a freeze
    assert h.frozen_for(100.0, 160.25) == 60.0  # docker pause, SIGSTOP, a suspended laptop
    # after the arbiter moves the beats on by that much, a worker that beat just before is not hung
    w = W(1, State.READY, last_beat=99.0)
    assert h.hung([w], 160.25) == [Hung(1, 61.25, False)]
    w.last_beat += h.frozen_for(100.0, 160.25)
    assert h.hung([w], 160.25) == []
