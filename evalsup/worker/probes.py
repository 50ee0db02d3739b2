"""Requests of the worker's own, never a task's: the breaker's probe (does the endpoint serve at all?) and the
key check (does it still take the key?). Both are the connection check's tiny request for the path and model
of the last task seen (GET /models before any task)."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable

import aiohttp
import orjson

from evalsup.tasks.requests import join_url
from evalsup.tasks.routes import probe_body
from evalsup.worker.endpoints import Endpoint
from evalsup.worker.errors import LocalError, local


def probe_request(ep: Endpoint, last: tuple[str, str] | None) -> tuple[str, bytes] | None:
    """The tiny request for ``last`` = (path, model) at ``ep``; None when GET /models must do."""
    if last is None:
        return None
    path, model = last
    body = probe_body(path, model)
    if body is None:
        return None
    return ep.url(path), orjson.dumps(body)


class KeyVerdict(enum.StrEnum):
    """What the key check's answer says of the key (``key_verdict``)."""

    LOST = "lost"  # 401/403: the key is refused here too
    TAKEN = "taken"  # a 2xx; or, to the tiny POST, an answer only a server past its key check gives
    DOWN = "down"  # no answer, or a 5xx
    UNSURE = "unsure"  # anything else


def key_verdict(status: int | None, posted: bool) -> KeyVerdict:
    """What the key check's answer says of the key: LOST (401/403), TAKEN (a 2xx; or, to the tiny POST, an
    answer only a server past its key check gives: 400, 404, 422, 429), DOWN (no answer, a 5xx), or
    UNSURE (anything else, or a non-2xx to GET /models, which some servers serve without a key or lack)."""
    if status is None or status >= 500:
        return KeyVerdict.DOWN
    if status in (401, 403):
        return KeyVerdict.LOST
    if 200 <= status < 300 or (posted and status in (400, 404, 422, 429)):
        return KeyVerdict.TAKEN
    return KeyVerdict.UNSURE


async def send_probe(session: aiohttp.ClientSession, ep: Endpoint,
                     req: tuple[str, bytes] | None) -> tuple[int | None, str]:
    """Send ``probe_request``'s request (GET /models for None) with the headers and auth the tasks' requests to
    ``ep`` carry: (its HTTP status, or None when no answer came; what happened, for a log line: never the key).
    Raises LocalError when the request could not be sent at all (``errors.local``): never the endpoint's."""
    what = "a 1-token request" if req is not None else "GET /models"
    answered = False
    try:
        if req is not None:
            ctx = session.post(req[0], data=req[1], headers=ep.headers)
        else:
            ctx = session.get(join_url(ep.address, "/v1/models"), headers=ep.headers)
        async with ctx as resp:
            answered = True
            await resp.read()
            return resp.status, f"{what}: HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError, ValueError, RuntimeError) as e:  # (a closed session at the end)
        detail = f"{type(e).__name__}: {e}"[:300].replace(ep.address, ep.public)
        if not answered and local(e):
            raise LocalError(f"{what}: {detail}") from None
        return None, f"{what}: {detail}"


async def key_check(session: aiohttp.ClientSession, ep: Endpoint,
                    fallback: tuple[str, str] | None, on_auth: Callable[[int, str], None],
                    on_trip: Callable[[int, str], None]) -> None:
    """Refusals at ``ep`` wait for a verdict (worker.breaker.AuthWatch): ask the endpoint with a request of our
    own, sent after they came back, for the path and model it last served (else ``fallback``, the worker's
    last task's). The key refused there too: lost, and the supervisor is told (``on_auth``). Taken: the
    refusals received before it was sent were those tasks' own. No answer or a 5xx, three times running: the
    endpoint is tripped as down (``on_trip``: the breaker's probes take over, and the refused tasks go
    elsewhere or park). Else ask again, 0.5 to 5 s later; after 5 answers that say nothing of the key, it is
    taken as taken (the endpoint serves; the tasks get their records)."""
    pause, down, unsure = 0.5, 0, 0
    try:
        while ep.auth.pending:
            sent = time.monotonic()
            req = probe_request(ep, ep.last_ok or fallback)
            status, detail = await send_probe(session, ep, req)
            verdict = key_verdict(status, req is not None)
            if verdict is KeyVerdict.LOST:
                if ep.key_lost():
                    on_auth(ep.index, ep.auth.message)
                return
            if verdict is KeyVerdict.TAKEN or (verdict is KeyVerdict.UNSURE and (unsure := unsure + 1) >= 5):
                ep.key_taken(sent)
                pause, down, unsure = 0.5, 0, 0
                continue  # (refusals received since it left wait for the next)
            if verdict is KeyVerdict.DOWN and (down := down + 1) >= 3 and ep.up:
                ep.eject()
                on_trip(ep.index, f"the key check: {detail}")
            await asyncio.sleep(pause)
            pause = min(5.0, pause * 2)
    finally:
        ep.key_check_ended()
