"""Which queued task starts when: the worker's queue of tasks and the limits a start waits on.

The supervisor sends TASK frames ahead of need (its credit window); they wait here, in order. A task starts when
the worker is not paused, some endpoint is up, fewer requests are active than the limit allows (the endpoints'
adaptive limits together, under the supervisor's LIMIT), and fewer than ``concurrency`` tasks hold a slot (a task
holds its slot until its RESULT frame is on its way, so a full pipe holds back new requests). Each start is one
task of its own, begun by ``pump`` rather than by a pool of waiting coroutines (a pool on one condition woke all
of its idle members for each event).

With an adaptive limit a request resting in a retry's back-off or a 429's Retry-After holds no place (it loads
no server); when its rest ends it waits here (``back``) for a place under the limit, before any queued task
(issue 41: a rest that held its place cost a whole second a task at limit 1; one sent again without a place
would send past the limit as many as were resting).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from evalsup.worker.endpoints import EndpointPool


class Schedule:
    def __init__(self, concurrency: int, limit: int | None, endpoints: EndpointPool,
                 start: Callable[[Any, bytes | memoryview], None]) -> None:
        self.concurrency = concurrency
        self.limit = max(1, min(concurrency, limit or concurrency))  # the supervisor's cap (LIMIT)
        self.endpoints = endpoints
        self.start = start  # begins one task (its meta, its line)
        self.queue: collections.deque[tuple[Any, bytes | memoryview]] = collections.deque()
        self.inflight = 0  # requests begun and not answered
        self.slots = 0  # tasks begun whose RESULT frame is not yet on its way
        self.paused = False
        # with an adaptive limit, requests resting in a retry's back-off (they load no server) hold no slot:
        # how many there are now (Client.resting), set once the client exists
        self.resting: Callable[[], int] | None = None
        self.copies = 0  # hedges' second copies running (--hedge, worker.race): active, as any request
        self._back: collections.deque[asyncio.Future[None]] = collections.deque()  # rests ended, waiting a place
        self._granted = 0  # of them, given a place and not yet resumed (still counted as resting meanwhile)

    def add(self, meta: Any, line: bytes | memoryview) -> None:
        """A TASK frame: queued, its queue_s counted from now."""
        meta["q"] = time.monotonic()
        self.queue.append((meta, line))

    def take_all(self) -> list[int]:
        """DRAIN: every queued task's key, the queue emptied (they go back to the supervisor, unbegun)."""
        keys = [meta["k"] for meta, _ in self.queue]
        self.queue.clear()
        return keys

    def set_limit(self, inflight: int) -> None:
        """LIMIT: the supervisor's cap on requests in flight (memory, autoscaling), within ``concurrency``."""
        self.limit = max(1, min(self.concurrency, inflight))

    def allowed(self) -> int:
        """Requests this worker may have in flight now: its endpoints' limits together, under the supervisor's
        cap (worker.endpoints)."""
        return self.endpoints.limit(self.limit)

    def active(self) -> int:
        """Requests begun and not answered, hedges' copies included; with an adaptive limit, less those resting
        in a retry's back-off."""
        return self.inflight + self.copies - (self.resting() if self.resting is not None else 0) + self._granted

    async def back(self) -> None:
        """A request whose rest ended (still counted as resting) waits for a place under the limit, ahead of the
        queued tasks (``pump`` gives them out first)."""
        if not self._back and self.active() < self.allowed():
            return
        fut = asyncio.get_running_loop().create_future()
        self._back.append(fut)
        self._grant()  # (those ahead may be waiting for a pump that no event brings)
        try:
            await fut
        finally:
            if fut.done() and not fut.cancelled():
                self._granted -= 1
            else:
                fut.cancel()  # (cancelled while waiting: pump skips it)

    def can_start(self) -> bool:
        return (bool(self.queue) and not self.paused and self.endpoints.any_up() and self.active() < self.allowed()
                and self.slots < self.concurrency)

    def pump(self) -> bool:
        """Start every task that may start now; True when one did."""
        started = False
        self._grant()  # rests ended first: they were begun before
        while self.can_start():
            meta, line = self.queue.popleft()
            meta["q"] = time.monotonic() - meta.get("q", 0.0)  # the time it waited here for a slot (queue_s)
            self.inflight += 1
            self.slots += 1
            self.start(meta, line)
            started = True
        return started

    def _grant(self) -> None:
        """Places under the limit to the requests back from a rest, in order."""
        while self._back and self.active() < self.allowed():
            fut = self._back.popleft()
            if not fut.done():
                fut.set_result(None)
                self._granted += 1

    def answered(self) -> None:
        """A task's requests are over (its record is built, or it was handed back)."""
        self.inflight -= 1

    def freed(self) -> None:
        """A task's RESULT frame is on its way (or it ended otherwise): its slot may take another."""
        self.slots -= 1
