"""The scale-up decision without processes: the run's six conditions (ScaleGate) and the workers' CPU
(ScaleUp), with the time passed in."""

from __future__ import annotations

import dataclasses

import pytest

from evalsup.supervisor.scaling import ScaleGate, ScaleUp

OPEN = ScaleGate(active=1, max_workers=4, paused=False, stopping=False, input_done=False, starting=False,
                 memory_cap=64, concurrency=64)


def busy_scaler(now: float = 10.0) -> ScaleUp:
    s = ScaleUp(busy=0.6, window_s=2.0, settle_s=3.0)
    s.observe(now - 2.0, [(11, 0.0), (12, 0.0)])
    s.observe(now, [(11, 1.6), (12, 1.4)])  # 80% and 70% of a core over the window
    return s


def test_every_condition_met_adds_a_worker() -> None:
    assert OPEN.blocked() is None
    assert busy_scaler().may_add(10.0, OPEN)


@pytest.mark.parametrize(("change", "why"), [
    ({"active": 4}, "at the most workers"),
    ({"active": 5}, "at the most workers"),
    ({"paused": True}, "paused"),
    ({"stopping": True}, "stopping"),
    ({"input_done": True}, "input done"),
    ({"starting": True}, "a worker is starting"),
    ({"memory_cap": 63}, "memory caps requests in flight"),
])
def test_each_run_condition_alone_says_no(change: dict[str, object], why: str) -> None:
    gate = dataclasses.replace(OPEN, **change)  # type: ignore[arg-type]
    assert gate.blocked() == why
    assert not busy_scaler().may_add(10.0, gate)


def test_the_workers_must_all_be_cpu_bound_over_a_full_window() -> None:
    s = ScaleUp(busy=0.6, window_s=2.0, settle_s=3.0)
    assert not s.may_add(0.0, OPEN)  # nothing observed
    s.observe(0.0, [(11, 0.0), (12, 0.0)])
    s.observe(1.0, [(11, 1.0), (12, 1.0)])
    assert not s.may_add(1.0, OPEN)  # less than a window
    s.observe(2.0, [(11, 1.8), (12, 0.4)])
    assert not s.may_add(2.0, OPEN)  # worker 12 at 20%: one idle worker is enough to say no
    s.observe(4.0, [(11, 3.4), (12, 2.0), (13, 0.0)])
    assert not s.may_add(4.0, OPEN)  # a worker just started: no full window for it yet


def test_after_a_change_it_settles_first() -> None:
    s = busy_scaler(10.0)
    s.changed(10.0)
    for t, c in ((10.5, 0.0), (12.5, 1.6)):
        s.observe(t, [(11, c), (12, c)])
    assert s.wants_more(12.5) is False and not s.may_add(12.5, OPEN)  # busy, but the last change is 2.5 s old
    s.observe(13.5, [(11, 2.4), (12, 2.4)])
    assert s.may_add(13.5, OPEN)
