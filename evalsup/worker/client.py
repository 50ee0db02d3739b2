"""One task's trip to the endpoint and back: pacing, attempts, retries, timeouts, streaming, the breaker."""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from evalsup.tasks.routes import answer_key, asks_stream_usage
from evalsup.worker import errors
from evalsup.worker.bodies import BodyParser, UsageOnly, one_line
from evalsup.worker.endpoints import Endpoint, EndpointPool
from evalsup.worker.errors import Code, Failure, FailureKind, LocalError
from evalsup.worker.pacing import Pacer
from evalsup.worker.probes import key_check, probe_request, send_probe
from evalsup.worker.retry import AttemptState, Decision, RetryPolicy, Verdict, parse_retry_after
from evalsup.worker.server_errors import request_id_of, text_body
from evalsup.worker.sse import StreamAssembler, StreamCut, StreamFailed


class ResponseTooLarge(Exception):
    pass


@dataclass(slots=True)
class Outcome:
    """What came back for one task after all its attempts."""

    status: int | None  # last HTTP status; None when no attempt got an answer
    body: Any  # parsed or orjson.Fragment body of the last answer, or None
    raw_len: int  # bytes of the last response body
    request_id: str | None
    error: dict[str, str] | None  # None on success
    attempts: int
    latency_s: float  # from the first attempt's start to the end of the last
    parsed: Any = None  # the parsed body, or only its usage when nothing reads more (worker.bodies)
    ttft_s: float | None = None
    itl_s: float | None = None
    raw_json: bytes | None = None  # the endpoint's own bytes when ``body`` is them (a Fragment)
    sent: int = 1  # requests sent: attempts, and the ones no attempt was counted for (429 waits, outages)
    server_s: float = 0.0  # the last attempt, from the request written to the last byte (issue 21)
    queue_s: float = 0.0  # waits for the pacers (--max-requests-per-s, --max-tokens-per-min; global, endpoint's)
    endpoint: int = 0  # the endpoint of the last attempt (its index in WorkerConfig.endpoints)
    stalled: int = 0  # attempts abandoned on the supervisor's STALL (timeout_stall)


@dataclass(slots=True, eq=False)
class OnWire:
    """One attempt on the wire (issue 28): what the heartbeat names when it is among the oldest, and what STALL
    abandons (``Client.abandon``). Lives exactly as long as the attempt: nothing is kept per task beyond it."""

    key: int  # the task's key
    endpoint: int  # its index in WorkerConfig.endpoints
    sent: float  # monotonic: when the request went out
    attempt: int  # the task's attempt this is (counted against --max-attempts)
    got: int = 0  # bytes of the answer received so far
    hedge: bool = False  # an attempt of a hedge's second copy (--hedge, worker.race): status marks it
    task: asyncio.Task[Any] | None = None  # the task's coroutine, which STALL cancels where the attempt waits
    cut: bool = False  # STALL cut it (``Client.abandon``): the cancellation is the stall's, not a stop's

    def row(self, now: float) -> list[float]:
        """The heartbeat's row (ipc.messages.Heartbeat ``old``)."""
        return [self.key, self.endpoint, round(now - self.sent, 1), self.attempt, self.got, int(self.hedge)]


@dataclass(slots=True)
class Attempt:
    status: int | None
    raw: bytes
    parsed: Any
    request_id: str | None
    failure: Failure | None  # None on success
    ttft_s: float | None = None
    itl_s: float | None = None
    one_line: bool | None = None  # whether raw has no line break, when already known


def body_value(raw: bytes, parsed: Any, single: bool | None = None) -> Any:
    """The endpoint's own bytes go into the output line unchanged when they are one line of JSON
    (``single``: whether they are, if known)."""
    if raw and (one_line(raw) if single is None else single):
        return orjson.Fragment(raw)
    return parsed


def estimate_tokens(body: dict[str, Any]) -> int:
    """A rough request cost for --max-tokens-per-min: prompt characters / 4 plus the completion budget."""
    chars = 0
    for m in body.get("messages") or ():
        c = m.get("content") if isinstance(m, dict) else None
        chars += len(c) if isinstance(c, str) else len(orjson.dumps(c))
    p = body.get("prompt") or body.get("input")
    if isinstance(p, str):
        chars += len(p)
    max_out = body.get("max_tokens") or body.get("max_completion_tokens") or 256
    return chars // 4 + 1 + (int(max_out) if isinstance(max_out, int | float) else 256)


class Client:
    def __init__(self, session: aiohttp.ClientSession, endpoints: EndpointPool, policy: RetryPolicy,
                 max_response_bytes: int, seed: int,
                 pacer: Pacer, on_trip: Callable[[int, str], None], on_probe: Callable[[int, bool, str], None],
                 secret: str | None = None, whole_bodies: bool = True,
                 on_auth: Callable[[int, str], None] | None = None,
                 cap: Callable[[], int] = lambda: 1, on_local: Callable[[str], None] | None = None) -> None:
        self.session = session
        # each attempt goes to endpoints.pick (worker.endpoints), with that endpoint's headers (its auth)
        self.endpoints = endpoints
        self.cap = cap  # the supervisor's cap on this worker's requests in flight (LIMIT)
        self.policy = policy
        self.max_response_bytes = max_response_bytes
        self.rng = random.Random(seed)
        self.pacer = pacer
        self.on_trip = on_trip
        self.on_probe = on_probe
        self.on_auth = on_auth or (lambda e, message: None)
        self.on_local = on_local or (lambda message: None)  # a request could not be sent at all: FATAL
        self._local: asyncio.Event | None = None  # set once told (the run stops; the tasks wait meanwhile)
        self._checks: set[asyncio.Task[None]] = set()  # key checks under way (AuthWatch)
        self.secret = secret.encode() if secret else None
        self.secrets = [self.secret] if self.secret else []  # and --header values (worker.main)
        self.scrub: Callable[[bytes], bytes] | None = None
        # whole_bodies: something (a scorer, a plugin) reads the parsed body; else a large one only needs checking
        self.bodies = BodyParser(whole_bodies)
        self.parked = 0
        self.retries = 0
        self.on_wire = 0  # requests sent and not yet answered: what the endpoint counts (heartbeat "wire")
        self.wire: set[OnWire] = set()  # those requests, each its attempt's (heartbeat "old", STALL)
        # tasks waiting out a retry's back-off (a 5xx, a reset), or a 429's Retry-After once the limit has found
        # refusals that the load does not explain (AdaptiveLimit.background_refusals): with an adaptive limit
        # they hold no slot, as they load no server (schedule.Schedule.active). A 429 that is load keeps its
        # slot while it waits, as the server asked for less; one that is not must not cost a slot a second
        # (issue 41: at limit 1, llmock's random 429s held the run to a task a second)
        self.resting = 0
        self.on_rest: Callable[[], None] = lambda: None  # a task began to rest: its slot may take another
        self.flow_resting = 0  # of them, those waiting out a 429's Retry-After
        # when its rest ends, a place under the limit to wait for (schedule.Schedule.back; with an adaptive limit)
        self.wait_slot: Callable[[], Awaitable[None]] | None = None
        self._last: tuple[str, str] | None = None  # (path, model) of the last task: what a probe asks
        # told of every attempt (endpoint, status, error code, seconds at the server, to a stream's first token):
        # the adaptive limit (EndpointPool.observer, when the concurrency adapts)
        self.observe: Callable[[Endpoint, int | None, str | None, float, float | None], None] | None = None

    def _scrub(self, raw: bytes) -> bytes:
        # An endpoint may echo request headers in an error; the key must never reach a file.
        if self.scrub is not None:  # the run's one list (tasks.secrets), set by worker.main and worker.judge
            return self.scrub(raw)
        for s in self.secrets:
            if s in raw:
                raw = raw.replace(s, b"[redacted]")
        return raw

    def oldest(self, now: float, k: int) -> list[list[float]]:
        """The ``k`` requests longest on the wire, oldest first, as the heartbeat's rows."""
        return [w.row(now) for w in heapq.nsmallest(k, self.wire, key=lambda w: w.sent)]

    def abandon(self, age_s: float, now: float) -> int:
        """STALL: every attempt on the wire for at least ``age_s`` seconds is cut where it waits (its task is
        cancelled, once, marked as cut); ``execute`` turns the cut into a ``timeout_stall`` failure and the retry
        policy decides as for any timeout. aiohttp closes the request's connection as the cancellation passes,
        so no late answer can come back to it. How many were cut. (An entry is in ``wire`` only while its task
        waits inside the attempt: the cancellation always lands there.)"""
        n = 0
        for w in self.wire:
            if not w.cut and now - w.sent >= age_s and w.task is not None:
                w.cut = True
                w.task.cancel("stalled (--stall-after)")
                n += 1
        return n

    async def _each_chunk(self, resp: aiohttp.ClientResponse, take: Callable[[bytes], object],
                          wire: OnWire | None = None) -> None:
        """Hand the body to ``take`` chunk by chunk as aiohttp's parser hands it over (`readchunk`), without
        joining, raising ResponseTooLarge past --max-response-mb. A plain loop rather than an async generator:
        each of those costs the loop's registry of async generators an entry per response (~5 us a request at
        4 KB, docs/benchmarks.md sixth round)."""
        content = resp.content
        cap = self.max_response_bytes
        n = 0
        while True:
            chunk, _ = await content.readchunk()
            if chunk:
                n += len(chunk)
                if n > cap:
                    raise ResponseTooLarge(n)
                if wire is not None:
                    wire.got = n
                take(chunk)
            elif content.at_eof():
                return

    async def _read(self, resp: aiohttp.ClientResponse, wire: OnWire | None = None) -> bytes:
        length = resp.content_length
        if length is not None and length > self.max_response_bytes:
            raise ResponseTooLarge(length)
        chunks: list[bytes] = []
        await self._each_chunk(resp, chunks.append, wire)
        # One join, the only copy of the body this side of aiohttp's parser: aiohttp's read() and iter_any() join
        # whatever chunks are buffered at each wake-up, then join those blocks again (a 1 MB body copied twice).
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _read_stream(self, resp: aiohttp.ClientResponse, start: float,
                           wire: OnWire | None = None) -> tuple[bytes, Any, StreamAssembler]:
        asm = StreamAssembler(start)
        await self._each_chunk(resp, asm.feed, wire)
        body = asm.body()  # raises StreamCut when the stream stopped early
        raw = orjson.dumps(body)
        return raw, body, asm

    async def attempt(self, url: str, payload: bytes, stream: bool, need: str | None = None,
                      headers: Mapping[str, str] | None = None, wire: OnWire | None = None) -> Attempt:
        """One request; ``need``: the key a 200 body must have to be an answer (tasks.routes.answer_key);
        ``headers``: the endpoint's (``Endpoint.headers``); ``wire``: its entry on the wire (bytes counted)."""
        start = time.monotonic()
        status: int | None = None
        request_id: str | None = None
        retry_after: float | None = None
        try:
            async with self.session.post(url, data=payload, headers=headers) as resp:
                status = resp.status
                request_id = request_id_of(resp.headers)  # x-request-id or an equivalent, never ""
                if status != 200:
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                # a body is read by what it is: SSE is assembled even when no stream was asked for
                if status == 200 and resp.content_type == "text/event-stream":
                    raw, parsed, asm = await self._read_stream(resp, start, wire)
                    raw = self._scrub(raw)
                    return Attempt(200, raw, parsed, request_id, None, asm.ttft_s, asm.itl_s)
                raw = self._scrub(await self._read(resp, wire))
        except ResponseTooLarge as e:
            return Attempt(status, b"", None, request_id, errors.answer(
                Code.TOO_LARGE, f"response of {e.args[0]} bytes exceeds --max-response-mb", status))
        except StreamCut as e:
            return Attempt(None, b"", None, request_id, errors.transport(Code.STREAM_CUT, str(e)))
        except StreamFailed as e:  # an error event inside a 200 stream, with the server's code
            return Attempt(None, b"", None, request_id, errors.transport(
                Code.STREAM_ERROR, e.message, {"server_code": e.code} if e.code else None))
        except errors.CAUGHT as e:  # aiohttp's and asyncio's: one table (errors.EXCEPTIONS); local ones apart
            return Attempt(None, b"", None, request_id, errors.from_exception(e, stream, status is not None))
        single = one_line(raw) if status == 200 else None
        try:
            parsed = self.bodies.parse(raw, single, need) if single is not None else orjson.loads(raw)
        except orjson.JSONDecodeError:
            if status == 200:  # a 200 that is not JSON is a broken answer (truncated, proxy page): worth another
                return Attempt(None, raw, None, request_id, errors.answer(  # its body is not written: no response
                    Code.INVALID_JSON, "HTTP 200: response body is not valid JSON"))
            parsed = text_body(raw)  # a plain-text error body is kept as a JSON string, its text the message
            raw = orjson.dumps(parsed)
        if status == 200:
            if need is not None and not (parsed.has_answer if isinstance(parsed, UsageOnly)
                                         else isinstance(parsed, dict) and need in parsed):
                return Attempt(None, raw, None, request_id, errors.answer(
                    Code.INVALID_RESPONSE, f"HTTP 200 without {need!r}: not an answer for this endpoint"))
            return Attempt(200, raw, parsed, request_id, None, one_line=single)
        assert status is not None
        return Attempt(status, raw, parsed, request_id, errors.from_status(status, parsed, retry_after))

    async def execute(self, path: str, body: dict[str, Any], key: int = 0, avoid: Endpoint | None = None) -> Outcome:
        """All the attempts of task ``key``: each failure's verdict comes from the retry policy
        (``retry.RetryPolicy.decide``, on the task's ``AttemptState``); this loop only carries it out.
        ``avoid``: the first pick avoids that endpoint while another is up (a hedge's copy, worker.race)."""
        stream = bool(body.get("stream"))
        if stream and asks_stream_usage(path):
            opts = body.get("stream_options")
            if not isinstance(opts, dict) or "include_usage" not in opts:
                body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        payload = orjson.dumps(body)
        need = answer_key(path)
        model = body.get("model")
        last = (path, model) if isinstance(model, str) else None
        if last is not None:
            self._last = last
        pool, pacer, policy = self.endpoints, self.pacer, self.policy
        estimate = estimate_tokens(body) if pool.counts_tokens(pacer) else 0
        st = AttemptState(time.monotonic(), avoid=avoid)
        copy = avoid is not None  # a hedge's second copy (only it avoids an endpoint)
        while True:
            if st.suspects:  # (as below: an outage's close may have come while it rested or parked)
                st.outage_refund(pool.run_ended)
            t_q = time.monotonic()
            if pacer.rps is not None or pacer.tpm is not None:  # (no coroutine without a limit)
                await pacer.pace(estimate)
            # per attempt: a retry may go elsewhere (issue 21 item 1); then that endpoint's own rate limit, if any
            now = time.monotonic()
            ep = (await pool.pick_paced(self.cap(), estimate, st.avoid, now) if pool.paced
                  else pool.pick(self.cap(), st.avoid, now))
            if ep is None:  # every endpoint was ejected while this task waited: park until one rejoins
                st.avoid = None
                await self._park()
                continue
            t_a = time.monotonic()  # the server's time, apart from the pacer's
            st.begin(t_a - t_q, ep.index)
            self.on_wire += 1
            ep.sent()
            wire = OnWire(key, ep.index, t_a, st.used, hedge=copy, task=asyncio.current_task())
            self.wire.add(wire)
            try:
                a = await self.attempt(ep.url(path), payload, stream, need, ep.headers, wire)
            except asyncio.CancelledError:
                # STALL's cut (Client.abandon) becomes the attempt's failure, unless the task is stopped as well
                # (then uncancel leaves a request standing and the stop goes on)
                if not wire.cut or wire.task is None or wire.task.uncancel() > 0:
                    raise
                a = Attempt(None, b"", None, None, errors.stalled(time.monotonic() - t_a))
                st.stalled += 1
            finally:
                self.on_wire -= 1
                ep.answered()
                self.wire.discard(wire)
            st.server_s = time.monotonic() - t_a
            f = a.failure
            # (a STALL's cut is evalsup's decision, not a measure of the server's time: the limit never sees it)
            if self.observe is not None and (f is None or f.code != Code.TIMEOUT_STALL):
                self.observe(ep, a.status, None if f is None else str(f.code), st.server_s, a.ttft_s)
            if f is None:
                ep.succeeded(t_a, last)
                if estimate and isinstance(a.parsed, dict):  # --max-tokens-per-min: global and the endpoint's
                    usage = a.parsed.get("usage")
                    if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
                        ep.correct_usage(pacer, usage["total_tokens"], estimate)
                return self._outcome(a, st)
            if f.kind is FailureKind.LOCAL:  # nothing was sent: never the endpoint's failure, nor the task's
                await self._stop_local(ep, f.message)
            epoch = ep.breaker.epoch  # the run of failures this one joins (an answer or a close ends it)
            if ep.failed(key, f):  # tripped here: now everywhere
                self.on_trip(ep.index, f.message)
            elif f.endpoint_side and (hold := ep.breaker.undecided(time.monotonic())) > 0:
                await self._verdict(ep, hold, f)
            if st.suspects:  # attempts of a run of failures that proved an outage meanwhile: given back
                st.outage_refund(pool.run_ended)
            d = policy.decide(f, st, self.rng, up=ep.up, elsewhere=pool.any_up(), endpoints=len(pool))
            v = d.verdict
            if v is Verdict.DONE:
                return self._outcome(a, st)
            if v is Verdict.GIVE_UP:
                return self._outcome(a, st, d.error)
            if v is Verdict.AUTH:
                if await self._key_verdict(ep, key, f):  # the refusal was the task's own: its record
                    return self._outcome(a, st)
                st.uncount()  # it goes elsewhere (its endpoint left out, or ejected): not counted
                self.retries += 1
                continue
            self.retries += 1
            if v is Verdict.RETRY:
                if f.endpoint_side:  # counted, unless its run of failures proves an outage (then given back)
                    st.suspect(ep.index, epoch)
                await self._rest(d.delay or 0.0)
            elif v is Verdict.WAIT:  # the server's flow control is not the task's failure
                st.uncount()
                await self._flow_wait(ep, d, st)
            elif v is Verdict.MOVE:  # its endpoint is ejected: to another at once, not counted
                st.moves += 1
                st.uncount()
            elif v is Verdict.PARK:
                if await self._park():
                    st.uncount()  # no task pays for an outage of the whole endpoint
                elif d.delay is None:  # a false alarm, and the failure was the task's own: its attempts are used
                    return self._outcome(a, st)
                else:
                    await self._rest(d.delay)

    async def _verdict(self, ep: Endpoint, seconds: float, f: Failure) -> None:
        """An attempt failed at ``ep`` while its breaker has seen enough tasks fail to trip, but not yet for as
        long as an answer takes (``LocalBreaker.undecided``: ``seconds`` more). The task waits that long
        rather than spend its next attempt at once on what may be an outage (a reset comes back at once, and a
        back-off may be a few ms: on a loaded machine a task counted two resets 37 ms into an outage, before its
        breaker could trip at 62 ms, and one used up --max-attempts 3); then the breaker trips if no answer came
        meanwhile (``Endpoint.settle``), and the attempt parks as at any trip."""
        await asyncio.sleep(seconds)
        if ep.up and ep.settle(time.monotonic()):
            self.on_trip(ep.index, f.message)

    async def _flow_wait(self, ep: Endpoint, d: Decision, st: AttemptState) -> None:
        """Sit out the wait ``ep`` asked for (``d.delay``), or, when ``d.hop``, only until another endpoint has
        room (the next pick then avoids ``ep``). ``ep`` cools meanwhile: new requests go to the others."""
        w = d.delay or 0.0
        t_w = time.monotonic()
        ep.cool(t_w + w)
        if d.hop:
            moved = await self._room_elsewhere_within(ep, w)
            st.waited(time.monotonic() - t_w, ep if moved else None)
            return
        st.waited(w)
        # refusals the load does not explain: the wait holds no place, for as many waits at once as the limit
        # (beyond that, refusals the limit took for background would let the worker begin task after task into
        # a server that is only full: several workers sharing one, issue 41)
        if ep.adaptive is not None and ep.adaptive.background_refusals and self.flow_resting < ep.limit(self.cap()):
            self.flow_resting += 1
            try:
                await self._rest(w)
            finally:
                self.flow_resting -= 1
        else:
            await asyncio.sleep(w)  # the server asked for less: the wait keeps its place, until the limit knows

    async def _key_verdict(self, ep: Endpoint, key: int, f: Failure) -> bool:
        """Task ``key``'s request was refused (401/403) at ``ep``: hold it until the key check (or a later
        success) says whether the refusal was its own (True) or it is to go elsewhere (False)."""
        if ep.key_refused(key, time.monotonic(), f.message):
            self._check_key(ep)
        self.parked += 1
        try:
            return await ep.auth.wait(key)
        finally:
            self.parked -= 1

    async def _stop_local(self, ep: Endpoint, message: str) -> None:
        """A request to ``ep`` could not be sent at all (``errors.local``): the settings' or evalsup's problem.
        The supervisor is told once (FATAL: it stops the run, exit 2) and the task waits, unanswered, until the
        worker is ended: it stays outstanding for the rerun, no attempt counted, nothing ejected."""
        if self._local is None:
            self._local = asyncio.Event()
            for s in self.secrets:  # (the message may quote a header or the URL)
                message = message.replace(s.decode(), "[redacted]")
            said = message.replace(ep.address, ep.public)
            self.on_local(f"a request to {ep.public} could not be sent ({said}): a setting is wrong, not the "
                          "endpoint; nothing was sent and no task was failed for it: fix it and rerun")
        self.parked += 1
        try:
            await self._local.wait()  # never set: the supervisor ends this worker
        finally:
            self.parked -= 1

    async def _rest(self, seconds: float) -> None:
        self.resting += 1
        self.on_rest()
        try:
            await asyncio.sleep(seconds)
            if self.wait_slot is not None:
                await self.wait_slot()
        finally:
            self.resting -= 1

    async def _park(self) -> bool:
        """Wait until an endpoint rejoins; True when it had been down (the attempt is then not counted)."""
        self.parked += 1
        try:
            return await self.endpoints.wait_up()
        finally:
            self.parked -= 1

    def _outcome(self, a: Attempt, st: AttemptState, error: dict[str, str] | None = None) -> Outcome:
        body = body_value(a.raw, a.parsed, a.one_line) if a.parsed is not None else None
        if error is None and a.failure is not None:
            error = a.failure.record()
        return Outcome(a.status, body, len(a.raw), a.request_id, error, st.used, time.monotonic() - st.start,
                       a.parsed, a.ttft_s, a.itl_s, a.raw if isinstance(body, orjson.Fragment) else None, st.sent,
                       st.server_s, st.queued, st.endpoint, st.stalled)

    async def _room_elsewhere_within(self, ep: Endpoint, seconds: float) -> bool:
        """Sit out a wait ``ep`` asked for (429), or only until another endpoint has room and asked for no wait
        itself: True then. Looked at at once, 20 ms later, then less and less often (every 0.5 s at most)."""
        end = time.monotonic() + seconds
        step = 0.02
        while (left := end - (now := time.monotonic())) > 0:
            if self.endpoints.room_elsewhere(ep, self.cap(), now):
                return True
            await asyncio.sleep(min(step, left))
            step = min(0.5, step * 1.5)
        return False

    def _check_key(self, ep: Endpoint) -> None:
        t = asyncio.create_task(self._key_check(ep))
        self._checks.add(t)
        t.add_done_callback(self._checks.discard)

    async def _key_check(self, ep: Endpoint) -> None:
        try:
            await key_check(self.session, ep, self._last, self.on_auth, self.on_trip)
        except LocalError as e:
            await self._stop_local(ep, str(e))

    async def probe(self, index: int = 0) -> None:
        """The breaker's probe (worker.probes). Any answer but a 5xx (a 400, a 429 included) says the endpoint
        as a whole serves."""
        ep = self.endpoints.all[index]
        try:
            status, detail = await send_probe(self.session, ep, probe_request(ep, ep.last_ok or self._last))
        except LocalError as e:
            await self._stop_local(ep, str(e))
            return
        ok = status is not None and status < 500
        self.on_probe(index, ok, detail)
