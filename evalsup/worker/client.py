"""One task's trip to the endpoint and back: pacing, attempts, retries, timeouts, streaming, the breaker."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from evalsup.tasks import join_url
from evalsup.worker.bodies import BodyParser, one_line
from evalsup.worker.breaker import LocalBreaker, endpoint_side
from evalsup.worker.pacing import Pacer
from evalsup.worker.retry import RetryPolicy, parse_retry_after
from evalsup.worker.sse import StreamAssembler, StreamCut


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
    server_s: float = 0.0  # issue 21: the last attempt, from the request written to the last byte
    queue_s: float = 0.0  # issue 21: waits for the pacer (--max-requests-per-s, --max-tokens-per-min)


@dataclass(slots=True)
class Attempt:
    status: int | None
    raw: bytes
    parsed: Any
    request_id: str | None
    retry_after: float | None
    error: dict[str, str] | None
    ttft_s: float | None = None
    itl_s: float | None = None
    final: bool = False  # not worth retrying whatever the status (e.g. too large)
    one_line: bool | None = None  # whether raw has no line break, when already known


def body_value(raw: bytes, parsed: Any, single: bool | None = None) -> Any:
    """The endpoint's own bytes go into the output line unchanged when they are one line of JSON
    (``single``: whether they are, if known)."""
    if raw and (one_line(raw) if single is None else single):
        return orjson.Fragment(raw)
    return parsed


def _error_message(parsed: Any, status: int) -> str:
    if isinstance(parsed, dict):
        err = parsed.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])[:500]
        if isinstance(err, str):
            return err[:500]
    return f"HTTP {status}"


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
    def __init__(self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str],
                 policy: RetryPolicy, max_response_bytes: int, seed: int, breaker: LocalBreaker,
                 pacer: Pacer, on_trip: Callable[[str], None], on_probe: Callable[[bool, str], None],
                 secret: str | None = None, whole_bodies: bool = True) -> None:
        self.session = session
        self.base_url = base_url
        self.headers = headers
        self.policy = policy
        self.max_response_bytes = max_response_bytes
        self.rng = random.Random(seed)
        self.breaker = breaker
        self.pacer = pacer
        self.on_trip = on_trip
        self.on_probe = on_probe
        self.secret = secret.encode() if secret else None
        self.secrets = [self.secret] if self.secret else []  # issue 21: and --header values (worker.main)
        # whole_bodies: something (a scorer, a plugin) reads the parsed body; else a large one only needs checking
        self.bodies = BodyParser(whole_bodies)
        self.parked = 0
        self.retries = 0
        self._urls: dict[str, str] = {}  # task path -> URL (the few paths a task file names)
        # issue 21: told of every attempt (status, error code, seconds at the server): the adaptive limit
        self.observe: Callable[[int | None, str | None, float], None] | None = None

    def _scrub(self, raw: bytes) -> bytes:
        # An endpoint may echo request headers in an error; the key must never reach a file.
        for s in self.secrets:
            if s in raw:
                raw = raw.replace(s, b"[redacted]")
        return raw

    async def _each_chunk(self, resp: aiohttp.ClientResponse, take: Callable[[bytes], object]) -> None:
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
                take(chunk)
            elif content.at_eof():
                return

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        length = resp.content_length
        if length is not None and length > self.max_response_bytes:
            raise ResponseTooLarge(length)
        chunks: list[bytes] = []
        await self._each_chunk(resp, chunks.append)
        # One join, the only copy of the body this side of aiohttp's parser: aiohttp's read() and iter_any() join
        # whatever chunks are buffered at each wake-up, then join those blocks again (a 1 MB body copied twice).
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _read_stream(self, resp: aiohttp.ClientResponse, start: float) -> tuple[bytes, Any, StreamAssembler]:
        asm = StreamAssembler(start)
        await self._each_chunk(resp, asm.feed)
        body = asm.body()  # raises StreamCut when the stream stopped early
        raw = orjson.dumps(body)
        return raw, body, asm

    async def attempt(self, url: str, payload: bytes, stream: bool) -> Attempt:
        start = time.monotonic()
        status: int | None = None
        request_id: str | None = None
        retry_after: float | None = None
        try:
            async with self.session.post(url, data=payload, headers=self.headers) as resp:
                status = resp.status
                request_id = resp.headers.get("x-request-id")
                if status != 200:
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                if stream and status == 200 and resp.content_type == "text/event-stream":
                    raw, parsed, asm = await self._read_stream(resp, start)
                    raw = self._scrub(raw)
                    return Attempt(200, raw, parsed, request_id, None, None, asm.ttft_s, asm.itl_s)
                raw = self._scrub(await self._read(resp))
        except ResponseTooLarge as e:
            return Attempt(status, b"", None, request_id, None,
                           {"code": "response_too_large",
                            "message": f"response of {e.args[0]} bytes exceeds --max-response-mb"}, final=True)
        except StreamCut as e:
            return Attempt(None, b"", None, request_id, None, {"code": "stream_cut", "message": str(e)})
        except aiohttp.ConnectionTimeoutError:
            return Attempt(None, b"", None, None, None,
                           {"code": "timeout_connect", "message": "no connection within --connect-timeout"})
        except aiohttp.SocketTimeoutError:
            return Attempt(None, b"", None, request_id, None,
                           {"code": "timeout_read", "message": "no data within --read-timeout"})
        except TimeoutError:
            return Attempt(None, b"", None, request_id, None,
                           {"code": "timeout_total", "message": "the attempt took longer than --timeout"})
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as e:
            code = "stream_cut" if stream else "connection_error"
            msg = f"{type(e).__name__}: {e}"[:300]
            return Attempt(None, b"", None, request_id, None, {"code": code, "message": msg})
        except (aiohttp.ClientError, ValueError) as e:
            return Attempt(None, b"", None, request_id, None,
                           {"code": "connection_error", "message": f"{type(e).__name__}: {e}"[:300]})
        single = one_line(raw) if status == 200 else None
        try:
            parsed = self.bodies.parse(raw, single) if single is not None else orjson.loads(raw)
        except orjson.JSONDecodeError:
            # a 200 that is not JSON is a broken answer (truncated, proxy page): worth another attempt
            return Attempt(None if status == 200 else status, raw, None, request_id, retry_after,
                           {"code": "invalid_json", "message": f"HTTP {status}: response body is not valid JSON"})
        if status == 200:
            return Attempt(200, raw, parsed, request_id, None, None, one_line=single)
        return Attempt(status, raw, parsed, request_id, retry_after,
                       {"code": f"http_{status}", "message": _error_message(parsed, status)})

    async def execute(self, path: str, body: dict[str, Any]) -> Outcome:
        url = self._urls.get(path)
        if url is None:
            url = join_url(self.base_url, path)
            if len(self._urls) < 64:  # bounded, whatever paths a task file names
                self._urls[path] = url
        stream = bool(body.get("stream"))
        if stream and path in ("/v1/chat/completions", "/v1/completions"):
            opts = body.get("stream_options")
            if not isinstance(opts, dict) or "include_usage" not in opts:
                body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        payload = orjson.dumps(body)
        estimate = estimate_tokens(body) if self.pacer.tpm else 0
        start = time.monotonic()
        attempts = 0  # real attempts, for metrics
        budget_used = 0  # attempts that count against --max-attempts (reset when the breaker closes)
        probing = False
        queued = server_s = 0.0  # issue 21
        while True:
            t_q = time.monotonic()  # issue 21: queue_s
            if self.pacer.rps is not None:  # (no coroutine to make and await per request without a limit)
                await self.pacer.request_slot()
            if self.pacer.tpm is not None:
                await self.pacer.charge_tokens(estimate)
            attempts += 1
            budget_used += 1
            t_a = time.monotonic()  # issue 21: the server's time, apart from the pacer's
            queued += t_a - t_q
            a = await self.attempt(url, payload, stream)
            server_s = time.monotonic() - t_a
            if self.observe is not None:
                self.observe(a.status, a.error["code"] if a.error else None, server_s)
            ok = a.error is None
            if self.pacer.tpm and ok and isinstance(a.parsed, dict):
                usage = a.parsed.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
                    self.pacer.correct_tokens(usage["total_tokens"] - estimate)
            down = not ok and endpoint_side(a.status, a.error["code"] if a.error else None)
            if self.breaker.record(down):
                self.breaker.open = True
                self.on_trip(a.error["message"] if a.error else "failures")
            if probing:
                self.on_probe(not down, a.error["message"] if a.error else "ok")
                probing = False
            if ok or a.final or not self.policy.retryable(a.status):
                return self._outcome(a, attempts, start, server_s, queued)
            if down and self.breaker.open:
                self.parked += 1
                try:
                    turn = await self.breaker.wait_turn()
                finally:
                    self.parked -= 1
                probing = turn == "probe"
                if turn == "closed":
                    budget_used = 0
                self.retries += 1
                continue
            if budget_used >= self.policy.max_attempts:
                return self._outcome(a, attempts, start, server_s, queued)
            self.retries += 1
            await asyncio.sleep(self.policy.wait_s(attempts, a.retry_after, self.rng))

    def _outcome(self, a: Attempt, attempts: int, start: float, server_s: float = 0.0,
                 queued: float = 0.0) -> Outcome:
        body = body_value(a.raw, a.parsed, a.one_line) if a.parsed is not None else None
        return Outcome(a.status, body, len(a.raw), a.request_id, a.error, attempts, time.monotonic() - start,
                       a.parsed, a.ttft_s, a.itl_s, a.raw if isinstance(body, orjson.Fragment) else None,
                       server_s, queued)

    async def probe_models(self) -> None:
        """A probe when no request is parked here: GET /models, once."""
        try:
            async with self.session.get(join_url(self.base_url, "/v1/models"), headers=self.headers) as resp:
                await resp.read()
                ok = resp.status < 500
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        self.on_probe(ok, "GET /models")
