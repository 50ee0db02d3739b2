"""What a person reads of states (issue 28): a line when a state changes, a repeat at most once a minute with
a count, never every probe; and the probe schedule that decides how soon a recovery is seen. Pure objects,
time passed in (the runs that show it: integration/test_quiet_logs.py)."""

from __future__ import annotations

import itertools

import pytest

from evalsup.supervisor.breaker import PAUSED_PROBE_S, EndpointBreaker
from evalsup.supervisor.endpoints import Endpoints
from evalsup.supervisor.log_gate import LogGate, Say
from evalsup.supervisor.progress import RateWindow

# --------------------------------------------------------------------------------------- the log gate


def test_a_change_is_said_at_once_and_a_repeat_once_a_minute_with_its_count() -> None:
    g = LogGate(every_s=60.0)
    assert g.state("ep") is None
    assert g.note("ep", "down", 0.0) == Say(True, 1, 0.0, 0.0)  # down: said
    said = {t: s for t in range(5, 241, 5) if (s := g.note("ep", "down", float(t))) is not None}  # a probe each 5 s
    assert list(said) == [60, 120, 180, 240]  # still down: once a minute, not every probe
    assert said[240] == Say(False, 12, 0.0, 180.0)  # 12 probes since the last line; down since 0
    assert g.note("ep", "up", 241.0) == Say(True, 1, 241.0, 241.0)  # back: said at once, whatever the minute
    assert g.note("ep", "down", 242.0) is not None and g.state("ep") == "down"  # down again: a change, said


def test_keys_are_apart_and_forget_starts_one_over() -> None:
    g = LogGate(every_s=60.0)
    assert g.note(("endpoint", 0), "down", 0.0) is not None
    assert g.note(("endpoint", 1), "down", 1.0) is not None  # another endpoint's change is its own
    assert g.note(("endpoint", 0), "down", 2.0) is None
    g.forget(("endpoint", 0))
    assert g.note(("endpoint", 0), "down", 3.0) == Say(True, 1, 3.0, 3.0)


def test_a_repeated_event_is_said_the_first_time_then_counted() -> None:
    g = LogGate(every_s=60.0)
    said = [g.note("false alarm", "answers", float(t)) for t in range(0, 130, 2)]  # a false alarm every 2 s
    lines = [(t, s) for t, s in zip(range(0, 130, 2), said, strict=True) if s is not None]
    assert [t for t, _ in lines] == [0, 60, 120]
    assert lines[1][1] == Say(False, 30, 0.0, 0.0) and lines[2][1] == Say(False, 30, 0.0, 60.0)


# --------------------------------------------------------------------------------------- the probe schedule


def probe_times(b: EndpointBreaker, start: float, end: float, paused: bool) -> list[float]:
    """When probes go (every one failing), stepping the clock by 0.1 s as the ticker would."""
    out = []
    for k in range(int(start * 10), int(end * 10)):
        t = k / 10
        if b.probe_due(t):
            b.probe_sent(t)
            b.probe_result(False, t, paused=paused)
            out.append(t)
    return out


def test_while_the_run_is_paused_probes_are_never_more_than_5s_apart() -> None:
    b = EndpointBreaker(first_probe_s=1.0, max_probe_s=30.0)
    assert b.trip(0.0, "refused")
    times = probe_times(b, 0.0, 25.0, paused=True)  # the endpoint is down for 25 s
    assert times == [0.0, 1.0, 3.0, 7.0, 12.0, 17.0, 22.0]  # at once, then 1, 2, 4, then 5 s apart
    assert b.probes_failed == len(times)
    # it comes back at 25 s: the next probe (at most 5 s later) closes it
    due = next(k / 10 for k in range(250, 400) if b.probe_due(k / 10))
    assert due == 27.0 and due - 25.0 <= PAUSED_PROBE_S
    assert b.probe_result(True, due) and b.was_down
    b.trip(100.0, "refused")
    times = probe_times(b, 100.0, 400.0, paused=True)
    assert max(y - x for x, y in itertools.pairwise(times)) == PAUSED_PROBE_S  # however long it lasts


def test_an_endpoint_down_while_others_serve_may_back_off_further() -> None:
    b = EndpointBreaker(first_probe_s=1.0, max_probe_s=30.0)
    b.trip(0.0, "refused")
    times = probe_times(b, 0.0, 200.0, paused=False)
    assert times[:7] == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 61.0]  # 1, 2, 4 ... 30 s (before: also when paused)


def test_the_run_pausing_pulls_a_far_probe_in() -> None:
    eps = Endpoints(["http://a/v1", "http://b/v1"], max_down_s=600.0, max_probe_s=30.0)
    eps.breakers[0].max_probe_s = 30.0  # say endpoint 0 backs off to 30 s while b serves
    assert eps.trip(0, 0.0, "refused") and not eps.open
    for t in (0.0, 1.0, 3.0, 7.0, 15.0):
        assert eps.probes_due(t) == [0]
        eps.probe_sent(0, t)
        eps.probe_result(0, False, t)
    assert eps.breakers[0].next_probe_at == 31.0
    assert eps.trip(1, 16.0, "refused") and eps.open  # now every endpoint is down: the run waits on both
    assert eps.breakers[0].next_probe_at == 20.0  # within 5 s of its last answer, not 31
    assert eps.probes_due(20.0) == [0, 1]


def test_one_endpoint_down_25s_is_seen_back_within_5s() -> None:
    eps = Endpoints(["http://a/v1"], max_down_s=600.0)  # the single breaker backs off to 30 s, but not paused
    assert eps.trip(0, 0.0, "refused") and eps.open
    t = 0.0
    while t < 25.0:
        if eps.probes_due(t):
            eps.probe_sent(0, t)
            eps.probe_result(0, False, t)
        t = round(t + 0.25, 2)  # the ticker
    while not eps.probes_due(t):
        t = round(t + 0.25, 2)
    assert t - 25.0 <= PAUSED_PROBE_S  # before: 31 s (probes at 15 then 31)
    assert eps.probe_result(0, True, t) and not eps.open


# --------------------------------------------------------------------------------------- the ETA


def test_the_rate_leaves_out_the_time_paused() -> None:
    w = RateWindow(0.0, window_s=30.0)
    for t in range(1, 21):
        w.rate(float(t), 10 * t)  # 10 a second for 20 s
    # then every endpoint is down for 40 s: nothing lands, the paused seconds are taken off the clock
    for t in range(21, 61):
        assert w.rate(float(t), 200, paused_s=float(t - 20)) == pytest.approx(10.0)
    # running again: still 10 a second, not 200 / 60 s
    assert w.rate(65.0, 250, paused_s=40.0) == pytest.approx(10.0)
    # without leaving the pause out, the window over it says ~1.7 a second (an ETA six times too long)
    naive = RateWindow(0.0, window_s=30.0)
    for t in range(1, 21):
        naive.rate(float(t), 10 * t)
    assert naive.rate(60.0, 200) < 2.0
