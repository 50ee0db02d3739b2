"""A task's copies racing (issue 28, ``--hedge``): the worker that holds a task may start a second copy of its
request; the first answer is the record and the other copy is cancelled.

It all stays inside the worker: the supervisor still sees one task, one RESULT, and nothing in its ledger
changes. Each copy is one ``Client.execute`` of its own (an asyncio task): the same limits, pacing, retries,
breaker evidence and stall cuts as any request; the second one's first pick avoids the endpoint the first
copy is on (``AttemptState.avoid``: another endpoint when one is up). ``Race.result`` is the first copy's
outcome that is an answer; when a copy ends without one (its attempts used up, a 4xx of its own) the other
may still answer, and when neither does, the first copy's outcome (or its hand-back, on a drain) is the
task's. The copy left running is cancelled where it waits: aiohttp closes its connection as the cancellation
passes, so no late answer can come back to it (an answer for a task is returned once, by one coroutine).

``Hedger`` keeps the races of the tasks in flight, this worker's latency window (``hedge.LatencyWindow``) and
starts the copies ``hedge.hedges_due`` names; the worker's loop asks it every ``hedge.tick_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from evalsup.worker.client import OnWire, Outcome
from evalsup.worker.hedge import LatencyWindow, Tail, hedges_due

# one copy of a task's request: all its attempts (``Client.execute``), the first pick avoiding the endpoint of
# that index (None: the first copy, no preference)
Copy = Callable[[int | None], Coroutine[Any, Any, Outcome]]


class Race:
    """One task's copies: the first starts at once, the second on ``hedge``."""

    def __init__(self, copy: Copy) -> None:
        self._copy = copy
        self.copies: list[asyncio.Task[Outcome]] = [asyncio.create_task(copy(None))]
        self._ended: asyncio.Future[tuple[Outcome, int]] = asyncio.get_running_loop().create_future()
        self.copies[0].add_done_callback(self._settle)

    @property
    def hedged(self) -> bool:
        return len(self.copies) > 1

    def hedge(self, avoid: int, ended: Callable[[], None]) -> bool:
        """Start the second copy, its first pick avoiding endpoint ``avoid``; ``ended`` is called when it ends
        (answered, failed or cancelled). False (nothing started) once hedged or decided."""
        if self.hedged or self._ended.done():
            return False
        t = asyncio.create_task(self._copy(avoid))
        t.add_done_callback(lambda _: ended())
        t.add_done_callback(self._settle)
        self.copies.append(t)
        return True

    def _settle(self, t: asyncio.Task[Outcome]) -> None:
        """A copy ended: the first answer decides; a copy without one waits for the other."""
        exc = None if t.cancelled() else t.exception()  # (retrieved, always: a loser's too)
        if self._ended.done():
            return
        if exc is None and not t.cancelled() and t.result().error is None:
            self._ended.set_result((t.result(), self.copies.index(t)))
            return
        if any(not c.done() for c in self.copies):
            return  # the other copy may still answer
        first = self.copies[0]  # no copy answered: the first copy's outcome is the task's
        if first.cancelled():
            self._ended.cancel()
        elif (e := first.exception()) is not None:
            self._ended.set_exception(e)
        else:
            self._ended.set_result((first.result(), 0))

    async def result(self) -> tuple[Outcome, int]:
        """The record's outcome and the copy it came from (0: the first, 1: the hedge). The copy still running
        then is cancelled; so are both when the task itself is (the worker ends)."""
        try:
            return await self._ended
        finally:
            for c in self.copies:
                if not c.done():
                    c.cancel("hedge: the other copy answered")


class Hedger:
    """The races of the tasks this worker has in flight (with ``--hedge``), the latencies the p95 comes from, and
    the copies started. ``on_copy(+1 / -1)``: a copy starts / ends (the schedule counts it as active)."""

    def __init__(self, factor: float, on_copy: Callable[[int], None]) -> None:
        self.factor = factor
        self.window = LatencyWindow()
        self.on_copy = on_copy
        self.races: dict[int, Race] = {}  # task key -> its race, while the task is in flight
        self.hedged: set[int] = set()  # keys of tasks with a second copy
        self.sent = 0  # copies started (this worker's life)

    async def run(self, key: int, copy: Copy) -> tuple[Outcome, bool | None]:
        """Task ``key``'s outcome, its copies raced: (outcome, None when it was not hedged, else whether the
        second copy's answer is the record). Its attempts, latency and endpoint are the answering copy's; its
        ``total_s`` runs from the first copy's start."""
        t0 = time.monotonic()
        race = Race(copy)
        self.races[key] = race
        try:
            oc, won = await race.result()
        finally:
            del self.races[key]
            self.hedged.discard(key)
        if oc.error is None:
            self.window.add(oc.server_s)
        if won == 1:
            oc.latency_s = max(oc.latency_s, time.monotonic() - t0)
        return oc, (won == 1) if race.hedged else None

    def check(self, wire: Iterable[OnWire], now: float, tail: Tail) -> int:
        """Start the copies due now (``hedge.hedges_due``, over the requests on the wire); how many started."""
        entries = [w for w in wire if w.key in self.races]
        due = hedges_due(((w.key, now - w.sent, w.got) for w in entries), self.hedged, self.window.p95(),
                         self.factor, tail)
        started = 0
        for key in due:
            avoid = next(w.endpoint for w in entries if w.key == key)
            if self.races[key].hedge(avoid, lambda: self.on_copy(-1)):
                self.hedged.add(key)
                self.sent += 1
                self.on_copy(1)
                started += 1
        return started
