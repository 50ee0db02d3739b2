"""One /v1 request as it goes through the wrapper (counting, outage, auth) and its handler."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from evalsup.mock import content as C
from evalsup.mock.config import MockConfig
from evalsup.mock.faults import NO_OVERRIDE, Fault, FaultInjector, Override, parse_override
from evalsup.mock.judge import judge_reply
from evalsup.mock.state import (
    FLUSH_BYTES,
    ID_HEX,
    MAX_N,
    SIZING_CREATED,
    STATE,
    WRITE_BYTES,
    State,
    abort_transport,
    drain_transport,
    error,
    rate_limited,
    sse,
)


@dataclass
class Call:
    """One /v1 request as it goes through the wrapper and its handler."""

    request: web.Request
    state: State
    cfg: MockConfig
    aborted: bool = False
    nbytes: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    override: Override = NO_OVERRIDE
    fault: Fault = Fault.NONE
    stream_fail: int | None = None  # mock.in_stream: this 5xx status comes as an error event inside a 200 stream
    # the client went away while its request was held (``slow``): the answer is still generated and billed, as a
    # provider bills a request it began (a hedge's losing copy, a request timed out), then nothing is sent
    gone: bool = False

    @property
    def stream(self) -> bool:
        return self.body.get("stream") is True

    @property
    def include_usage(self) -> bool:
        opts = self.body.get("stream_options")
        return isinstance(opts, dict) and opts.get("include_usage") is True

    def abort(self, kind: str, *, rst: bool = True) -> web.Response:
        self.aborted = True
        self.state.stats.fault(kind)
        abort_transport(self.request, rst=rst)
        return web.Response(status=499)  # never sent: the transport is gone

    async def begin(self) -> web.Response | None:
        """Draw the fault, read the body, wait the latency, apply explicit overrides. A response ends the call."""
        state = self.state
        u = state.faults.draw()  # before any await, so draws follow arrival order
        try:
            body = orjson.loads(await self.request.read())
        except orjson.JSONDecodeError:
            return error(self.request, 400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return error(self.request, 400, "The request body must be a JSON object.")
        self.body = body
        try:
            ov = parse_override(body.get("mock"))
        except ValueError as exc:
            return error(self.request, 400, str(exc), param="mock")
        if ov.times is not None and ov.has_fault and state.attempts.attempt(C.request_key(body)) > ov.times:
            ov = ov.without_faults()
        if ov.invalid_first is not None and C.assistant_turns(body) < ov.invalid_first:
            ov = dataclasses.replace(ov, text=C.INVALID_JSON)  # not yet asked again enough times: invalid JSON
        self.override = ov
        if self.cfg.fast_refusals and not ov.has_fault:  # a gateway's refusal: before the server's latency
            fault = FaultInjector.fault_for(self.cfg, u)
            if fault in (Fault.ERROR_429, Fault.ERROR_500):
                self.fault = fault
                return self.random_fault()
        slow = state.faults.slow_s(self.cfg) if ov.delay_s is None else None  # (an explicit delay_s wins)
        if slow is not None:  # one of the slow share: answered late, or generated unread if the client goes first
            self.state.stats.fault("slow")
            end = asyncio.get_running_loop().time() + slow
            while asyncio.get_running_loop().time() < end:
                if self.request.transport is None or self.request.transport.is_closing():
                    self.gone = True  # generated all the same (and billed), never sent: see gone_response
                    break
                await asyncio.sleep(min(0.05, end - asyncio.get_running_loop().time()))
            if self.gone and (ov.hang or ov.reset or (ov.status is not None and not 200 <= ov.status < 300)):
                return self.gone_response()  # it would have failed: nothing generated, nothing billed
        delay = ov.delay_s if ov.delay_s is not None else 0.0 if slow is not None else state.faults.latency_s(self.cfg)
        if delay > 0:
            await asyncio.sleep(delay)
            if state.down:  # an outage that started while this request waited
                return self.abort("down")
        if ov.hang:  # a stalled slot: nothing is sent until the client gives up on the request
            self.state.stats.fault("hang")
            while not (self.request.transport is None or self.request.transport.is_closing()):
                await asyncio.sleep(0.1)
            self.aborted = True
            abort_transport(self.request, rst=True)
            return web.Response(status=499)  # never sent: the client is gone
        if ov.reset:
            return self.abort("reset")
        if ov.status is not None and not 200 <= ov.status < 300:
            self.state.stats.fault(f"mock_{ov.status}")
            if ov.in_stream and self.stream and ov.status >= 500:
                self.stream_fail = ov.status
                return None
            if ov.status == 429:
                return rate_limited(self.request, self._retry_after())
            return error(self.request, ov.status)
        if ov.malformed:
            self.fault = Fault.MALFORMED
        elif not ov.cut_stream:
            self.fault = FaultInjector.fault_for(self.cfg, u)
            if self.fault is Fault.CUT_STREAM:  # the answer is cut as a "cut_stream" override cuts it
                self.fault = Fault.NONE
                self.override = dataclasses.replace(ov, cut_stream=True)
        return None

    def _retry_after(self) -> float:
        ra = self.override.retry_after
        return ra if ra is not None else self.cfg.retry_after_s

    def random_fault(self) -> web.Response | None:
        """Reset / 500 / 429 from the random draw (malformed is applied when the body is built)."""
        if self.fault is Fault.RESET:
            return self.abort("reset")
        if self.fault is Fault.ERROR_500:
            self.state.stats.fault("500")
            return error(self.request, 500)
        if self.fault is Fault.ERROR_429:
            self.state.stats.fault("429")
            return rate_limited(self.request, self._retry_after())
        return None

    async def open(self) -> tuple[str, web.Response | None]:
        """``begin`` then ``check_model``: the request's model, or the response that ends the call here."""
        early = await self.begin()
        if early is not None:
            return "", early
        return self.check_model()

    def check_model(self) -> tuple[str, web.Response | None]:
        # Azure OpenAI's deployment path names the model (the body's, if any, is not read there)
        model = self.request.match_info.get("deployment") or self.body.get("model")
        if not isinstance(model, str) or not model:
            return "", error(self.request, 400, "you must provide a model parameter", param="model")
        if self.cfg.models and model not in self.cfg.models:
            msg = f"The model `{model}` does not exist or you do not have access to it."
            return model, error(self.request, 404, msg, code="model_not_found", param="model")
        return model + (self.cfg.snapshot or ""), None  # (the name answers give, and the bill counts by)

    def choices_n(self) -> tuple[int, web.Response | None]:
        n = self.body.get("n", 1)
        if n is None:
            n = 1
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            return 1, error(self.request, 400, f"n must be an integer between 1 and {MAX_N}", param="n")
        return n, None

    def answers(self, key: bytes, count: int, max_tokens: Any) -> list[C.Answer]:
        """One answer per choice, before padding."""
        if self.override.text is not None:
            return [C.Answer(self.override.text)] * count
        if self.cfg.judge:  # the mock as a judge: a grade by the rule of evalsup.mock.judge
            reply = judge_reply(self.body)
            if reply is not None:
                return [C.Answer(reply)] * count
        out = []
        limited = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
        for i in range(count):
            text = C.natural_text(key, i)
            if limited and C.approx_tokens(text) > max_tokens:
                out.append(C.Answer(C.truncate_to_tokens(text, max_tokens), "length"))
            else:
                out.append(C.Answer(text))
        return out

    @property
    def tier(self) -> str | None:
        """The service tier the request asks for (echoed in its answer, as OpenAI does), or None."""
        tier = self.body.get("service_tier")
        return tier if isinstance(tier, str) and tier else None

    def cached_of(self, prompt_tokens: int) -> int:
        """The prompt tokens an answer reports read from the provider's cache (MockConfig.cached)."""
        return int(prompt_tokens * self.cfg.cached)

    def written_of(self, prompt_tokens: int) -> int:
        """The prompt tokens an answer reports written to the provider's cache (MockConfig.written), beside those
        it read from it (never more than the prompt)."""
        return min(int(prompt_tokens * self.cfg.written), prompt_tokens - self.cached_of(prompt_tokens))

    def gone_response(self) -> web.Response | None:
        """When the client went away while its request was held (``gone``): the connection dropped and nothing
        sent, once the answer was generated and billed; else None (answer it)."""
        if not self.gone:
            return None
        self.aborted = True
        abort_transport(self.request, rst=True)
        return web.Response(status=499)  # never sent: the client is gone

    def bill(self, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        """This answer is generated: the provider's bill counts it (``MockStats.bill``), whether or not the client
        is still there to read it (a request's answer is billed once generated: a client that went while it was
        held, ``gone``, is billed all the same)."""
        key = None
        if self.cfg.bill:
            first = (self.body.get("messages") or [{}])[0] if "messages" in self.body else {"content": self.body.get(
                "prompt")}
            key = str(first.get("content") if isinstance(first, dict) else first)[:500]
        self.state.stats.bill(model, prompt_tokens, completion_tokens, key)

    def pad(self, answers: list[C.Answer], build: Callable[[str, int, list[C.Answer]], bytes]) -> list[C.Answer]:
        """Pad each answer so that the non-streamed JSON body is about response_kb (or mock.kb) KB.

        The size is computed on a placeholder envelope of fixed length, so streamed and non-streamed
        requests get exactly the same text. mock.text answers are never padded.
        """
        kb = self.override.kb if self.override.kb is not None else self.cfg.response_kb
        if kb <= 0 or self.override.text is not None or not answers:
            return answers
        target = min(int(kb * 1024), C.MAX_PAD_CHARS)
        sizing = build("x" * (ID_HEX + 10), SIZING_CREATED, answers)
        per_choice = (target - len(sizing)) // len(answers)
        # padding grows completion_tokens (and its digits); count them in so the size lands close
        digits = len(str(target // 4 + 1)) - len(str(sum(a.tokens for a in answers)))
        per_choice -= 2 * digits // len(answers)
        return [C.Answer(a.text, a.finish, max(0, per_choice)) for a in answers]

    async def send_body(self, body: bytes) -> web.StreamResponse:
        """A whole JSON body, with this call's faults: half of it when malformed, the connection cut mid-body
        with cut_stream."""
        if self.fault is Fault.MALFORMED:
            self.state.stats.fault("malformed")
            body = body[: max(1, len(body) // 2)]
        elif self.override.cut_stream:
            return await self.send_parts([body], cut=True)
        return web.Response(body=body, content_type="application/json")

    async def send_parts(self, parts: list[bytes | memoryview], *, cut: bool = False) -> web.StreamResponse:
        """A JSON body sent piece by piece from views: no joined copy, and the writes wait for the client
        (aiohttp drains past 64 KiB), so a slow reader holds little server memory. With cut, send half of
        the body (Content-Length announces all of it) and drop the connection."""
        total = sum(len(p) for p in parts)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.content_length = total
        await resp.prepare(self.request)
        budget = total // 2 if cut else total
        for part in parts:
            view = memoryview(part)[:budget]
            budget -= len(view)
            for i in range(0, len(view), WRITE_BYTES):
                await resp.write(view[i : i + WRITE_BYTES])
                self.nbytes += len(view[i : i + WRITE_BYTES])
        if cut:
            await drain_transport(self.request)
            self.abort("cut_stream", rst=False)
        else:
            await resp.write_eof()
        return resp

    async def send_stream(self, events: Iterator[bytes], cut_after: int | None = None,
                          fail_event: bytes | None = None) -> web.StreamResponse:
        """Send SSE events; with cut_after, send that many and then drop the connection. With stream_fail set,
        send two events, then fail_event (by default a chat-style {"error": {...}} event), and end there."""
        if self.stream_fail is not None:
            if fail_event is None:
                msg = f"The server had an error while streaming (mock {self.stream_fail})."
                fail_event = sse({"error": {"message": msg, "type": "server_error", "param": None,
                                            "code": "server_error"}})
            events = _fail_after(events, 2, fail_event)
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"},
        )
        await resp.prepare(self.request)
        buf: list[bytes] = []
        size = 0
        for i, ev in enumerate(events):
            if cut_after is not None and i >= cut_after:
                break
            buf.append(ev)
            size += len(ev)
            if size >= FLUSH_BYTES:
                data = b"".join(buf)
                self.nbytes += len(data)
                await resp.write(data)
                buf.clear()
                size = 0
        if buf:
            data = b"".join(buf)
            self.nbytes += len(data)
            await resp.write(data)
        if cut_after is not None:
            await drain_transport(self.request)
            self.abort("cut_stream", rst=False)
        return resp


def _fail_after(events: Iterator[bytes], n: int, last: bytes) -> Iterator[bytes]:
    for i, ev in enumerate(events):
        if i >= n:
            break
        yield ev
    yield last


# ---------------------------------------------------------------------------------------------- /v1 wrapper


def _refused(request: web.Request, cfg: MockConfig) -> web.Response | None:
    """A request the endpoint's gateway turns away: a required query parameter missing (404, as Azure OpenAI
    answers without its api-version), no basic auth or the wrong one, no key or the wrong one (401)."""
    if cfg.require_query:
        want = urllib.parse.parse_qsl(cfg.require_query, keep_blank_values=True)
        if any(request.query.get(k) != v for k, v in want):
            return error(request, 404, "Resource not found (a required query parameter is missing or wrong).")
    auth = request.headers.get("Authorization")
    if cfg.basic_auth is not None:
        token = base64.b64encode(cfg.basic_auth.encode()).decode("ascii")
        if auth != f"Basic {token}":
            return error(request, 401, "Basic authentication required." if auth is None
                         else "Incorrect user or password.")
    key = cfg.api_key
    if key is None:
        return None
    got = request.headers.get(cfg.api_key_header) if cfg.api_key_header else auth
    want_key = key if cfg.api_key_header else f"Bearer {key}"
    if got != want_key:
        return error(request, 401, "You didn't provide an API key." if got is None else "Incorrect API key provided.")
    return None


V1Handler = Callable[[Call], Awaitable[web.StreamResponse]]


def v1(inner: V1Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Counting, outage, auth and in-flight tracking around a /v1 handler."""

    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        stats = state.stats
        auth = request.headers.get("Authorization")
        stats.arrival(request.path, auth is not None)
        call = Call(request=request, state=state, cfg=state.cfg)
        if state.down:
            return call.abort("down")
        stats.enter()
        try:
            refused = _refused(request, call.cfg)
            if refused is not None:
                resp: web.StreamResponse = refused
            elif state.key_revoked():
                resp = error(request, 401, "Incorrect API key provided: the key was revoked (mock).",
                             code="invalid_api_key")
            else:  # within the capacity (evalsup.mock.capacity); a full queue answers 429 at once
                resp = await state.capacity.serve(call.cfg.capacity, call.cfg.queue, request.method,
                                                  lambda: inner(call),
                                                  lambda: rate_limited(request, call.cfg.retry_after_s))
        except ConnectionError:  # the client went away mid-response: nothing to answer, nothing to log
            call.aborted = True
            stats.fault("client_gone")
            return web.Response(status=499)
        finally:
            stats.leave()
        if not call.aborted or call.nbytes:
            if isinstance(resp, web.Response) and isinstance(resp.body, bytes):
                call.nbytes += len(resp.body)
            stats.status(resp.status, call.nbytes)
        return resp

    return handler
