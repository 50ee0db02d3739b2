"""Which task starts when (evalsup.worker.schedule): a request back from a rest under an adaptive limit."""

from __future__ import annotations

import asyncio

from evalsup.worker.adaptive import AdaptiveLimit, AdaptiveSettings
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.schedule import Schedule


def test_a_request_back_from_its_rest_takes_the_next_place_before_a_new_task_and_never_one_past_the_limit() -> None:
    async def main() -> None:
        pool = EndpointPool(["http://127.0.0.1:1/v1"],
                            adaptive=lambda: AdaptiveLimit(AdaptiveSettings(max_limit=1, initial=1)))
        started: list[int] = []
        sch = Schedule(10, None, pool, lambda meta, line: started.append(meta["k"]))
        resting = 0
        sch.resting = lambda: resting
        for k in range(3):
            sch.add({"k": k}, b"")
        sch.pump()
        assert started == [0]  # limit 1
        resting = 1  # task 0 waits out a Retry-After: it holds no place, task 1 starts
        sch.pump()
        assert started == [0, 1]
        back = asyncio.ensure_future(sch.back())  # task 0's wait ends while task 1 is on the wire: it waits
        await asyncio.sleep(0)
        assert not back.done()
        sch.answered()  # task 1 answered: the place goes to task 0, not to the queued task 2
        sch.pump()
        await asyncio.sleep(0)
        assert back.done() and started == [0, 1]
        resting = 0  # (task 0 is sent: on the wire again)
        assert sch.active() == 1 and not sch.can_start()

    asyncio.run(main())



def test_requests_back_from_their_rests_never_wait_for_each_other_while_places_are_free() -> None:
    async def main() -> None:
        pool = EndpointPool(["http://127.0.0.1:1/v1"],
                            adaptive=lambda: AdaptiveLimit(AdaptiveSettings(max_limit=2, initial=2)))
        sch = Schedule(10, None, pool, lambda meta, line: None)
        sch.resting = lambda: 2
        sch.inflight = 4  # two on the wire (the limit), two resting
        first = asyncio.ensure_future(sch.back())  # one rest ends: no place
        await asyncio.sleep(0)
        assert not first.done()
        sch.inflight = 2  # the two on the wire end without a pump (handed back, say)
        second = asyncio.ensure_future(sch.back())  # the other rest ends: both places are free
        for _ in range(3):  # (a few turns of the loop: nothing else runs that could pump)
            await asyncio.sleep(0)
        assert first.done() and second.done()

    asyncio.run(main())
