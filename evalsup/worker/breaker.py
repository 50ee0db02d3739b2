"""The worker's side of the circuit breaker.

The worker watches its recent attempts; when most of them failed for an endpoint-side reason
(connection refused or reset, timeouts, 500/502/503/504) it trips and tells the supervisor, which opens
the breaker for every worker. While open, no request starts and a request that failed endpoint-side is
parked instead of using up its attempts. The supervisor asks for probes; a parked request (or, with none,
a GET of /models) is tried once, and the result goes back. On close, parked requests carry on with a
fresh attempt budget: tasks are not failed while the endpoint is down.
"""

from __future__ import annotations

import asyncio
import collections

ENDPOINT_STATUSES = frozenset({500, 502, 503, 504})


def endpoint_side(status: int | None, code: str | None) -> bool:
    """Did this failed attempt fail because the endpoint is unwell (rather than the request)?"""
    if status is None:
        return code in ("connection_error", "timeout_connect", "timeout_read", "timeout_total")
    return status in ENDPOINT_STATUSES


class LocalBreaker:
    def __init__(self, window: int = 20, min_attempts: int = 5, ratio: float = 0.8, run: int = 5) -> None:
        self.recent: collections.deque[bool] = collections.deque(maxlen=window)
        self.run = run  # this many endpoint-side failures in a row trip at once (an outage hits all in flight)
        self.consecutive = 0
        self.failures = 0  # of the attempts in `recent` (kept, not summed per attempt)
        self.min_attempts = min_attempts
        self.ratio = ratio
        self.open = False
        self.tripped = False  # we told the supervisor; reset on close
        self.probes = 0  # probe turns granted and not yet taken
        self.changed = asyncio.Condition()

    def record(self, failed_endpoint_side: bool) -> bool:
        """Record one attempt; True when this worker should now trip (tell the supervisor)."""
        recent = self.recent
        if len(recent) == recent.maxlen and recent[0]:
            self.failures -= 1  # the oldest goes out of the window
        recent.append(failed_endpoint_side)
        if failed_endpoint_side:
            self.failures += 1
            self.consecutive += 1
        else:
            self.consecutive = 0
        if self.tripped or self.open:
            return False
        n = len(recent)
        if self.consecutive >= self.run or (n >= self.min_attempts and self.failures >= self.ratio * n):
            self.tripped = True
            return True
        return False

    async def set_open(self, is_open: bool) -> None:
        async with self.changed:
            self.open = is_open
            if not is_open:
                self.tripped = False
                self.probes = 0
                self.recent.clear()
                self.failures = 0
                self.consecutive = 0
            self.changed.notify_all()

    async def grant_probe(self) -> None:
        async with self.changed:
            self.probes += 1
            self.changed.notify_all()

    async def wait_turn(self) -> str:
        """Park until the breaker closes ("closed") or this request may be the probe ("probe")."""
        async with self.changed:
            while True:
                if not self.open:
                    return "closed"
                if self.probes > 0:
                    self.probes -= 1
                    return "probe"
                await self.changed.wait()
