"""Many endpoints (issue 21 item 1): one ``Endpoint`` per --base-url, and where each attempt goes.

Each endpoint keeps its own evidence for the breaker (``LocalBreaker``), its own adaptive limit (when the
concurrency adapts) and its own count of requests on the wire. ``EndpointPool.pick`` chooses, for each attempt,
the endpoint with the fewest requests on the wire relative to its current limit, among those not ejected; a
retry picks again, so it may go elsewhere. An endpoint the supervisor ejected (BREAKER_OPEN) gets nothing until
it rejoins (BREAKER_CLOSE); one left out at the start (it failed the connection check) never rejoins.

No I/O and no clock: the client asks, and says what it sent (``sent``/``answered``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

from evalsup.tasks.requests import join_url, public_url
from evalsup.worker.adaptive import AdaptiveLimit
from evalsup.worker.breaker import AuthWatch, HandedBack, LocalBreaker
from evalsup.worker.pacing import Pacer


class Endpoint:
    __slots__ = ("_urls", "adaptive", "auth", "base_url", "breaker", "cool_until", "index", "last_ok", "on_wire",
                 "out", "pacer", "pending", "public")

    def __init__(self, index: int, base_url: str, adaptive: AdaptiveLimit | None = None) -> None:
        self.index = index
        self.base_url = base_url
        self.public = public_url(base_url)  # what records show: no credentials
        self.breaker = LocalBreaker()
        self.auth = AuthWatch()  # is the key refused here? (then the run stops, or goes on without it)
        self.last_ok: tuple[str, str] | None = None  # (path, model) it last answered: what the key check asks
        self.cool_until = 0.0  # it asked for a wait (429, Retry-After) until then: others first, meanwhile
        self.adaptive = adaptive  # None: --concurrency fixes the limit
        self.on_wire = 0  # requests sent here and not yet answered
        self.out = False  # left out for the whole run (failed the connection check, or refused the key)
        self.pacer: Pacer | None = None  # its own rate limits' share (URL=N), see worker.endpoint_pacing
        self.pending = 0  # requests picked for it that wait on its pacer: load, as those on the wire
        self._urls: dict[str, str] = {}  # task path -> URL (the few paths a task file names)

    @property
    def up(self) -> bool:
        return not self.out and not self.breaker.open

    def limit(self, cap: int) -> int:
        """Requests this endpoint may have on the wire from this worker, under the worker's cap."""
        return cap if self.adaptive is None else self.adaptive.allowed(cap)

    def url(self, path: str) -> str:
        url = self._urls.get(path)
        if url is None:
            url = join_url(self.base_url, path)
            if len(self._urls) < 64:  # bounded, whatever paths a task file names
                self._urls[path] = url
        return url


class EndpointPool:
    def __init__(self, urls: Sequence[str], adaptive: Callable[[], AdaptiveLimit | None] = lambda: None) -> None:
        if not urls:
            raise ValueError("no endpoint")
        self.all = [Endpoint(i, u, adaptive()) for i, u in enumerate(urls)]
        self._back: asyncio.Future[bool] | None = None  # resolved when an endpoint rejoins (parked requests)
        self._handing_back = False  # the worker drains: a request that would park is handed back instead
        self.paced = False  # some endpoint has a pacer of its own (worker.endpoint_pacing)

    def __len__(self) -> int:
        return len(self.all)

    def any_up(self) -> bool:
        return any(ep.up for ep in self.all)

    def limit(self, cap: int) -> int:
        """Requests this worker may have in flight: the endpoints' limits together, under its cap."""
        eps = [ep for ep in self.all if ep.up] or [ep for ep in self.all if not ep.out] or self.all
        return max(1, min(cap, sum(ep.limit(cap) for ep in eps)))

    def load(self, cap: int) -> list[list[int]] | None:
        """For the heartbeat, with several endpoints: [limit, requests on the wire] of each (None with one)."""
        return [[ep.limit(cap), ep.on_wire] for ep in self.all] if len(self.all) > 1 else None

    def pick(self, cap: int, avoid: Endpoint | None = None, now: float = math.inf) -> Endpoint | None:
        """The endpoint for the next attempt: fewest on the wire relative to its limit (then fewest on the
        wire, then the first), among those not ejected; None when every one is ejected. Those that asked for
        a wait (429) still running at ``now`` come last, and ``avoid`` (the one that just asked this request
        to wait) is chosen only if no other is up. Requests waiting on an endpoint's own pacer count as on its
        wire, so a rate-limited endpoint is not heaped with them."""
        best: Endpoint | None = None
        best_key = (True, 0.0, 0, 0)
        for ep in self.all:
            if not ep.up or ep is avoid:
                continue
            load = ep.on_wire + ep.pending
            key = (ep.cool_until > now, load / ep.limit(cap), load, ep.index)
            if best is None or key < best_key:
                best, best_key = ep, key
        return best if best is not None or avoid is None or not avoid.up else avoid

    def room_elsewhere(self, ep: Endpoint, cap: int, now: float) -> bool:
        """Another endpoint is up, has room under its limit, and has not asked for a wait still running at
        ``now`` (a request ``ep`` asked to wait, with a 429, goes there rather than wait)."""
        return any(o is not ep and o.up and o.cool_until <= now and o.on_wire + o.pending < o.limit(cap)
                   for o in self.all)

    def set_open(self, index: int, is_open: bool, was_down: bool = False, out: bool = False) -> None:
        """The supervisor's BREAKER_OPEN / BREAKER_CLOSE for one endpoint (``out``: left out for good)."""
        if not 0 <= index < len(self.all):
            return
        ep = self.all[index]
        ep.out = ep.out or out
        if out:
            ep.auth.release()  # requests it refused go to the others
        elif is_open:
            ep.auth.move_on()  # ejected: they go to the others (or park until one is up)
        ep.breaker.set_open(is_open, was_down)
        if ep.up and self._back is not None:
            back, self._back = self._back, None
            if not back.done():
                back.set_result(was_down)

    def hand_back(self) -> None:
        """The worker drains: every request parked for an outage, and any that would park from now on, raises
        HandedBack (its task goes back to the supervisor unanswered, for another worker or the rerun)."""
        self._handing_back = True
        for ep in self.all:
            ep.auth.hand_back()  # and those waiting for a verdict on the key
        back, self._back = self._back, None
        if back is not None and not back.done():
            back.set_exception(HandedBack())

    async def wait_up(self) -> bool:
        """Park until an endpoint rejoins (every one is ejected now); True when it had been down, so the
        attempt that waited is not counted (no task pays for an outage)."""
        if self.any_up():
            return False
        if self._handing_back:
            raise HandedBack
        if self._back is None:
            self._back = asyncio.get_running_loop().create_future()
        return await asyncio.shield(self._back)
