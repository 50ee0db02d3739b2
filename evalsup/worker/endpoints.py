"""Many endpoints (issue 21 item 1): one ``Endpoint`` per --base-url, and where each attempt goes.

Each endpoint keeps its own evidence for the breaker (``LocalBreaker``), its own adaptive limit (when the
concurrency adapts) and its own count of requests on the wire. ``EndpointPool.pick`` chooses, for each attempt,
the endpoint with the fewest requests on the wire relative to its current limit, among those not ejected; a
retry picks again, so it may go elsewhere. An endpoint the supervisor ejected (BREAKER_OPEN) gets nothing until
it rejoins (BREAKER_CLOSE); one left out at the start (it failed the connection check) never rejoins.

An ``Endpoint`` changes only through its own methods, each named for what happened: a request ``sent`` to it
and ``answered``; an answer that ``succeeded`` or ``failed`` (the breaker's and the key's evidence); a wait it
asked for (``cool``); the supervisor's BREAKER_OPEN/BREAKER_CLOSE (``set_open``) or this worker's own trip
(``eject``, and ``settle``: a run of failures that outlasted an answer); the key check's findings
(``key_refused``, ``key_taken``, ``key_lost``, ``key_check_ended``); its rate limits (``set_rate``, ``pace``,
``correct_usage``); and every attempt's evidence for its adaptive limit (``observe``, ``server_queue``). No
I/O: the client asks, and says what it sent.

Per-endpoint rate limits (issue 21 item 1): the RATE frame (``ipc.messages.Rate``) carries this worker's share of
the global limits, for the worker's ``Pacer``, and of each endpoint's own (``eps``), for that endpoint's
(``EndpointPool.apply_rate``). An attempt waits on the global pacer first (the client), then picks its endpoint
and waits on that endpoint's pacer (``pick_paced``): pick, then pace. While it waits it counts as that
endpoint's load (``Endpoint.pending``), so the pick sends the next requests elsewhere rather than queueing them
behind a slow limit. The time waited is the client's, never the server's (``queue_s``).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from evalsup.tasks.requests import credentials, join_url, public_url
from evalsup.worker.adaptive import AdaptiveLimit
from evalsup.worker.breaker import AuthWatch, HandedBack, LocalBreaker
from evalsup.worker.errors import Failure
from evalsup.worker.pacing import Pacer


class Endpoint:
    __slots__ = ("_urls", "adaptive", "address", "auth", "base_url", "breaker", "cool_until", "headers", "index",
                 "last_ok", "on_wire", "out", "pacer", "pending", "public")

    def __init__(self, index: int, base_url: str, adaptive: AdaptiveLimit | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.index = index
        self.base_url = base_url
        self.public = public_url(base_url)  # what records show: no credentials, no query
        # what requests go to: no user:password@ (sent as basic auth in ``headers``), the query kept (issue 34)
        self.address = credentials(base_url)[0]
        # every header of a request to it (tasks.headers.request_headers: its own Authorization with the rest)
        self.headers: Mapping[str, str] = headers or {}
        self.breaker = LocalBreaker()
        self.auth = AuthWatch()  # is the key refused here? (then the run stops, or goes on without it)
        self.last_ok: tuple[str, str] | None = None  # (path, model) it last answered: what the key check asks
        self.cool_until = 0.0  # it asked for a wait (429, Retry-After) until then: others first, meanwhile
        self.adaptive = adaptive  # None: --concurrency fixes the limit
        self.on_wire = 0  # requests sent here and not yet answered
        self.out = False  # left out for the whole run (failed the connection check, or refused the key)
        self.pacer: Pacer | None = None  # its own rate limits' share (URL=N): set_rate
        self.pending = 0  # requests picked for it that wait on its pacer: load, as those on the wire
        self._urls: dict[str, str] = {}  # task path -> URL (the few paths a task file names)

    @property
    def up(self) -> bool:
        return not self.out and not self.breaker.open

    def limit(self, cap: int) -> int:
        """Requests this endpoint may have on the wire from this worker, under the worker's cap."""
        return cap if self.adaptive is None else self.adaptive.allowed(cap)

    # ------------------------------------------------------------------ what happened to it (the only writers)

    def sent(self) -> None:
        """A request went out to it."""
        self.on_wire += 1

    def answered(self) -> None:
        """A request sent to it came back (answered, failed or cancelled)."""
        self.on_wire -= 1

    def succeeded(self, sent_at: float, last: tuple[str, str] | None) -> None:
        """A request sent at ``sent_at`` for ``last`` (path, model) was answered: evidence it serves, and that
        refusals of the key received before it was sent were those tasks' own."""
        self.breaker.success(time.monotonic() - sent_at)
        self.auth.success(sent_at)
        if last is not None:
            self.last_ok = last

    def failed(self, key: int, f: Failure) -> bool:
        """Task ``key``'s attempt failed with ``f``: evidence for its breaker. True when this worker trips it now
        (ejected here at once, parked requests wait for the close; the caller tells the supervisor)."""
        if self.breaker.record(key, f.endpoint_side, f.refused):
            self.eject()
            return True
        return False

    def settle(self, now: float) -> bool:
        """A task that failed waited, at ``now``, for its breaker's verdict (``LocalBreaker.undecided``): True when
        the run of failures, unbroken meanwhile, trips this worker now (ejected here; the caller tells the
        supervisor)."""
        if self.breaker.overdue(now):
            self.eject()
            return True
        return False

    def eject(self) -> None:
        """This worker takes it for down (a trip, or a key check unanswered): no request goes to it meanwhile."""
        self.breaker.set_open(True)

    def set_open(self, is_open: bool, was_down: bool = False, out: bool = False) -> None:
        """The supervisor's BREAKER_OPEN / BREAKER_CLOSE (``out``: left out for good): the requests it refused go
        to the others (left out), or elsewhere or to park (ejected)."""
        self.out = self.out or out
        if out:
            self.auth.release()  # requests it refused go to the others
        elif is_open:
            self.auth.move_on()  # ejected: they go to the others (or park until one is up)
        self.breaker.set_open(is_open, was_down)

    def cool(self, until: float) -> None:
        """It asked for a wait (429, Retry-After) running until ``until``: others first, meanwhile (``pick``)."""
        if until > self.cool_until:
            self.cool_until = until

    def key_refused(self, key: int, at: float, message: str) -> bool:
        """Task ``key``'s request was refused (401/403), the answer received at ``at``; True when a key check is
        to start now (it is then under way until ``key_check_ended``)."""
        if self.auth.refuse(key, at, message):
            self.auth.checking = True
            return True
        return False

    def key_taken(self, sent_at: float) -> None:
        """The key check sent at ``sent_at`` was answered past the key: earlier refusals were their tasks' own."""
        self.auth.success(sent_at)

    def key_lost(self) -> bool:
        """The key check was refused too: True the first time (tell the supervisor, once)."""
        return self.auth.check_refused()

    def key_check_ended(self) -> None:
        self.auth.checking = False

    def observe(self, now: float, server_s: float, status: int | None, code: str | None, inflight: int,
                cap: int, first_s: float | None = None) -> None:
        """An attempt sent here ended at ``now`` after ``server_s`` at the server (a stream's first token after
        ``first_s``), with ``inflight`` requests in flight: evidence for its adaptive limit, if it has one
        (``cap``: the supervisor's LIMIT)."""
        if self.adaptive is not None:
            self.adaptive.observe(now, server_s, status, code, inflight, cap, first_s)

    def why(self, now: float) -> tuple[str, int] | None:
        """Why its adaptive limit is low, and a --concurrency that did better (``AdaptiveLimit.reason``)."""
        return None if self.adaptive is None else self.adaptive.reason(now)

    def server_queue(self, now: float, waiting: float, running: float) -> None:
        """A scrape of its server's metrics (``server_signals``): evidence for its adaptive limit."""
        if self.adaptive is not None:
            self.adaptive.server(now, waiting, running)

    def set_rate(self, limits: Sequence[float | None] | None, arrivals: str, rng: random.Random) -> None:
        """Its share of its own rate limits ([requests/s, tokens/min]; None or none set: no pacer of its own).
        A pacer made now draws its random stream (Poisson arrivals) from ``rng``, the worker's."""
        if not limits or not any(limits):
            self.pacer = None
            return
        if self.pacer is None:
            self.pacer = Pacer(random.Random(rng.getrandbits(64)))
        self.pacer.set(limits[0], limits[1], arrivals)

    async def pace(self, estimate: int) -> None:
        """Wait on its own pacer (it has one), counted meanwhile as its load (``pending``)."""
        assert self.pacer is not None
        self.pending += 1
        try:
            await self.pacer.pace(estimate)
        finally:
            self.pending -= 1

    def correct_usage(self, pacer: Pacer, used: int, estimate: int) -> None:
        """The tokens an answer from it really used (``usage.total_tokens``): correct the estimate charged to
        both the global budget (``pacer``) and its own."""
        pacer.correct_tokens(used - estimate)
        if self.pacer is not None:
            self.pacer.correct_tokens(used - estimate)

    # ------------------------------------------------------------------ reading

    def url(self, path: str) -> str:
        url = self._urls.get(path)
        if url is None:
            url = join_url(self.address, path)
            if len(self._urls) < 64:  # bounded, whatever paths a task file names
                self._urls[path] = url
        return url


class EndpointPool:
    def __init__(self, urls: Sequence[str], adaptive: Callable[[], AdaptiveLimit | None] = lambda: None,
                 headers: Callable[[str], Mapping[str, str]] | None = None) -> None:
        """``headers``: every header of a request to the endpoint at a URL (``tasks.headers.request_headers``)."""
        if not urls:
            raise ValueError("no endpoint")
        self.all = [Endpoint(i, u, adaptive(), headers(u) if headers else None) for i, u in enumerate(urls)]
        self._back: asyncio.Future[bool] | None = None  # resolved when an endpoint rejoins (parked requests)
        self._handing_back = False  # the worker drains: a request that would park is handed back instead
        self.paced = False  # some endpoint has a pacer of its own (apply_rate)

    def __len__(self) -> int:
        return len(self.all)

    def any_up(self) -> bool:
        return any(ep.up for ep in self.all)

    def limit(self, cap: int) -> int:
        """Requests this worker may have in flight: the endpoints' limits together, under its cap."""
        eps = [ep for ep in self.all if ep.up] or [ep for ep in self.all if not ep.out] or self.all
        return max(1, min(cap, sum(ep.limit(cap) for ep in eps)))

    def observer(self, inflight: Callable[[], int], cap: Callable[[], int]
                 ) -> Callable[[Endpoint, int | None, str | None, float, float | None], None]:
        """What the client is to call with every attempt (``Client.observe``) when the concurrency adapts: the
        attempt's endpoint, status, error code, seconds at the server (and to a stream's first token) feed that
        endpoint's limit (``cap()``, the supervisor's LIMIT). In flight: with one endpoint, the requests this
        worker has begun (``inflight()``); with several, those on the wire to that endpoint."""
        one = len(self.all) == 1

        def observe(ep: Endpoint, status: int | None, code: str | None, server_s: float,
                    first_s: float | None) -> None:
            ep.observe(time.monotonic(), server_s, status, code, inflight() if one else ep.on_wire + 1, cap(),
                       first_s)

        return observe

    def why(self, cap: int) -> list[Any] | None:
        """For the heartbeat (``why``): [the reason the lowest adaptive limit is low, the --concurrency that did
        better by this worker's measurements or 0], or None when no limit is low (``AdaptiveLimit.reason``)."""
        now = time.monotonic()
        low = [(ep.limit(cap), w) for ep in self.all if ep.up and (w := ep.why(now)) is not None]
        if not low:
            return None
        text = min(low, key=lambda x: x[0])[1][0]
        return [text, sum(b for _, (_, b) in low) if all(b for _, (_, b) in low) else 0]

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
        ep.set_open(is_open, was_down, out)
        if ep.up and self._back is not None:
            back, self._back = self._back, None
            if not back.done():
                back.set_result(was_down)

    def run_ended(self, index: int, epoch: int) -> bool | None:
        """How endpoint ``index``'s run of failures ``epoch`` ended (``LocalBreaker.ended``): True in a close
        after an outage, False otherwise, None not yet."""
        return self.all[index].breaker.ended(epoch)

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

    # ------------------------------------------------------------------ rate limits of their own

    def apply_rate(self, pacer: Pacer, frame: Mapping[str, Any]) -> None:
        """A RATE frame: set the global pacer and every endpoint's own (made on first use, dropped without one)."""
        arrivals = str(frame.get("arrivals", "uniform"))
        pacer.set(frame.get("rps"), frame.get("tpm"), arrivals)
        eps = frame.get("eps") or {}
        for ep in self.all:
            ep.set_rate(eps.get(str(ep.index)), arrivals, pacer.rng)
        self.paced = any(ep.pacer is not None for ep in self.all)

    def counts_tokens(self, pacer: Pacer) -> bool:
        """Whether a request's tokens are to be estimated: some pacer has a tokens-per-minute limit."""
        return pacer.tpm is not None or (self.paced and any(ep.pacer is not None and ep.pacer.tpm is not None
                                                            for ep in self.all))

    async def pick_paced(self, cap: int, estimate: int, avoid: Endpoint | None = None,
                         now: float = math.inf) -> Endpoint | None:
        """The endpoint for the next attempt (``pick``), once its own pacer lets the request go (None: every
        endpoint is ejected). An endpoint ejected while the request waited is not sent to: it picks again."""
        while True:
            ep = self.pick(cap, avoid, now)
            if ep is None or ep.pacer is None:
                return ep
            await ep.pace(estimate)
            if ep.up:
                return ep
