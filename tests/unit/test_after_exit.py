"""What a worker's exit leads to, without processes: stop, nothing, or a restart counted against the
restart intensity (time passed in)."""

from __future__ import annotations

from evalsup.supervisor.after_exit import AfterExit, after_exit
from evalsup.supervisor.policies import RestartIntensity
from evalsup.supervisor.workers import Exit


def test_a_worker_that_could_not_start_stops_the_run() -> None:
    i = RestartIntensity(3, 60.0)
    assert after_exit(Exit.CRASHED, fatal=True, stopping=False, intensity=i, now=0.0) == AfterExit("stop_fatal")
    assert after_exit(Exit.CRASHED, fatal=True, stopping=True, intensity=i, now=0.0) == AfterExit("nothing")
    assert i.count(0.0) == 0  # not counted as a restart


def test_planned_exits_and_exits_during_a_stop_lead_to_nothing() -> None:
    i = RestartIntensity(3, 60.0)
    for how in (Exit.DRAINED, Exit.STOPPED, Exit.HARD_KILL):
        assert after_exit(how, fatal=False, stopping=False, intensity=i, now=0.0) == AfterExit("nothing")
    assert after_exit(Exit.CRASHED, fatal=False, stopping=True, intensity=i, now=0.0) == AfterExit("nothing")
    assert i.count(0.0) == 0


def test_unplanned_exits_restart_until_the_intensity_is_passed() -> None:
    i = RestartIntensity(2, 60.0)
    assert after_exit(Exit.HUNG, fatal=False, stopping=False, intensity=i, now=0.0) == AfterExit("restart", "hung")
    assert after_exit(Exit.CRASHED, fatal=False, stopping=False, intensity=i, now=1.0) == \
        AfterExit("restart", "crashed")
    assert after_exit(Exit.CRASHED, fatal=False, stopping=False, intensity=i, now=2.0) == \
        AfterExit("stop_crash_loop", "crashed")
    # spread out over more than the period, the same number is no crash loop
    j = RestartIntensity(2, 60.0)
    assert [after_exit(Exit.CRASHED, fatal=False, stopping=False, intensity=j, now=t).step
            for t in (0.0, 61.0, 122.0)] == ["restart"] * 3
