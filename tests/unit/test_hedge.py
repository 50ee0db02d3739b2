"""Tail hedging (issue 28, ``--hedge``), without processes or sockets: the pure decision (``worker.hedge``: when
a request gets a second copy, given ages, the p95, what is queued and the limit) and the race of a task's two
copies (``worker.race``: the first answer is the record, the other copy is cancelled, one outcome a task)."""

from __future__ import annotations

import asyncio

import pytest

from evalsup.worker.breaker import HandedBack
from evalsup.worker.client import OnWire, Outcome
from evalsup.worker.hedge import LatencyWindow, Tail, hedges_due, tick_s
from evalsup.worker.race import Hedger, Race

TAIL = Tail(queued=0, active=4, allowed=8, paused=False)


# ------------------------------------------------------------------------------------------ the decision


def test_the_window_has_no_p95_before_enough_answers_then_the_95th_percentile() -> None:
    w = LatencyWindow(size=100, min_samples=10)
    for _ in range(9):
        w.add(0.1)
    assert w.p95() is None  # nine answers: no evidence yet, nothing is hedged
    w.add(0.1)
    assert w.p95() == 0.1
    for i in range(100):
        w.add(float(i + 1))  # 1..100 s: the window keeps the last 100
    assert w.p95() == 95.0


def test_a_request_older_than_k_times_p95_is_hedged_in_the_tail_oldest_first() -> None:
    wire = [(1, 0.5, 0), (2, 2.5, 0), (3, 9.0, 0), (4, 1.9, 0)]
    assert hedges_due(wire, set(), p95=1.0, factor=2.0, tail=TAIL) == [3, 2]  # 1.9 s is not yet 2 x 1 s


def test_no_hedge_while_tasks_are_queued_or_paused_or_without_a_p95() -> None:
    wire = [(1, 60.0, 0)]
    assert hedges_due(wire, set(), 1.0, 2.0, Tail(queued=1, active=4, allowed=8, paused=False)) == []
    assert hedges_due(wire, set(), 1.0, 2.0, Tail(queued=0, active=4, allowed=8, paused=True)) == []
    assert hedges_due(wire, set(), None, 2.0, TAIL) == []


def test_no_more_copies_than_the_free_capacity() -> None:
    wire = [(k, 10.0 + k, 0) for k in range(6)]
    assert hedges_due(wire, set(), 1.0, 2.0, Tail(0, 8, 8, False)) == []  # at the limit: nothing
    assert hedges_due(wire, set(), 1.0, 2.0, Tail(0, 6, 8, False)) == [5, 4]  # two free slots: the two oldest


def test_a_request_receiving_its_answer_is_alive_and_a_task_is_hedged_once() -> None:
    wire = [(1, 30.0, 512), (2, 30.0, 0), (2, 1.0, 0)]  # task 2: its first copy, and its copy
    assert hedges_due(wire, set(), 1.0, 2.0, TAIL) == [2]
    assert hedges_due(wire, {2}, 1.0, 2.0, TAIL) == []  # hedged already (and a copy is never hedged)


def test_the_loop_looks_often_enough_to_hedge_near_the_due_age() -> None:
    assert tick_s(2.0, None) == 1.0
    assert tick_s(2.0, 0.001) == 0.05
    assert tick_s(2.0, 1.0) == 0.2
    assert tick_s(2.0, 60.0) == 1.0


# ------------------------------------------------------------------------------------------ the race


def outcome(endpoint: int, error: str | None = None) -> Outcome:
    return Outcome(200 if error is None else 500, {"ok": endpoint}, 10, None,
                   None if error is None else {"code": error, "message": error}, 1, 0.01, endpoint=endpoint)


class Copies:
    """Fake copies of one request: each waits for its own event, then gives its outcome; cancellations noted."""

    def __init__(self, results: dict[int | None, Outcome]) -> None:
        self.results = results
        self.go: dict[int | None, asyncio.Event] = {k: asyncio.Event() for k in results}
        self.cancelled: list[int | None] = []
        self.avoided: list[int | None] = []

    async def copy(self, avoid: int | None) -> Outcome:
        self.avoided.append(avoid)
        try:
            await self.go[avoid].wait()
        except asyncio.CancelledError:
            self.cancelled.append(avoid)
            raise
        return self.results[avoid]


def test_the_first_answer_is_the_record_and_the_other_copy_is_cancelled() -> None:
    async def go() -> None:
        c = Copies({None: outcome(0), 0: outcome(1)})  # the copy avoids endpoint 0
        race = Race(c.copy)
        ended: list[int] = []
        assert race.hedge(0, lambda: ended.append(1))
        assert not race.hedge(0, lambda: None)  # once
        await asyncio.sleep(0)
        c.go[0].set()  # the copy answers first
        oc, won = await race.result()
        assert (oc.endpoint, won) == (1, 1)
        await asyncio.sleep(0)
        assert c.cancelled == [None] and ended == [1]  # the first copy is cancelled; the copy's end is told
    asyncio.run(go())


def test_a_copy_that_fails_waits_for_the_other_and_neither_answering_gives_the_first_copys_outcome() -> None:
    async def go() -> None:
        c = Copies({None: outcome(0, "http_500"), 0: outcome(1)})
        race = Race(c.copy)
        race.hedge(0, lambda: None)
        await asyncio.sleep(0)
        c.go[None].set()  # the first copy fails: not the record while the other may answer
        await asyncio.sleep(0.01)
        c.go[0].set()
        oc, won = await race.result()
        assert oc.error is None and won == 1

        c = Copies({None: outcome(0, "http_500"), 0: outcome(1, "http_400")})
        race = Race(c.copy)
        race.hedge(0, lambda: None)
        await asyncio.sleep(0)
        c.go[0].set()
        c.go[None].set()
        oc, won = await race.result()
        assert oc.error is not None and oc.error["code"] == "http_500" and won == 0
    asyncio.run(go())


def test_a_copy_handed_back_on_a_drain_leaves_the_other_to_answer_and_both_handed_back_hand_the_task_back() -> None:
    async def go() -> None:
        async def back(avoid: int | None) -> Outcome:
            await asyncio.sleep(0)
            raise HandedBack

        gate = asyncio.Event()

        async def answer(avoid: int | None) -> Outcome:
            if avoid is None:
                raise HandedBack  # the first copy was parked for an outage when the worker drained
            await gate.wait()
            return outcome(1)

        race = Race(answer)
        race.hedge(0, lambda: None)
        await asyncio.sleep(0.01)
        gate.set()
        oc, won = await race.result()
        assert oc.error is None and won == 1

        race = Race(back)
        race.hedge(0, lambda: None)
        with pytest.raises(HandedBack):
            await race.result()  # the task goes back to the supervisor unanswered, as without --hedge
    asyncio.run(go())


def test_the_hedger_counts_a_hedged_task_once_and_which_copy_answered() -> None:
    async def go() -> None:
        copies: list[int] = []
        h = Hedger(2.0, copies.append)
        for _ in range(10):
            h.window.add(0.01)  # p95 10 ms: due at 20 ms
        c = Copies({None: outcome(0), 0: outcome(1)})
        task = asyncio.create_task(h.run(7, c.copy))
        await asyncio.sleep(0)
        now = 100.0
        wire = [OnWire(7, 0, now - 5.0, 1), OnWire(8, 0, now - 5.0, 1)]  # 8: not this worker's race
        assert h.check(wire, now, TAIL) == 1
        assert h.check(wire, now, TAIL) == 0  # hedged once
        await asyncio.sleep(0)
        assert c.avoided == [None, 0]  # the copy's first pick avoids endpoint 0
        c.go[None].set()  # the first copy answers after all
        oc, hedged = await task
        assert hedged is False and oc.endpoint == 0 and h.sent == 1
        await asyncio.sleep(0)
        assert copies == [1, -1] and c.cancelled == [0] and not h.races and not h.hedged
    asyncio.run(go())


def test_prometheus_counts_the_hedges_sent_and_won() -> None:
    from evalsup.supervisor.metrics import Metrics

    m = Metrics()
    for hg in (None, 1, 2, 2):  # RESULT meta "hg": not hedged, the first copy answered, the second did (twice)
        m.on_result({"k": 1, "ok": True, "lat": 0.1, "rt": 0, "ttft": None, **({} if hg is None else {"hg": hg})})

    def value(name: str) -> float:
        got = m.registry.get_sample_value(name)
        assert got is not None
        return got
    assert value("evalsup_hedges_total") == 3 and value("evalsup_hedges_won_total") == 2
