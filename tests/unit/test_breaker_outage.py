"""No task pays for an outage (DESIGN invariant 8), at the worker's client without processes or sockets: the
attempts that failed before the breaker opened are given back when the close says the endpoint had been down,
and a task whose retries come faster than its breaker may trip waits for the breaker's verdict instead of
using up its attempts. The client's attempt loop is driven against a scripted endpoint (a reset while it is
down) and the test plays the supervisor: BREAKER_OPEN on a trip, BREAKER_CLOSE when the endpoint is back.
(The real run: tests/integration/test_http.py::test_endpoint_outage_opens_breaker_and_fails_nothing.)"""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

import aiohttp
import orjson

from evalsup.worker import errors
from evalsup.worker.breaker import LocalBreaker
from evalsup.worker.client import Attempt, Client, Outcome
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.errors import Code
from evalsup.worker.pacing import Pacer
from evalsup.worker.retry import RetryPolicy

PATH = "/v1/chat/completions"


class Outage(Client):
    """One endpoint that resets every request while ``down``. The first requests all reach it before any
    answers (``together``: as the requests in flight when an outage begins fail together). The supervisor's
    part: a trip opens the breaker; ``back()`` ends the outage and closes it, saying whether it had been down."""

    def __init__(self, max_attempts: int = 3, base_s: float = 0.01, together: int = 0) -> None:
        pool = EndpointPool(["http://e/v1"])
        super().__init__(cast(aiohttp.ClientSession, None), pool, RetryPolicy(max_attempts=max_attempts,
                                                                              base_s=base_s),
                         1 << 20, seed=1, pacer=Pacer(random.Random(1)), on_trip=self._tripped,
                         on_probe=lambda e, ok, d: None, cap=lambda: 64)
        self.down = True
        self.together = together
        self._all_in = asyncio.Event()
        self.trips: list[float] = []
        self.first_failure = 0.0

    @property
    def breaker(self) -> LocalBreaker:
        return self.endpoints.all[0].breaker

    def _tripped(self, e: int, reason: str) -> None:
        self.trips.append(asyncio.get_running_loop().time())
        self.endpoints.set_open(e, True)  # the supervisor's BREAKER_OPEN, for every worker

    def back(self, was_down: bool = True) -> None:
        self.down = False
        self.endpoints.set_open(0, False, was_down=was_down)  # the supervisor's BREAKER_CLOSE

    async def attempt(self, url: str, payload: bytes, stream: bool, need: str | None = None,
                      headers: Any = None, wire: Any = None) -> Attempt:
        if self.together:  # the first requests are all in flight before any fails, then fail in one go
            if self.on_wire >= self.together:
                self.together = 0
                self._all_in.set()
            else:
                await self._all_in.wait()
        if self.down:
            if not self.first_failure:
                self.first_failure = asyncio.get_running_loop().time()
            return Attempt(None, b"", None, None, errors.transport(Code.CONNECTION, "Connection reset by peer"))
        body = {"choices": [{"message": {"content": "answer"}}]}
        return Attempt(200, orjson.dumps(body), body, None, None)


def _history(c: Outage, answers: int, answer_s: float) -> None:
    """The answers this worker has seen before the outage (each after ``answer_s``)."""
    for _ in range(answers):
        c.breaker.success(answer_s)


async def _tasks(c: Outage, n: int) -> list[asyncio.Task[Outcome]]:
    return [asyncio.create_task(c.execute(PATH, {"model": "m", "messages": []}, key=k)) for k in range(n)]


async def _back_after_trip(c: Outage, tasks: list[asyncio.Task[Outcome]], was_down: bool = True) -> list[Outcome]:
    """The supervisor: once a trip opened the breaker, its probes find the endpoint down a while, then back."""
    while not c.trips and not all(t.done() for t in tasks):
        await asyncio.sleep(0.005)
    if c.trips:
        await asyncio.sleep(0.05)
        c.back(was_down)
    return [await asyncio.wait_for(t, 5) for t in tasks]


def test_resets_faster_than_the_breaker_may_trip_use_up_no_task_attempts() -> None:
    """The flake of test_endpoint_outage_opens_breaker_and_fails_nothing on a loaded machine: the worker had seen
    16 answers, so four failing tasks are needed, and the run of failures must last as long as an answer takes
    (200 ms here) before the breaker may trip. Resets come back at once and a retry's back-off may be a few ms,
    so before the fix a task used up its 3 attempts inside that wait and was written as connection_error."""

    async def go() -> tuple[list[Outcome], Outage]:
        c = Outage(max_attempts=3, base_s=0.01, together=6)
        _history(c, 16, 0.2)
        assert c.breaker.need == 4  # more than the spread of three: the wait as long as an answer applies
        tasks = await _tasks(c, 6)
        return await _back_after_trip(c, tasks), c

    outcomes, c = asyncio.run(go())
    assert [o.error for o in outcomes if o.error] == []
    assert len(c.trips) == 1 and c.trips[0] - c.first_failure >= 0.2 - 0.01  # it waited as long as an answer
    assert [o.attempts for o in outcomes] == [1] * 6  # none paid for the outage: each only its answer
    assert all(o.sent >= 2 for o in outcomes)


def test_attempts_failed_before_the_trip_are_given_back_when_the_endpoint_had_been_down() -> None:
    """A clean history: the third failing task trips the breaker at once, but the two before it had already
    counted an attempt each (10 of 600 tasks ended the integration test's outage with 2 attempts). When the
    close says the endpoint was down, they get them back; after a false alarm they keep them."""

    async def go(was_down: bool) -> list[Outcome]:
        c = Outage(max_attempts=3, base_s=0.01, together=6)
        _history(c, 50, 0.05)
        assert c.breaker.need == 3
        return await _back_after_trip(c, await _tasks(c, 6), was_down)

    outage = asyncio.run(go(True))
    assert [o.error for o in outage if o.error] == []
    assert [o.attempts for o in outage] == [1] * 6
    false_alarm = asyncio.run(go(False))  # the probe found it serving: every failure was its task's own
    assert [o.error for o in false_alarm if o.error] == []
    assert [o.attempts for o in false_alarm] == [2] * 6


def test_a_run_of_failures_ends_at_an_answer_or_a_close_and_only_an_outage_gives_attempts_back() -> None:
    b = LocalBreaker(spread=3)
    for _ in range(16):
        b.success(0.2)
    first = b.epoch
    assert b.ended(first) is None  # still going
    for k in range(3):
        b.record(k, True, now=10.0)
    assert b.undecided(10.05) == 0.0  # three tasks: not yet enough to trip after 16 answers
    b.record(3, True, now=10.05)
    assert abs(b.undecided(10.05) - 0.15) < 1e-9  # enough tasks, not for as long as an answer takes
    assert not b.overdue(10.1)
    b.success(0.2)  # an answer meanwhile: those failures were not an outage
    assert b.ended(first) is False and not b.overdue(10.3) and b.undecided(10.3) == 0.0
    second = b.epoch
    for k in range(b.need):  # (more now: the failures just seen are part of the history)
        b.record(k, True, now=20.0)
    assert b.undecided(20.1) > 0 and not b.overdue(20.1)
    assert b.overdue(20.25) and b.tripped and b.undecided(20.25) == 0.0
    b.set_open(True)
    assert b.ended(second) is None  # open: not over until the close
    b.set_open(False, was_down=True)
    assert b.ended(second) is True and b.ended(first) is False and b.ended(b.epoch) is None
    third = b.epoch
    b.set_open(True)
    b.set_open(False, was_down=False)  # a false alarm
    assert b.ended(third) is False
