"""Anthropic's Message Batches API, as the mock serves it (issue 31 item 4).

``POST /v1/messages/batches`` (``{"requests": [{custom_id, params}]}``), ``POST /v1/messages`` (online: a
--batch-fallback online attempt), ``GET /v1/messages/batches``
(newest first, ``after_id``/``before_id``/``limit`` pages), ``GET /v1/messages/batches/{id}``, ``POST
/v1/messages/batches/{id}/cancel``, ``GET /v1/messages/batches/{id}/results`` (the batch's ``results_url``).
The shapes are the anthropic SDK's ``MessageBatch``, ``MessageBatchIndividualResponse`` and ``Message``
(tests/integration/test_anthropic_batches.py checks them with its types). Calls need the key (``x-api-key``,
or a Bearer Authorization as newer SDKs send it) and ``anthropic-version`` (401 and 400 without); errors are
Anthropic's ``{"type": "error", "error": {"type", "message"}}``. With the mock's --api-key, give
--api-key-header x-api-key too (the /v1 wrapper checks the key in that header first).

A batch walks Anthropic's states: in_progress -> (canceling ->) ended. Each request is answered by the mock's
own /v1/chat/completions (its params translated back: system, stop_sequences, ``mock`` knobs), so faults and
answers are those of an online request; the answer is then written as a Message (text block, stop_reason,
usage input/output tokens), an error as an ``errored`` result with Anthropic's error type. Results come in an
order of their own (seeded). The knobs are the OpenAI batches' (``mock/batches.py``, the same counters):
``batch_step_ms``, ``batch_finalize_ms``, ``batch_retrieve_500``, ``batch_expire`` (the next N batches end
after half of their requests: the rest ``expired``), ``batch_fail_validation`` (the next N creates answer
400), ``batch_queue_full`` (the next N creates answer 429 rate_limit_error).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from evalsup.mock.batches import LINE_CONCURRENCY, WINDOW_S, BatchStore
from evalsup.mock.batches import STORE as BATCH_STORE
from evalsup.mock.call import Call
from evalsup.mock.state import STATE, json_response, new_id

_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               504: "timeout_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def a_error(status: int, message: str) -> web.Response:
    """An error as Anthropic answers one."""
    return json_response({"type": "error", "error": {"type": error_type(status), "message": message},
                          "request_id": new_id("req_")}, status=status)


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


@dataclass
class MessageBatch:
    obj: dict[str, Any]
    key: str  # the create call's x-api-key, for the requests to itself
    origin: str
    results: bytes = b""
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None


MESSAGE_BATCHES: web.AppKey[dict[str, MessageBatch]] = web.AppKey("evalsup_mock_message_batches", dict)


def _store(request: web.Request) -> BatchStore:
    store = request.app[BATCH_STORE]
    store.arm(request.app[STATE].cfg)
    return store


def _refused(request: web.Request) -> web.Response | None:
    """Anthropic's headers: the API version and the key, as x-api-key (or, as newer SDKs send it, a Bearer
    Authorization); the mock's --api-key, when it has one."""
    if not request.headers.get("anthropic-version"):
        return a_error(400, "anthropic-version: header is required")
    key = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
    want = request.app[STATE].cfg.api_key
    if not key or (want is not None and key != want):
        return a_error(401, "x-api-key header is required" if not key else "invalid x-api-key")
    return None


def _valid(body: Any) -> str | None:
    """Why a create's body is refused (as Anthropic refuses it, before any request runs), or None."""
    reqs = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(reqs, list) or not reqs:
        return "requests: Field required (a non-empty list)"
    seen: set[str] = set()
    for i, r in enumerate(reqs):
        cid = r.get("custom_id") if isinstance(r, dict) else None
        if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
            return f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if cid in seen:
            return f"requests.{i}.custom_id: {cid!r} is not unique in the batch"
        seen.add(cid)
        p = r.get("params")
        if not isinstance(p, dict):
            return f"requests.{i}.params: Field required"
        for name, kind in (("model", str), ("max_tokens", int), ("messages", list)):
            if not isinstance(p.get(name), kind):
                return f"requests.{i}.params.{name}: Field required"
    return None


def _batch_obj(bid: str, n: int, origin: str) -> dict[str, Any]:
    now = time.time()
    return {"id": bid, "type": "message_batch", "processing_status": "in_progress",
            "request_counts": {"processing": n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
            "ended_at": None, "created_at": rfc3339(now), "expires_at": rfc3339(now + WINDOW_S),
            "cancel_initiated_at": None, "archived_at": None, "results_url": None}


async def create(call: Call) -> web.StreamResponse:
    request = call.request
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return a_error(400, "The request body is not valid JSON.")
    problem = _valid(body)
    if problem is not None:
        return a_error(400, problem)
    store = _store(request)
    if store.fail_validation > 0:
        store.fail_validation -= 1
        return a_error(400, "The batch failed validation (mock).")
    if store.queue_full > 0:
        store.queue_full -= 1
        return a_error(429, "Number of batch requests in the queue exceeds your rate limit (mock).")
    origin = f"http://127.0.0.1:{request.url.port}"
    bid = new_id("msgbatch_")
    key = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
    entry = MessageBatch(_batch_obj(bid, len(body["requests"]), origin), key, origin)
    request.app[MESSAGE_BATCHES][bid] = entry
    expire = store.expire > 0
    store.expire -= int(expire)
    entry.runner = asyncio.create_task(_run(request.app, entry, body["requests"], expire))
    return json_response(entry.obj)


async def list_batches(call: Call) -> web.StreamResponse:
    request = call.request
    refused = _refused(request)
    if refused is not None:
        return refused
    q = request.query
    try:
        limit = max(1, min(1000, int(q.get("limit", "20"))))
    except ValueError:
        return a_error(400, "limit: Input should be a valid integer")
    held: dict[str, MessageBatch] = request.app[MESSAGE_BATCHES]
    ids = list(reversed(list(held)))  # newest first, as Anthropic lists them
    if q.get("after_id") is not None:
        after = q["after_id"]
        ids = ids[ids.index(after) + 1:] if after in ids else []
    elif q.get("before_id") is not None:
        before = q["before_id"]
        ids = ids[:ids.index(before)][-limit:] if before in ids else []
    page = ids[:limit]
    return json_response({"data": [request.app[MESSAGE_BATCHES][i].obj for i in page],
                          "first_id": page[0] if page else None, "last_id": page[-1] if page else None,
                          "has_more": len(ids) > limit})


def _entry(request: web.Request) -> MessageBatch | web.Response:
    refused = _refused(request)
    if refused is not None:
        return refused
    entry = request.app[MESSAGE_BATCHES].get(request.match_info["batch_id"])
    if entry is None:
        return a_error(404, f"message_batch {request.match_info['batch_id']} not found")
    return entry


async def get_batch(call: Call) -> web.StreamResponse:
    store = _store(call.request)
    if store.retrieve_500 > 0:
        store.retrieve_500 -= 1
        return a_error(500, "Internal server error (mock).")
    got = _entry(call.request)
    return got if isinstance(got, web.Response) else json_response(got.obj)


async def cancel(call: Call) -> web.StreamResponse:
    got = _entry(call.request)
    if isinstance(got, web.Response):
        return got
    obj = got.obj
    if obj["processing_status"] == "in_progress":
        obj["processing_status"], obj["cancel_initiated_at"] = "canceling", rfc3339(time.time())
        got.cancel.set()
    return json_response(obj)


async def results(call: Call) -> web.StreamResponse:
    got = _entry(call.request)
    if isinstance(got, web.Response):
        return got
    if got.obj["processing_status"] != "ended":
        return a_error(400, f"Message batch {got.obj['id']} has not finished processing")
    return web.Response(body=got.results, content_type="application/x-jsonl")


def chat_body(params: dict[str, Any]) -> dict[str, Any]:
    """A Messages request as the mock's chat completions take it (what the mock's answer depends on)."""
    messages: list[dict[str, Any]] = []
    system = params.get("system")
    if isinstance(system, list):
        system = "".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    if system:
        messages.append({"role": "system", "content": system})
    for m in params.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "text", "text": b.get("text", "")} if b.get("type") == "text"
                       else {"type": "image_url", "image_url": {"url": "data:,"}} for b in content]
        messages.append({"role": m.get("role"), "content": content})
    body: dict[str, Any] = {"model": params.get("model"), "messages": messages, "max_tokens": params.get("max_tokens")}
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("stop_sequences", "stop"),
                     ("mock", "mock")):
        if src in params:
            body[dst] = params[src]
    return body


def as_message(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as Anthropic's Message."""
    choice = (chat.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    usage = chat.get("usage") or {}
    return {"id": "msg_" + str(chat.get("id", new_id(""))).removeprefix("chatcmpl-"), "type": "message",
            "role": "assistant", "model": chat.get("model"), "content": [{"type": "text", "text": text}],
            "stop_reason": STOP_REASONS.get(str(choice.get("finish_reason")), "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0),
                      "output_tokens": int(usage.get("completion_tokens") or 0)}}


async def _message(session: aiohttp.ClientSession, origin: str, key: str,
                   params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One Messages request answered by the mock's own chat completions: (status, a Message or an error)."""
    async with session.post(origin + "/v1/chat/completions", data=orjson.dumps(chat_body(params)),
                            headers={"Authorization": f"Bearer {key}", "x-api-key": key,
                                     "Content-Type": "application/json"}) as r:
        raw = await r.read()
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if r.status == 200 and isinstance(body, dict) and body.get("choices"):
        return 200, as_message(body)
    status = r.status if r.status != 200 else 500
    err = body.get("error") if isinstance(body, dict) else None
    message = str(err.get("message")) if isinstance(err, dict) and err.get("message") else f"Mock error {status}."
    return status, {"type": "error", "error": {"type": error_type(status), "message": message},
                    "request_id": r.headers.get("x-request-id")}


async def _answer(session: aiohttp.ClientSession, entry: MessageBatch, req: dict[str, Any]) -> dict[str, Any]:
    status, got = await _message(session, entry.origin, entry.key, req["params"])
    if status == 200:
        return {"custom_id": req["custom_id"], "result": {"type": "succeeded", "message": got}}
    return {"custom_id": req["custom_id"], "result": {"type": "errored", "error": got}}


async def messages(call: Call) -> web.StreamResponse:
    """``POST /v1/messages``, online (a --batch-fallback online attempt): the same answer a batch gives."""
    request = call.request
    refused = _refused(request)
    if refused is not None:
        return refused
    try:
        params = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return a_error(400, "The request body is not valid JSON.")
    problem = _valid({"requests": [{"custom_id": "online", "params": params}]})
    if problem is not None:
        return a_error(400, problem.removeprefix("requests.0.params."))
    key = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
    async with aiohttp.ClientSession() as session:
        status, got = await _message(session, f"http://127.0.0.1:{request.url.port}", key, params)
    return json_response(got, status=status, headers={"request-id": new_id("req_")})


async def _run(app: web.Application, entry: MessageBatch, reqs: list[dict[str, Any]], expire: bool) -> None:
    """The batch's life: in_progress (each request answered), then ended (or canceling, then ended)."""
    obj = entry.obj
    counts = obj["request_counts"]

    def stay() -> float:
        return app[STATE].cfg.batch_step_ms / 1000

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(entry.cancel.wait(), stay())
    out: list[dict[str, Any]] = []
    todo = reqs[: len(reqs) // 2] if expire else reqs
    sem = asyncio.Semaphore(LINE_CONCURRENCY)
    async with aiohttp.ClientSession() as session:

        async def one(req: dict[str, Any]) -> None:
            async with sem:
                if entry.cancel.is_set():
                    return
                got = await _answer(session, entry, req)
                out.append(got)
                counts["processing"] -= 1
                counts["succeeded" if got["result"]["type"] == "succeeded" else "errored"] += 1

        await asyncio.gather(*(one(x) for x in todo))
    if not entry.cancel.is_set():
        await asyncio.sleep(stay() + app[STATE].cfg.batch_finalize_ms / 1000)
    done = {x["custom_id"] for x in out}
    left = "canceled" if entry.cancel.is_set() else "expired"
    for req in reqs:
        if req["custom_id"] not in done:
            out.append({"custom_id": req["custom_id"], "result": {"type": left}})
            counts["processing"] -= 1
            counts[left] += 1
    random.Random(app[STATE].cfg.seed ^ len(app[MESSAGE_BATCHES])).shuffle(out)  # never the input's order
    entry.results = b"".join(orjson.dumps(x) + b"\n" for x in out)
    obj.update(processing_status="ended", ended_at=rfc3339(time.time()),
               results_url=f"{entry.origin}/v1/messages/batches/{obj['id']}/results")


def add_routes(app: web.Application, v1: Any) -> None:
    """The Message Batches routes (before the /v1 catch-all; after the OpenAI batches', whose store it shares)."""
    app[MESSAGE_BATCHES] = {}
    r = app.router
    r.add_post("/v1/messages", v1(messages))
    r.add_post("/v1/messages/batches", v1(create))
    r.add_get("/v1/messages/batches", v1(list_batches), allow_head=False)
    r.add_get("/v1/messages/batches/{batch_id}", v1(get_batch), allow_head=False)
    r.add_post("/v1/messages/batches/{batch_id}/cancel", v1(cancel))
    r.add_get("/v1/messages/batches/{batch_id}/results", v1(results), allow_head=False)
