"""The worker's side of the circuit breaker: evidence that the endpoint as a whole is failing.

Evidence is the connection itself refused, or endpoint-side failures (resets, timeouts, 500/502/503/504) of
``spread`` distinct tasks with no success in between: one task that always fails is that task's problem, and
uses up its own attempts. On evidence the worker trips and tells the supervisor, which opens the breaker for
every worker and checks the endpoint with a request of its own (GET /models), never with a parked task.
While open, no request starts, and a request whose attempt failed endpoint-side is parked. On close the
supervisor says whether the endpoint had been down (a probe failed): then the parked attempts are not
counted against --max-attempts (no task pays for an outage); if it was up after all, they are.
"""

from __future__ import annotations

import asyncio


class LocalBreaker:
    def __init__(self, spread: int = 3) -> None:
        self.spread = spread
        self.failing: set[int] = set()  # distinct tasks failing endpoint-side since the last success
        self.open = False
        self.tripped = False  # we told the supervisor; reset on close
        self.was_down = False  # how the last opening ended: the endpoint had been down
        self._closed = asyncio.Event()
        self._closed.set()

    def record(self, key: int, endpoint_side: bool, refused: bool = False) -> bool:
        """Record one failed attempt of task ``key``; True when this worker should now trip."""
        if not endpoint_side:
            return False
        self.failing.add(key)
        if self.tripped or self.open:
            return False
        if refused or len(self.failing) >= self.spread:
            self.tripped = True
            return True
        return False

    def success(self) -> None:
        self.failing.clear()

    def set_open(self, is_open: bool, was_down: bool = False) -> None:
        self.open = is_open
        if is_open:
            self._closed.clear()
        else:
            self.tripped = False
            self.was_down = was_down
            self.failing.clear()
            self._closed.set()

    async def wait_closed(self) -> bool:
        """Park until the breaker closes; True when the endpoint had been down (the attempt is not counted)."""
        await self._closed.wait()
        return self.was_down


class AuthWatch:
    """401/403 for ``spread`` distinct tasks with no success in between, or for every request in flight:
    the key was refused (revoked mid-run), and the run must stop resumably rather than fail every task.

    A refused request waits here for the verdict. A success of a request *sent after it* shows the key still
    works, so the refusal was that task's own (written as a failed record); a success of a request sent before
    proves nothing (it may have passed the check before the key was revoked). Once the key is judged lost a
    refused request waits for good, and the supervisor stops the run, so the task is redone by the rerun."""

    def __init__(self, spread: int = 3) -> None:
        self.spread = spread
        self.refused: dict[int, tuple[float, asyncio.Event]] = {}  # task -> (when its request was sent, verdict)
        self.lost = False

    def refuse(self, key: int, sent_at: float, inflight: int) -> bool:
        """Task ``key``'s request sent at ``sent_at`` was refused; True when this makes the key lost (tell the
        supervisor, once)."""
        self.refused[key] = (sent_at, asyncio.Event())
        if not self.lost and (len(self.refused) >= self.spread or len(self.refused) >= inflight):
            self.lost = True
            return True
        return False

    def success(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` succeeded: the refusals of requests sent before it were their own."""
        if not self.refused or self.lost:
            return
        for key, (when, verdict) in list(self.refused.items()):
            if when < sent_at:
                del self.refused[key]
                verdict.set()

    async def wait(self, key: int) -> None:
        """Returns when the refusal was task ``key``'s own; never once the key is lost."""
        entry = self.refused.get(key)
        if entry is not None and not self.lost:
            await entry[1].wait()
        if self.lost:
            await asyncio.Event().wait()  # until the supervisor stops the run and this worker with it
