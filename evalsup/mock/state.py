"""The mock's shared state and the small pieces every route uses: errors in OpenAI's format, aborts, SSE."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import time
from typing import Any

import orjson
from aiohttp import web

from evalsup.mock.capacity import Capacity
from evalsup.mock.config import MockConfig, apply_update, config_to_json
from evalsup.mock.faults import AttemptCounter, FaultInjector
from evalsup.mock.stats import MockStats

FINGERPRINT = "fp_evalsup_mock"
MODEL_CREATED = 1_700_000_000
MAX_N = 128
MAX_DIMS = 65_536
MAX_BODY = 1 << 30
SHUTDOWN_TIMEOUT_S = 0.5
ID_HEX = 24  # hex characters after an id's prefix; fixed so that padding sizes are deterministic
SIZING_CREATED = 1_000_000_000

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


class State:
    """Everything a running app shares: live config, outage flag, RNGs, counters."""

    def __init__(self, cfg: MockConfig) -> None:
        self.cfg = cfg
        self.down = False
        self.faults = FaultInjector(cfg.seed)
        self.stats = MockStats()
        self.attempts = AttemptCounter()
        self.served = 0  # /v1 requests that passed the auth check, for revoke_after
        self.capacity = Capacity()  # K served at once, a FIFO of Q, then 429 (evalsup.mock.capacity)

    def key_revoked(self) -> bool:
        """Count one /v1 request; whether the key is revoked for it (revoked, or past revoke_after)."""
        self.served += 1
        after = self.cfg.revoke_after
        return self.cfg.revoked or (after is not None and self.served > after)

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
        self.capacity.resize(cfg.capacity)  # a larger capacity admits waiters at once

    def reset(self) -> None:
        """Clear the counters and the attempt counts behind mock.times."""
        self.stats.reset()
        self.attempts.clear()
        self.served = 0

    def config_json(self) -> dict[str, Any]:
        out = config_to_json(self.cfg)
        for secret in ("api_key", "basic_auth"):
            if out[secret] is not None:
                out[secret] = "***"
        out["down"] = self.down
        return out


STATE: web.AppKey[State] = web.AppKey("evalsup_mock_state", State)


# ---------------------------------------------------------------------------------------------- helpers


def new_id(prefix: str) -> str:
    return prefix + os.urandom(ID_HEX // 2).hex()


def fmt_seconds(s: float) -> str:
    return str(int(s)) if s == int(s) else f"{s:g}"


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, headers=headers, content_type="application/json")


def error(
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
    if request.app[STATE].cfg.echo_headers_in_errors:  # as gateways do: what was sent, the URL's query too
        err["request_headers"] = {str(k): v for k, v in request.headers.items()}
        err["message"] = f"{err['message']} ({request.method} {request.url})"
    return json_response({"error": err}, status=status, headers=headers)


def rate_limited(request: web.Request, retry_after: float) -> web.Response:
    headers = {
        "Retry-After": fmt_seconds(retry_after),
        "retry-after-ms": str(round(retry_after * 1000)),
        "x-ratelimit-remaining-requests": "0",
    }
    return error(request, 429, headers=headers)


def abort_transport(request: web.Request, *, rst: bool) -> None:
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


async def drain_transport(request: web.Request, limit_s: float = 2.0) -> None:
    transport = request.transport
    deadline = time.monotonic() + limit_s
    while transport is not None and not transport.is_closing() and time.monotonic() < deadline:
        if transport.get_write_buffer_size() == 0:
            return
        await asyncio.sleep(0.002)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
FLUSH_BYTES = 1 << 16
WRITE_BYTES = 1 << 18
