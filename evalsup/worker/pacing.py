"""This worker's share of the global rate limits, set by the supervisor (RATE frames).

Requests per second follow an absolute schedule (uniform, or Poisson arrivals as EvalScope's perf does):
the next start time advances by one interval whatever the loop's lateness, so a late loop does not drift;
a backlog of more than a second is forgotten rather than sent as a burst. Tokens per minute are a bucket
charged with an estimate before a request and corrected from ``usage`` after it.

One ``Pacer`` is the worker's share of the global limits; each endpoint with limits of its own has another
(``endpoints.Endpoint.pacer``, set by ``EndpointPool.apply_rate``). An attempt waits on the global one first,
then picks its endpoint and waits on that one's (``EndpointPool.pick_paced``).
"""

from __future__ import annotations

import asyncio
import random
import time


class Pacer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.rps: float | None = None
        self.poisson = False
        self.next = time.monotonic()
        self.tpm: float | None = None
        self.tokens = 0.0
        self.tokens_at = time.monotonic()

    def set(self, rps: float | None, tpm: float | None, arrivals: str) -> None:
        self.rps = rps if rps and rps > 0 else None
        self.tpm = tpm if tpm and tpm > 0 else None
        self.poisson = arrivals == "poisson"
        now = time.monotonic()
        self.next = max(self.next, now)
        self.tokens = min(self.tokens, self.tpm or 0.0) if self.tpm else 0.0
        self.tokens_at = now

    async def pace(self, estimate: int) -> None:
        """Wait for the next start time, and charge ``estimate`` tokens to the minute's budget (call it only with
        a limit set: without one a request costs no coroutine)."""
        if self.rps is not None:
            await self.request_slot()
        if self.tpm is not None:
            await self.charge_tokens(estimate)

    def _interval(self) -> float:
        assert self.rps is not None
        return self.rng.expovariate(self.rps) if self.poisson else 1.0 / self.rps

    async def request_slot(self) -> None:
        """Wait for this worker's next start time (no-op without a requests/s limit)."""
        if self.rps is None:
            return
        now = time.monotonic()
        if now - self.next > 1.0:
            self.next = now
        slot = self.next
        self.next += self._interval()
        if slot > now:
            await asyncio.sleep(slot - now)

    def _refill(self) -> None:
        assert self.tpm is not None
        now = time.monotonic()
        self.tokens = min(self.tpm, self.tokens + (now - self.tokens_at) * self.tpm / 60.0)
        self.tokens_at = now

    async def charge_tokens(self, estimate: int) -> None:
        """Take ``estimate`` tokens from the minute's budget, waiting while it is in debt."""
        if self.tpm is None:
            return
        self._refill()
        while self.tokens < 0:
            await asyncio.sleep(min(5.0, -self.tokens * 60.0 / self.tpm))
            self._refill()
        self.tokens -= estimate

    def correct_tokens(self, delta: int) -> None:
        if self.tpm is not None:
            self.tokens -= delta
