"""The attempt policy without sockets: RetryPolicy.decide on an AttemptState returns each verdict the attempt loop
(Client.execute) carries out, with the data it needs, and AttemptState keeps the counters as the loop did."""

from __future__ import annotations

import random

import pytest

from evalsup.worker.errors import Code, answer, from_status, transport
from evalsup.worker.retry import AttemptState, Decision, RetryPolicy, Verdict

P = RetryPolicy(max_attempts=3, base_s=0.5, cap_s=60.0, max_limited_s=60.0)
RESET = transport(Code.CONNECTION, "reset")


def state(used: int = 1, **kw: float) -> AttemptState:
    st = AttemptState(0.0, used=used, sent=used)
    for k, v in kw.items():
        setattr(st, k, v)
    return st


def decide(f: object, st: AttemptState, **kw: object) -> Decision:
    return P.decide(f, st, random.Random(1), **kw)  # type: ignore[arg-type]


def test_done_for_a_failure_no_retry_mends_or_attempts_used_up() -> None:
    assert decide(from_status(400, "bad", None), state()).verdict is Verdict.DONE
    assert decide(answer(Code.TOO_LARGE, "big"), state()).verdict is Verdict.DONE
    assert decide(RESET, state(used=3)).verdict is Verdict.DONE  # --max-attempts used
    d = decide(from_status(404, "no such model", None), state(), up=False, elsewhere=True, endpoints=2)
    assert d.verdict is Verdict.DONE  # not endpoint-side: no move, whatever the endpoint's state


def test_retry_backs_off_with_full_jitter_or_as_asked() -> None:
    d = decide(RESET, state(used=2))
    assert d.verdict is Verdict.RETRY and d.delay is not None and 0.0 <= d.delay <= 0.5 * 2
    assert decide(answer(Code.INVALID_JSON, "not json"), state()).verdict is Verdict.RETRY
    assert decide(from_status(503, "down", None), state()).verdict is Verdict.RETRY  # no Retry-After: a failure
    d = decide(from_status(500, "oops", None), state(used=1))
    assert d.delay is not None and d.delay <= 0.5
    assert decide(from_status(502, "x", 7.0), state()).delay == 7.0  # a Retry-After wins
    assert decide(from_status(502, "x", 500.0), state()).delay == 60.0  # capped


def test_wait_for_flow_control_hops_only_with_another_endpoint() -> None:
    d = decide(from_status(429, "slow down", 2.0), state(used=3))  # whatever was used: not the task's failure
    assert d == Decision(Verdict.WAIT, 2.0, hop=False)
    assert decide(from_status(503, "busy", 5.0), state(), endpoints=2) == Decision(Verdict.WAIT, 5.0, hop=True)
    assert not decide(from_status(429, "x", 5.0), state(hops=3), endpoints=2).hop  # hops bounded too
    assert decide(from_status(429, "x", 30.0), state(limited_s=50.0)).delay == 10.0  # never past the budget
    d = decide(from_status(429, "x", None), state(waits=2))
    assert d.verdict is Verdict.WAIT and d.delay is not None and 0.0 <= d.delay <= 0.5 * 2 ** 2


def test_give_up_past_the_rate_limited_budget() -> None:
    d = decide(from_status(429, "slow down", 1.0), state(limited_s=60.0))
    assert d.verdict is Verdict.GIVE_UP
    assert d.error == {"code": "rate_limited",
                       "message": "still rate-limited (http_429) after 60s of waiting (--max-rate-limited-wait)"}


def test_auth_holds_a_refused_task() -> None:
    assert decide(from_status(401, "bad key", None), state(used=3)) == Decision(Verdict.AUTH)
    assert decide(from_status(403, "no", None), state(), up=False, elsewhere=True, endpoints=2).verdict is Verdict.AUTH


def test_move_off_an_ejected_endpoint_while_another_is_up() -> None:
    assert decide(RESET, state(), up=False, elsewhere=True, endpoints=2) == Decision(Verdict.MOVE)
    assert decide(RESET, state(used=3), up=False, elsewhere=True, endpoints=2).verdict is Verdict.MOVE  # even used up
    assert decide(RESET, state(), up=True, elsewhere=True, endpoints=2).verdict is Verdict.RETRY  # still up: retry


def test_park_when_none_is_up_or_moves_are_used_up() -> None:
    d = decide(RESET, state(used=1), up=False, elsewhere=False)
    assert d.verdict is Verdict.PARK and d.delay is not None and d.delay <= 0.5  # a false alarm: back off, then again
    d = decide(RESET, state(used=1, moves=3), up=False, elsewhere=True, endpoints=2)
    assert d.verdict is Verdict.PARK  # moves bounded: a task failing for itself everywhere cannot go round
    d = decide(RESET, state(used=3), up=False, elsewhere=False)
    assert d == Decision(Verdict.PARK, None)  # a false alarm would leave its attempts used: its record


def test_the_policy_is_pure() -> None:
    st = state(used=2, waits=1, hops=1, moves=1, limited_s=3.0)
    before = (st.used, st.sent, st.waits, st.hops, st.moves, st.limited_s)
    for f in (RESET, from_status(429, "x", 1.0), from_status(401, "x", None), from_status(400, "x", None)):
        for up in (True, False):
            decide(f, st, up=up, elsewhere=not up, endpoints=2)
    assert (st.used, st.sent, st.waits, st.hops, st.moves, st.limited_s) == before
    with pytest.raises(AttributeError):
        Decision(Verdict.DONE).delay = 1.0  # type: ignore[misc]


def test_the_state_counts_as_the_loop_did() -> None:
    st = AttemptState(10.0)
    st.begin(0.25, 1)
    assert (st.used, st.sent, st.queued, st.endpoint) == (1, 1, 0.25, 1)
    st.uncount()  # a 429's wait: not the task's failure
    st.waited(2.0)
    assert (st.used, st.sent, st.waits, st.limited_s, st.avoid) == (0, 1, 1, 2.0, None)
    ep = object()
    st.waited(0.5, ep)  # type: ignore[arg-type]  # cut short: another endpoint had room
    assert (st.waits, st.hops, st.limited_s, st.avoid) == (1, 1, 2.5, ep)
    st.begin(0.5, 0)
    assert (st.used, st.sent, st.queued, st.avoid) == (1, 2, 0.75, None)  # the pick has avoided it once
