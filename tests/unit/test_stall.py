"""Stalls (issue 28), without processes or sockets: the supervisor's room (``supervisor.stall``) that says when
the run has stalled and on which requests; the heartbeat's ``old`` rows; and the worker's side, which cuts an
attempt on STALL so that the task's own loop records ``timeout_stall``, retries, and answers once."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

import aiohttp
import orjson

from evalsup.ipc import FrameKind, encode_json
from evalsup.ipc.messages import WIRE_TOP, Heartbeat
from evalsup.supervisor.stall import OnWire, StallWatch, on_wire
from evalsup.worker.client import Attempt, Client
from evalsup.worker.client import OnWire as Entry
from evalsup.worker.control import Control
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.errors import Code, FailureKind, stalled
from evalsup.worker.pacing import Pacer
from evalsup.worker.retry import RetryPolicy


def wire(worker: int, key: int, age: float) -> OnWire:
    return OnWire(worker, key, 0, age, 1, 0)


# ------------------------------------------------------------------------------------------ the room


def test_no_stall_while_results_come_or_before_the_quiet_is_long_enough() -> None:
    w = StallWatch(10.0, now=0.0)
    old = [wire(1, 7, 50.0)]
    assert w.check(9.9, old) is None  # quiet for 9.9 s only
    w.result(9.0)
    assert w.check(18.0, old) is None  # a result at 9 s: quiet for 9 s
    got = w.check(19.0, old)
    assert got is not None and got.workers == (1,) and got.oldest[0].key == 7 and got.quiet_s == 10.0
    assert got.age_s == 10.0  # STALL cuts what has been on the wire at least that long


def test_young_requests_are_not_stalled_even_in_a_quiet_run() -> None:
    w = StallWatch(10.0, now=0.0)
    assert w.check(100.0, [wire(1, 1, 9.0), wire(2, 2, 3.0)]) is None  # quiet, but nothing on the wire that long
    assert w.check(100.0, []) is None  # nothing on the wire at all (tasks resting in a back-off, say)


def test_the_decision_names_the_holders_and_the_oldest_first() -> None:
    w = StallWatch(5.0, now=0.0)
    reports = [(1, 20.0, [[11, 0, 12.0, 2, 300], [12, 0, 4.0, 1, 0]]), (2, 19.0, [[21, 1, 30.0, 1, 0]]),
               (3, 20.0, [[31, 0, 1.0, 1, 0]])]
    got = w.check(20.0, on_wire(reports, 20.0))
    assert got is not None
    assert got.workers == (1, 2)  # worker 3's request is young: it gets no STALL
    assert [x.key for x in got.oldest] == [21, 11]  # oldest first, young ones not named
    assert got.oldest[0].age_s == 31.0  # its heartbeat came 1 s ago: the age is carried forward
    assert (got.oldest[1].attempt, got.oldest[1].got) == (2, 300)


def test_one_decision_per_quiet_spell_and_at_most_the_top_named() -> None:
    w = StallWatch(5.0, now=0.0)
    many = [wire(1, k, 100.0 - k) for k in range(20)]
    got = w.check(6.0, many)
    assert got is not None and len(got.oldest) == WIRE_TOP and got.workers == (1,)
    assert w.check(7.0, many) is None  # acted on: the clock starts again
    assert w.check(11.0, many) is not None  # still no result 5 s later: again


def test_off_and_paused() -> None:
    assert StallWatch(0.0, now=0.0).check(1e6, [wire(1, 1, 1e6)]) is None  # --stall-after 0: never
    w = StallWatch(5.0, now=0.0)
    assert w.check(50.0, [wire(1, 1, 50.0)], paused=True) is None  # every endpoint down: the breaker's wait
    assert w.check(54.0, [wire(1, 1, 54.0)]) is None  # and the clock starts again from the pause
    assert w.check(55.0, [wire(1, 1, 55.0)]) is not None


def test_on_wire_skips_workers_without_rows_and_malformed_rows() -> None:
    got = on_wire([(1, 0.0, None), (2, 0.0, []), (3, 0.0, [[1, 0, 2.0]]), (4, 0.0, [[5, 1, 2.0, 3, 9]])], 1.0)
    assert got == [OnWire(4, 5, 1, 3.0, 3, 9)]


# ------------------------------------------------------------------------------------------ the heartbeat


def test_the_heartbeat_names_the_oldest_requests_and_stays_small() -> None:
    client = _client(lambda n, w: asyncio.sleep(0))
    for k in range(50):
        client.wire.add(Entry(k, k % 2, 100.0 + k, 1, k * 10))
    rows = client.oldest(200.0, WIRE_TOP)
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]  # the earliest sent first
    assert rows[0] == [0, 0, 100.0, 1, 0, 0] and rows[1] == [1, 1, 99.0, 1, 10, 0]
    beat: Heartbeat = {"inflight": 50, "wire": 50, "limit": 64, "queued": 0, "parked": 0, "done": 0, "retries": 0,
                       "eps": None, "old": rows}
    frame = encode_json(FrameKind.HEARTBEAT, beat)
    assert len(frame) < 400  # top-k: whatever is on the wire
    back = orjson.loads(frame[5:])
    assert on_wire([(9, 0.0, back["old"])], 0.0)[0] == OnWire(9, 0, 0, 100.0, 1, 0)
    assert client.oldest(200.0, WIRE_TOP) and not _client(lambda n, w: asyncio.sleep(0)).oldest(0.0, WIRE_TOP)


def test_a_hedged_tasks_second_copy_is_marked_from_the_heartbeat_to_status() -> None:
    """--hedge puts one task on the wire twice under one id: the copy's row says so, and `evalsup status` marks it."""
    from evalsup.tools.status import RunState, RunStatus, format_run

    seen: list[bool] = []

    async def note(n: int, w: Any) -> None:
        seen.append(w.hedge)

    async def go() -> None:  # only a copy (its first pick avoiding an endpoint, worker.race) is marked
        client = _client(note)
        await client.execute("/v1/chat/completions", {"model": "m", "messages": []}, key=7)
        await client.execute("/v1/chat/completions", {"model": "m", "messages": []}, key=7,
                             avoid=client.endpoints.all[0])
    asyncio.run(go())
    assert seen == [False, True]
    client = _client(note)
    client.wire.add(Entry(7, 0, 100.0, 1))
    client.wire.add(Entry(7, 1, 150.0, 1, hedge=True))  # the copy, sent later to the other endpoint
    rows = orjson.loads(orjson.dumps(client.oldest(200.0, WIRE_TOP)))
    assert [w.hedge for w in on_wire([(1, 200.0, rows)], 200.0)] == [False, True]
    assert on_wire([(1, 0.0, [[7, 0, 3.0, 1, 0]])], 0.0)[0].hedge is False  # an older worker's 5-element row
    oldest = [{"id": "t7", "endpoint": "http://a/v1", "age_s": 100.0, "attempt": 1, "bytes": 0},
              {"id": "t7", "endpoint": "http://b/v1", "age_s": 50.0, "attempt": 1, "bytes": 0, "hedge": True}]
    text = format_run(RunStatus("r", RunState.RUNNING, oldest=oldest, checkpoint_age_s=1.0))
    assert "'t7' at http://a/v1" in text and "'t7' (hedge) at http://b/v1" in text


# ------------------------------------------------------------------------------------------ the worker's cut


class Scripted(Client):
    """An attempt per call of ``script(n, wire)``: the first hangs (until cut), the next answers."""

    def __init__(self, script: Any) -> None:
        pool = EndpointPool(["http://e/v1"])
        super().__init__(cast(aiohttp.ClientSession, None), pool, RetryPolicy(max_attempts=3, base_s=0.001),
                         1 << 20, seed=1, pacer=Pacer(random.Random(1)), on_trip=lambda e, m: None,
                         on_probe=lambda e, ok, d: None)
        self.script = script
        self.calls = 0
        self.cancelled = 0

    async def attempt(self, url: str, payload: bytes, stream: bool, need: str | None = None,
                      headers: Any = None, wire: Any = None) -> Attempt:
        self.calls += 1
        try:
            await self.script(self.calls, wire)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        body = {"choices": [{"message": {"content": f"answer {self.calls}"}}]}
        return Attempt(200, orjson.dumps(body), body, None, None)


def _client(script: Any) -> Scripted:
    return Scripted(script)


async def _hang_first(n: int, w: Any) -> None:
    if n == 1:
        w.got = 42  # bytes came, then nothing
        await asyncio.Event().wait()


def test_stall_cuts_the_attempt_the_task_retries_and_answers_once() -> None:
    async def go() -> None:
        client = _client(_hang_first)
        run = asyncio.create_task(client.execute("/v1/chat/completions", {"model": "m", "messages": []}, key=7))
        while not client.wire:
            await asyncio.sleep(0)
        (entry,) = client.wire
        assert (entry.key, entry.attempt, entry.got) == (7, 1, 42)
        assert client.abandon(3600.0, entry.sent + 1.0) == 0  # younger than the STALL's age: left alone
        control = Control(cast(Any, None), cast(Any, None), cast(Any, None), cast(Any, None), lambda e: None,
                          lambda: None, lambda: "", client.abandon)
        control.on_frame(FrameKind.STALL, memoryview(orjson.dumps({"age": 0.0})))  # what the supervisor sends
        oc = await asyncio.wait_for(run, 5)
        assert oc.error is None and oc.attempts == 2 and oc.stalled == 1 and oc.sent == 2, oc
        assert oc.body is not None and b"answer 2" in orjson.dumps(oc.body)  # the retry's answer, the only one
        assert client.cancelled == 1 and client.calls == 2 and not client.wire and client.on_wire == 0
    asyncio.run(go())


def test_a_request_that_always_stalls_uses_up_its_attempts() -> None:
    async def always(n: int, w: Any) -> None:
        await asyncio.Event().wait()

    async def go() -> None:
        client = _client(always)
        run = asyncio.create_task(client.execute("/v1/chat/completions", {"model": "m", "messages": []}, key=1))
        while not run.done():
            await asyncio.sleep(0.005)
            client.abandon(0.0, float("inf"))
        oc = run.result()
        assert oc.error is not None and oc.error["code"] == Code.TIMEOUT_STALL and oc.attempts == 3 == oc.stalled
    asyncio.run(go())


def test_a_stall_is_the_endpoints_failure_like_any_timeout() -> None:
    f = stalled(301.0)
    assert f.code == "timeout_stall" and f.kind is FailureKind.ENDPOINT and f.endpoint_side and "301s" in f.message


def test_a_stop_during_a_cut_still_stops_the_task() -> None:
    async def go() -> bool:
        client = _client(_hang_first)
        run = asyncio.create_task(client.execute("/v1/chat/completions", {"model": "m", "messages": []}, key=3))
        while not client.wire:
            await asyncio.sleep(0)
        assert client.abandon(0.0, float("inf")) == 1
        assert client.abandon(0.0, float("inf")) == 0  # cut once: a second STALL cancels nothing more
        run.cancel()  # the worker ends meanwhile: the stop is not taken for the stall
        try:
            await run
        except asyncio.CancelledError:
            return client.calls == 1
        return False
    assert asyncio.run(go())
