"""Requests of the worker's own, never a task's: the breaker's probe (does the endpoint serve at all?) and the
key check (does it still take the key?). Both are the connection check's tiny request for the path and model
of the last task seen (GET /models before any task)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from evalsup.tasks import join_url
from evalsup.worker.endpoints import Endpoint


def probe_request(ep: Endpoint, last: tuple[str, str] | None) -> tuple[str, bytes] | None:
    """The tiny request for ``last`` = (path, model) at ``ep``; None when GET /models must do."""
    if last is None:
        return None
    path, model = last
    body: dict[str, Any] = {"model": model}
    p = path.partition("?")[0].rstrip("/")
    if p.endswith("/chat/completions"):
        body.update(messages=[{"role": "user", "content": "ping"}], max_tokens=1)
    elif p.endswith("/completions"):
        body.update(prompt="ping", max_tokens=1)
    elif p.endswith("/embeddings"):
        body.update(input="ping")
    elif p.endswith("/responses"):
        body.update(input="ping", max_output_tokens=16)
    else:
        return None
    return ep.url(path), orjson.dumps(body)


def key_verdict(status: int | None, posted: bool) -> str:
    """What the key check's answer says of the key: "lost" (401/403), "taken" (a 2xx; or, to the tiny POST, an
    answer only a server past its key check gives: 400, 404, 422, 429), "down" (no answer, a 5xx), or
    "unsure" (anything else, or a non-2xx to GET /models, which some servers serve without a key or lack)."""
    if status is None or status >= 500:
        return "down"
    if status in (401, 403):
        return "lost"
    if 200 <= status < 300 or (posted and status in (400, 404, 422, 429)):
        return "taken"
    return "unsure"


async def send_probe(session: aiohttp.ClientSession, headers: dict[str, str], ep: Endpoint,
                     last: tuple[str, str] | None) -> tuple[int | None, str]:
    """(its HTTP status, or None when no answer came; what happened, for a log line: never the key)."""
    req = probe_request(ep, last)
    what = "a 1-token request" if req is not None else "GET /models"
    try:
        if req is not None:
            ctx = session.post(req[0], data=req[1], headers=headers)
        else:
            ctx = session.get(join_url(ep.base_url, "/v1/models"), headers=headers)
        async with ctx as resp:
            await resp.read()
            return resp.status, f"{what}: HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, ValueError, RuntimeError) as e:  # (a closed session at the end)
        return None, f"{what}: {type(e).__name__}: {e}"[:300]
