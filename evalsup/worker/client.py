"""One task's trip to the endpoint and back: attempts, retries, timeouts, and the response bytes."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from evalsup.worker.retry import RetryPolicy, parse_retry_after


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


def join_url(base_url: str, path: str) -> str:
    """base ".../v1" + "/v1/chat/completions" -> ".../v1/chat/completions" (no doubled /v1)."""
    base = base_url.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


def _body_value(raw: bytes, parsed: Any) -> Any:
    # The endpoint's own bytes go into the output line unchanged when they are one line of JSON.
    if b"\n" not in raw and b"\r" not in raw:
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


class Client:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str],
                 policy: RetryPolicy, max_response_bytes: int, seed: int) -> None:
        self.session = session
        self.base_url = base_url
        self.headers = headers
        self.policy = policy
        self.max_response_bytes = max_response_bytes
        self.rng = random.Random(seed)

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        length = resp.content_length
        if length is not None and length > self.max_response_bytes:
            raise ResponseTooLarge(length)
        chunks: list[bytes] = []
        n = 0
        async for chunk in resp.content.iter_any():
            n += len(chunk)
            if n > self.max_response_bytes:
                raise ResponseTooLarge(n)
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def execute(self, path: str, body: dict[str, Any]) -> Outcome:
        url = join_url(self.base_url, path)
        payload = orjson.dumps(body)
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            status: int | None = None
            retry_after: float | None = None
            request_id: str | None = None
            parsed: Any = None
            raw = b""
            try:
                async with self.session.post(url, data=payload, headers=self.headers) as resp:
                    status = resp.status
                    request_id = resp.headers.get("x-request-id")
                    retry_after = parse_retry_after(resp.headers.get("Retry-After"))
                    raw = await self._read(resp)
                try:
                    parsed = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    error = {"code": "invalid_json", "message": f"HTTP {status}: response body is not valid JSON"}
                    if status == 200:
                        status = None  # treat as a broken answer: may succeed on a retry
                else:
                    if status == 200:
                        return Outcome(200, _body_value(raw, parsed), len(raw), request_id, None, attempt,
                                       time.monotonic() - start)
                    error = {"code": f"http_{status}", "message": _error_message(parsed, status)}
            except ResponseTooLarge as e:
                return Outcome(status, None, int(e.args[0]), request_id,
                               {"code": "response_too_large",
                                "message": f"response of {e.args[0]} bytes exceeds --max-response-mb"},
                               attempt, time.monotonic() - start)
            except TimeoutError:
                status = None
                error = {"code": "timeout", "message": "request timed out"}
            except aiohttp.ClientError as e:
                status = None
                error = {"code": "connection_error", "message": f"{type(e).__name__}: {e}"[:300]}
            if not self.policy.should_retry(status, attempt):
                body_out = _body_value(raw, parsed) if parsed is not None else None
                return Outcome(status, body_out, len(raw), request_id, error, attempt, time.monotonic() - start)
            await asyncio.sleep(self.policy.wait_s(attempt, retry_after, self.rng))
