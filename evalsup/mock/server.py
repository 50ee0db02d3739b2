"""An OpenAI-compatible mock endpoint with fault injection, for tests and benchmarks.

Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, GET /v1/models[/{id}],
plus admin endpoints GET /_mock/stats, POST /_mock/reset, GET|POST /_mock/config.

Answers are a pure function of (seed, request content); faults come from a seeded RNG owned by the server
(one draw per generation request, in arrival order) or from the request's own "mock" object.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import orjson
from aiohttp import web

from evalsup.mock import content as C
from evalsup.mock.capacity import Capacity, prometheus_text  # issue 21
from evalsup.mock.config import MockConfig, apply_update, config_to_json
from evalsup.mock.faults import NO_OVERRIDE, AttemptCounter, Fault, FaultInjector, Override, parse_override
from evalsup.mock.stats import MockStats

__all__ = ["MockConfig", "MockServer", "MockStats", "MockThread", "create_app", "serve_forever", "start_mock"]

try:
    import uvloop

    _new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
    _new_loop = asyncio.new_event_loop

FINGERPRINT = "fp_evalsup_mock"
MODEL_CREATED = 1_700_000_000
MAX_N = 128
MAX_DIMS = 65_536
MAX_BODY = 1 << 30
SHUTDOWN_TIMEOUT_S = 0.5
_ID_HEX = 24  # hex characters after an id's prefix; fixed so that padding sizes are deterministic
_SIZING_CREATED = 1_000_000_000

_ERROR_KINDS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", None, "You are not allowed to sample from this model."),
    404: ("invalid_request_error", "not_found", "Not found."),
    408: ("timeout", None, "Request timed out."),
    409: ("invalid_request_error", "conflict", "Conflict."),
    413: ("invalid_request_error", None, "Request too large."),
    422: ("invalid_request_error", None, "Unprocessable request."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests (mock). Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
    504: ("server_error", None, "Gateway timeout."),
}


class _State:
    """Everything a running app shares: live config, outage flag, RNGs, counters."""

    def __init__(self, cfg: MockConfig) -> None:
        self.cfg = cfg
        self.down = False
        self.faults = FaultInjector(cfg.seed)
        self.stats = MockStats()
        self.attempts = AttemptCounter()
        self.capacity = Capacity()  # issue 21: K served at once, a FIFO of Q, then 429 (evalsup.mock.capacity)

    def update(self, updates: dict[str, Any]) -> None:
        """Apply a live config update (any MockConfig field, plus "down"). Raises ValueError, changes nothing."""
        updates = dict(updates)
        down = updates.pop("down", None)
        if down is not None and not isinstance(down, bool):
            raise ValueError("down must be a boolean")
        cfg = apply_update(self.cfg, updates)
        self.cfg = cfg
        if "seed" in updates:  # a seed in an update always restarts the fault sequence
            self.faults.reseed(cfg.seed)
        if down is not None:
            self.down = down
        self.capacity.resize(cfg.capacity)  # issue 21: a larger capacity admits waiters at once

    def reset(self) -> None:
        """Clear the counters and the attempt counts behind mock.times."""
        self.stats.reset()
        self.attempts.clear()

    def config_json(self) -> dict[str, Any]:
        out = config_to_json(self.cfg)
        if out["api_key"] is not None:
            out["api_key"] = "***"
        out["down"] = self.down
        return out


STATE: web.AppKey[_State] = web.AppKey("evalsup_mock_state", _State)


# ---------------------------------------------------------------------------------------------- helpers


def _new_id(prefix: str) -> str:
    return prefix + os.urandom(_ID_HEX // 2).hex()


def _fmt_seconds(s: float) -> str:
    return str(int(s)) if s == int(s) else f"{s:g}"


def _json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, headers=headers, content_type="application/json")


def _error(
    request: web.Request,
    status: int,
    message: str | None = None,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error in OpenAI's format: {"error": {"message", "type", "param", "code"}}."""
    kind, default_code, default_message = _ERROR_KINDS.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None, f"Mock error {status}.")
    )
    err: dict[str, Any] = {
        "message": message or default_message,
        "type": kind,
        "param": param,
        "code": code or default_code,
    }
    if request.app[STATE].cfg.echo_headers_in_errors:
        err["request_headers"] = {str(k): v for k, v in request.headers.items()}
    return _json_response({"error": err}, status=status, headers=headers)


def _rate_limited(request: web.Request, retry_after: float) -> web.Response:
    headers = {
        "Retry-After": _fmt_seconds(retry_after),
        "retry-after-ms": str(round(retry_after * 1000)),
        "x-ratelimit-remaining-requests": "0",
    }
    return _error(request, 429, headers=headers)


def _abort(request: web.Request, *, rst: bool) -> None:
    """Drop the connection without a response. rst=True makes the kernel send a TCP RST (ECONNRESET)."""
    transport = request.transport
    if transport is None:
        return
    if rst:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError, AttributeError, TypeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _drain_transport(request: web.Request, limit_s: float = 2.0) -> None:
    transport = request.transport
    deadline = time.monotonic() + limit_s
    while transport is not None and not transport.is_closing() and time.monotonic() < deadline:
        if transport.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.002)


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_SSE_DONE = b"data: [DONE]\n\n"
_FLUSH_BYTES = 1 << 16
_WRITE_BYTES = 1 << 18


# ---------------------------------------------------------------------------------------------- a request


@dataclass
class _Call:
    """One /v1 request as it goes through the wrapper and its handler."""

    request: web.Request
    state: _State
    cfg: MockConfig
    aborted: bool = False
    nbytes: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    override: Override = NO_OVERRIDE
    fault: Fault = Fault.NONE

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
        _abort(self.request, rst=rst)
        return web.Response(status=499)  # never sent: the transport is gone

    async def begin(self) -> web.Response | None:
        """Draw the fault, read the body, wait the latency, apply explicit overrides. A response ends the call."""
        state = self.state
        u = state.faults.draw()  # before any await, so draws follow arrival order
        try:
            body = orjson.loads(await self.request.read())
        except orjson.JSONDecodeError:
            return _error(self.request, 400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict):
            return _error(self.request, 400, "The request body must be a JSON object.")
        self.body = body
        try:
            ov = parse_override(body.get("mock"))
        except ValueError as exc:
            return _error(self.request, 400, str(exc), param="mock")
        if ov.times is not None and ov.has_fault and state.attempts.attempt(C.request_key(body)) > ov.times:
            ov = ov.without_faults()
        self.override = ov
        delay = ov.delay_s if ov.delay_s is not None else state.faults.latency_s(self.cfg)
        if delay > 0:
            await asyncio.sleep(delay)
            if state.down:  # an outage that started while this request waited
                return self.abort("down")
        if ov.reset:
            return self.abort("reset")
        if ov.status is not None and not 200 <= ov.status < 300:
            self.state.stats.fault(f"mock_{ov.status}")
            if ov.status == 429:
                return _rate_limited(self.request, self._retry_after())
            return _error(self.request, ov.status)
        if ov.malformed:
            self.fault = Fault.MALFORMED
        elif not ov.cut_stream:
            self.fault = FaultInjector.fault_for(self.cfg, u)
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
            return _error(self.request, 500)
        if self.fault is Fault.ERROR_429:
            self.state.stats.fault("429")
            return _rate_limited(self.request, self._retry_after())
        return None

    def check_model(self) -> tuple[str, web.Response | None]:
        model = self.body.get("model")
        if not isinstance(model, str) or not model:
            return "", _error(self.request, 400, "you must provide a model parameter", param="model")
        if self.cfg.models and model not in self.cfg.models:
            msg = f"The model `{model}` does not exist or you do not have access to it."
            return model, _error(self.request, 404, msg, code="model_not_found", param="model")
        return model, None

    def choices_n(self) -> tuple[int, web.Response | None]:
        n = self.body.get("n", 1)
        if n is None:
            n = 1
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            return 1, _error(self.request, 400, f"n must be an integer between 1 and {MAX_N}", param="n")
        return n, None

    def answers(self, key: bytes, count: int, max_tokens: Any) -> list[C.Answer]:
        """One answer per choice, before padding."""
        if self.override.text is not None:
            return [C.Answer(self.override.text)] * count
        out = []
        limited = isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0
        for i in range(count):
            text = C.natural_text(key, i)
            if limited and C.approx_tokens(text) > max_tokens:
                out.append(C.Answer(C.truncate_to_tokens(text, max_tokens), "length"))
            else:
                out.append(C.Answer(text))
        return out

    def pad(self, answers: list[C.Answer], build: Callable[[str, int, list[C.Answer]], bytes]) -> list[C.Answer]:
        """Pad each answer so that the non-streamed JSON body is about response_kb (or mock.kb) KB.

        The size is computed on a placeholder envelope of fixed length, so streamed and non-streamed
        requests get exactly the same text. mock.text answers are never padded.
        """
        kb = self.override.kb if self.override.kb is not None else self.cfg.response_kb
        if kb <= 0 or self.override.text is not None or not answers:
            return answers
        target = min(int(kb * 1024), C.MAX_PAD_CHARS)
        sizing = build("x" * (_ID_HEX + 10), _SIZING_CREATED, answers)
        per_choice = (target - len(sizing)) // len(answers)
        # padding grows completion_tokens (and its digits); count them in so the size lands close
        digits = len(str(target // 4 + 1)) - len(str(sum(a.tokens for a in answers)))
        per_choice -= 2 * digits // len(answers)
        return [C.Answer(a.text, a.finish, max(0, per_choice)) for a in answers]

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
            for i in range(0, len(view), _WRITE_BYTES):
                await resp.write(view[i : i + _WRITE_BYTES])
                self.nbytes += len(view[i : i + _WRITE_BYTES])
        if cut:
            await _drain_transport(self.request)
            self.abort("cut_stream", rst=False)
        else:
            await resp.write_eof()
        return resp

    async def send_stream(self, events: Iterator[bytes], cut_after: int | None = None) -> web.StreamResponse:
        """Send SSE events; with cut_after, send that many and then drop the connection."""
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
            if size >= _FLUSH_BYTES:
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
            await _drain_transport(self.request)
            self.abort("cut_stream", rst=False)
        return resp


# ---------------------------------------------------------------------------------------------- /v1 wrapper

_V1Handler = Callable[[_Call], Awaitable[web.StreamResponse]]


def _v1(inner: _V1Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Counting, outage, auth and in-flight tracking around a /v1 handler."""

    async def handler(request: web.Request) -> web.StreamResponse:
        state = request.app[STATE]
        stats = state.stats
        auth = request.headers.get("Authorization")
        stats.arrival(request.path, auth is not None)
        call = _Call(request=request, state=state, cfg=state.cfg)
        if state.down:
            return call.abort("down")
        stats.enter()
        try:
            key = call.cfg.api_key
            if key is not None and auth != f"Bearer {key}":
                msg = "You didn't provide an API key." if auth is None else "Incorrect API key provided."
                resp: web.StreamResponse = _error(request, 401, msg)
            else:
                # issue 21: within the capacity (evalsup.mock.capacity); a full queue answers 429 at once
                resp = await state.capacity.serve(call.cfg.capacity, call.cfg.queue, request.method,
                                                  lambda: inner(call),
                                                  lambda: _rate_limited(request, call.cfg.retry_after_s))
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


# ---------------------------------------------------------------------------------------------- endpoints


def _usage(answers: list[C.Answer], prompt_tokens: int) -> dict[str, int]:
    completion_tokens = sum(a.tokens for a in answers)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class _Shape:
    """What differs between chat completions and (legacy) completions."""

    chat: bool
    id_prefix: str
    obj: str
    chunk_obj: str

    def choice(self, i: int, a: C.Answer) -> dict[str, Any]:
        if self.chat:
            # only what a stream carries, so that reassembled streams can equal this exactly
            message = {"role": "assistant", "content": a.json_value(i)}
            return {"index": i, "message": message, "logprobs": None, "finish_reason": a.finish}
        return {"text": a.json_value(i), "index": i, "logprobs": None, "finish_reason": a.finish}

    def delta(self, i: int, content: str | None, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta = {} if content is None else {"content": content}
            return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"text": content or "", "index": i, "logprobs": None, "finish_reason": finish}

    def body(self, cid: str, created: int, model: str, answers: list[C.Answer], prompt_tokens: int) -> bytes:
        return b"".join(self.body_parts(cid, created, model, answers, prompt_tokens))

    def body_parts(
        self, cid: str, created: int, model: str, answers: list[C.Answer], prompt_tokens: int
    ) -> list[bytes | memoryview]:
        return C.render_parts(
            {
                "id": cid,
                "object": self.obj,
                "created": created,
                "model": model,
                "choices": [self.choice(i, a) for i, a in enumerate(answers)],
                "usage": _usage(answers, prompt_tokens),
                "system_fingerprint": FINGERPRINT,
            },
            answers,
        )

    def events(
        self, cid: str, created: int, model: str, answers: list[C.Answer], prompt_tokens: int, usage: bool
    ) -> Iterator[bytes]:
        """SSE events: (chat: a role chunk,) content chunks, a finish chunk per choice; usage chunk; [DONE]."""

        def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
            out: dict[str, Any] = {
                "id": cid,
                "object": self.chunk_obj,
                "created": created,
                "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": choices,
            }
            if usage:
                out["usage"] = None
            return out

        for i, a in enumerate(answers):
            if self.chat:
                role = {"role": "assistant", "content": ""}
                yield _sse(chunk([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}]))
            if a.pad:  # JSON-safe byte slices spliced into a pre-encoded chunk
                head, tail = C.split_at_marker(chunk([self.delta(i, C.pad_marker(i))]), i)
                head = b"data: " + head
                tail += b"\n\n"
                for view in a.byte_pieces():
                    yield b"".join((head, view, tail))
            else:
                for piece in a.pieces():
                    yield _sse(chunk([self.delta(i, piece)]))
            yield _sse(chunk([self.delta(i, None, a.finish)]))
        if usage:
            last = chunk([])
            last["usage"] = _usage(answers, prompt_tokens)
            yield _sse(last)
        yield _SSE_DONE

    def malformed_events(self, first: bytes, cid: str) -> Iterator[bytes]:
        yield first
        yield b'data: {"id": "' + cid.encode() + b'", "object": "' + self.chunk_obj.encode() + b'", "choices": [{"\n\n'
        yield _SSE_DONE


_CHAT = _Shape(chat=True, id_prefix="chatcmpl-", obj="chat.completion", chunk_obj="chat.completion.chunk")
_TEXT = _Shape(chat=False, id_prefix="cmpl-", obj="text_completion", chunk_obj="text_completion")


async def _generate(
    call: _Call, shape: _Shape, answers: list[C.Answer], model: str, prompt_tokens: int
) -> web.StreamResponse:
    """Pad, then answer as JSON or SSE, honouring malformed and cut_stream."""
    answers = call.pad(answers, lambda cid, created, a: shape.body(cid, created, model, a, prompt_tokens))
    cid = _new_id(shape.id_prefix)
    created = int(time.time())
    if call.stream:
        events = shape.events(cid, created, model, answers, prompt_tokens, call.include_usage)
        if call.fault is Fault.MALFORMED:
            call.state.stats.fault("malformed")
            return await call.send_stream(shape.malformed_events(next(events), cid))
        if call.override.cut_stream:
            pieces = answers[0].piece_count() if answers else 0
            return await call.send_stream(events, cut_after=int(shape.chat) + max(1, pieces // 2))
        return await call.send_stream(events)
    parts = shape.body_parts(cid, created, model, answers, prompt_tokens)
    if call.fault is Fault.MALFORMED:
        call.state.stats.fault("malformed")
        body = b"".join(parts)
        return web.Response(body=body[: max(1, len(body) // 2)], content_type="application/json")
    if call.override.cut_stream:
        return await call.send_parts(parts, cut=True)
    if len(parts) == 1:
        return web.Response(body=parts[0], content_type="application/json")
    return await call.send_parts(parts)


async def _chat_completions(call: _Call) -> web.StreamResponse:
    early = await call.begin()
    if early is not None:
        return early
    model, err = call.check_model()
    if err is not None:
        return err
    messages = call.body.get("messages")
    if not isinstance(messages, list) or not messages:
        return _error(call.request, 400, "messages must be a non-empty array", param="messages")
    n, err = call.choices_n()
    if err is not None:
        return err
    fault = call.random_fault()
    if fault is not None:
        return fault
    key = C.content_key(call.cfg.seed, "chat", call.body)
    max_tokens = call.body.get("max_completion_tokens") or call.body.get("max_tokens")
    return await _generate(call, _CHAT, call.answers(key, n, max_tokens), model, C.chat_prompt_tokens(messages))


async def _completions(call: _Call) -> web.StreamResponse:
    early = await call.begin()
    if early is not None:
        return early
    model, err = call.check_model()
    if err is not None:
        return err
    prompts = C.input_items(call.body.get("prompt"))
    if prompts is None:
        return _error(call.request, 400, "prompt must be a string, an array of strings or tokens", param="prompt")
    n, err = call.choices_n()
    if err is not None:
        return err
    if len(prompts) * n > MAX_N:
        return _error(call.request, 400, f"at most {MAX_N} choices per request", param="n")
    fault = call.random_fault()
    if fault is not None:
        return fault
    key = C.content_key(call.cfg.seed, "completion", call.body)
    answers = call.answers(key, len(prompts) * n, call.body.get("max_tokens"))
    return await _generate(call, _TEXT, answers, model, sum(C.item_tokens(p) for p in prompts))


async def _embeddings(call: _Call) -> web.StreamResponse:
    early = await call.begin()
    if early is not None:
        return early
    model, err = call.check_model()
    if err is not None:
        return err
    items = C.input_items(call.body.get("input"))
    if items is None:
        return _error(call.request, 400, "input must be a string, an array of strings or tokens", param="input")
    dims = call.body.get("dimensions")
    if dims is None:
        dims = 8
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= MAX_DIMS:
        return _error(call.request, 400, "dimensions must be a positive integer", param="dimensions")
    fmt = call.body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        return _error(call.request, 400, "encoding_format must be 'float' or 'base64'", param="encoding_format")
    fault = call.random_fault()
    if fault is not None:
        return fault
    data = []
    for i, item in enumerate(items):
        vec = C.embedding(call.cfg.seed, model, item, dims)
        emb: list[float] | str = C.embedding_base64(vec) if fmt == "base64" else vec
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(C.item_tokens(x) for x in items)
    body = orjson.dumps(
        {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )
    if call.fault is Fault.MALFORMED:
        call.state.stats.fault("malformed")
        body = body[: max(1, len(body) // 2)]
    return web.Response(body=body, content_type="application/json")


def _model_obj(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": MODEL_CREATED, "owned_by": "evalsup-mock"}


async def _models(call: _Call) -> web.StreamResponse:
    delay = call.state.faults.latency_s(call.cfg)
    if delay > 0:
        await asyncio.sleep(delay)
    return _json_response({"object": "list", "data": [_model_obj(m) for m in call.cfg.models]})


async def _model(call: _Call) -> web.StreamResponse:
    model = call.request.match_info["model"]
    if call.cfg.models and model not in call.cfg.models:
        msg = f"The model `{model}` does not exist or you do not have access to it."
        return _error(call.request, 404, msg, code="model_not_found", param="model")
    return _json_response(_model_obj(model))


async def _unknown(call: _Call) -> web.StreamResponse:
    request = call.request
    return _error(request, 404, f"Invalid URL ({request.method} {request.path})", code="unknown_url")


# ---------------------------------------------------------------------------------------------- admin


async def _admin_stats(request: web.Request) -> web.StreamResponse:
    return _json_response(request.app[STATE].stats.snapshot())


async def _admin_reset(request: web.Request) -> web.StreamResponse:
    request.app[STATE].reset()
    return _json_response({"ok": True})


async def _admin_get_config(request: web.Request) -> web.StreamResponse:
    return _json_response(request.app[STATE].config_json())


async def _admin_set_config(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        updates = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _json_response({"error": "body must be a JSON object"}, status=400)
    if not isinstance(updates, dict):
        return _json_response({"error": "body must be a JSON object"}, status=400)
    try:
        state.update(updates)
    except ValueError as exc:
        return _json_response({"error": str(exc)}, status=400)
    return _json_response(state.config_json())


async def _metrics(request: web.Request) -> web.StreamResponse:
    """Issue 21: vLLM-style queue gauges of the capacity model."""
    st = request.app[STATE]
    return web.Response(text=prometheus_text(st.capacity, st.stats.in_flight, st.cfg.models),
                        content_type="text/plain")


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    if "x-request-id" not in response.headers:
        response.headers["x-request-id"] = _new_id("req_")


def create_app(cfg: MockConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[STATE] = _State(cfg)
    app.on_response_prepare.append(_add_request_id)
    r = app.router
    r.add_post("/v1/chat/completions", _v1(_chat_completions))
    r.add_post("/v1/completions", _v1(_completions))
    r.add_post("/v1/embeddings", _v1(_embeddings))
    r.add_get("/v1/models", _v1(_models), allow_head=False)
    r.add_get("/v1/models/{model}", _v1(_model), allow_head=False)
    r.add_route("*", "/v1/{tail:.*}", _v1(_unknown))
    r.add_get("/_mock/stats", _admin_stats, allow_head=False)
    r.add_post("/_mock/reset", _admin_reset)
    r.add_get("/_mock/config", _admin_get_config, allow_head=False)
    r.add_post("/_mock/config", _admin_set_config)
    r.add_get("/metrics", _metrics, allow_head=False)  # issue 21
    return app


# ---------------------------------------------------------------------------------------------- running it


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


class MockServer:
    """A mock endpoint running on the current event loop (see start_mock)."""

    def __init__(self, app: web.Application, runner: web.AppRunner, host: str, port: int) -> None:
        self.app = app
        self._runner = runner
        self.host = host
        self.port = port
        self.url = _url(host, port)
        self._closed = False

    @property
    def stats(self) -> MockStats:
        return self.app[STATE].stats

    @property
    def config(self) -> MockConfig:
        return self.app[STATE].cfg

    def configure(self, **updates: Any) -> MockConfig:
        """Change knobs live, like POST /_mock/config (also accepts down=True/False)."""
        state = self.app[STATE]
        state.update(updates)
        return state.cfg

    def reset_stats(self) -> None:
        """Like POST /_mock/reset: clear the counters and the attempt counts behind mock.times."""
        self.app[STATE].reset()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._runner.cleanup()


async def start_mock(cfg: MockConfig, host: str = "127.0.0.1", port: int = 0) -> MockServer:
    """Start the mock on the running loop; port 0 picks a free port (see MockServer.port)."""
    app = create_app(cfg)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return MockServer(app, runner, host, bound)


class MockThread:
    """The mock server on its own event loop in a daemon thread, for sync code and tests."""

    def __init__(self, cfg: MockConfig, port: int = 0, host: str = "127.0.0.1") -> None:
        self.cfg = cfg
        self.host = host
        self.port = port
        self.url = _url(host, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: MockServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> MockThread:
        if self._thread is not None:
            raise RuntimeError("MockThread already started")
        self._thread = threading.Thread(target=self._run, name="evalsup-mock", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("mock server did not start within 30 s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        try:
            try:
                self._server = loop.run_until_complete(start_mock(self.cfg, self.host, self.port))
            except BaseException as exc:
                self._error = exc
                return
            self.port = self._server.port
            self.url = self._server.url
            self._loop = loop
            self._ready.set()
            loop.run_forever()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            self._ready.set()
            loop.close()

    def _call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        loop, server = self._loop, self._server
        if loop is None or server is None or loop.is_closed():
            raise RuntimeError("MockThread is not running")

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    @property
    def server(self) -> MockServer:
        if self._server is None:
            raise RuntimeError("MockThread is not running")
        return self._server

    def stats(self) -> dict[str, Any]:
        """Same as GET /_mock/stats."""
        return dict(self._call(lambda: self.server.stats.snapshot()))

    def reset_stats(self) -> None:
        self._call(lambda: self.server.reset_stats())

    def configure(self, **updates: Any) -> MockConfig:
        """Change knobs live, like POST /_mock/config (also accepts down=True/False)."""
        cfg = self._call(lambda: self.server.configure(**updates))
        assert isinstance(cfg, MockConfig)
        return cfg

    def stop(self) -> None:
        loop, server, thread = self._loop, self._server, self._thread
        if loop is None or server is None or thread is None or loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        self._loop = None

    def __enter__(self) -> MockThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve_forever(cfg: MockConfig, host: str, port: int) -> None:
    """Run the mock until interrupted (Ctrl-C or SIGTERM). Prints "mock endpoint on <url>" once started."""

    async def main() -> None:
        server = await start_mock(cfg, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        print(f"mock endpoint on {server.url}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.close()

    with asyncio.Runner(loop_factory=_new_loop) as runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(main())
