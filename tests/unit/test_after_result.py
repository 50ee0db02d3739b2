"""What a RESULT changes, without processes: wake the dispatcher, warm or recycle the worker, hold the pipes."""

from __future__ import annotations

from dataclasses import dataclass

from evalsup.supervisor.after_result import AfterResult, after_result


@dataclass
class W:
    credits: int = 0
    refill: int = 4
    done: int = 1
    task_limit: int | None = None
    window: int = 32
    recycling: bool = False


def decide(w: W, *, input_done: bool = False, suspects_waiting: bool = False, stopping: bool = False,
           backlog: int = 0, held: bool = False) -> AfterResult:
    return after_result(w, input_done=input_done, suspects_waiting=suspects_waiting, stopping=stopping,
                        backlog=backlog, backlog_high=100, held=held)


def test_nothing_to_do() -> None:
    assert decide(W()) == AfterResult(wake=False, step=None, hold=False)


def test_the_dispatcher_wakes_only_with_something_to_do() -> None:
    assert decide(W(credits=4)).wake  # a refill's worth of credits
    assert not decide(W(credits=3)).wake
    assert decide(W(), input_done=True).wake
    assert decide(W(), suspects_waiting=True).wake
    assert decide(W(), stopping=True).wake


def test_task_count_warms_then_recycles() -> None:
    # limit 100, window 32: within max(32, 10) of the limit its successor starts; at the limit it is recycled
    assert decide(W(done=67, task_limit=100)).step is None
    assert decide(W(done=68, task_limit=100)).step == "warm"
    assert decide(W(done=100, task_limit=100)).step == "recycle"
    assert decide(W(done=100, task_limit=100, recycling=True)).step is None
    assert decide(W(done=10**6)).step is None  # no limit


def test_the_pipes_are_held_once_when_the_disk_is_behind() -> None:
    assert not decide(W(), backlog=100).hold
    assert decide(W(), backlog=101).hold
    assert not decide(W(), backlog=101, held=True).hold
