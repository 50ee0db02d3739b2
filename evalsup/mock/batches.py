"""OpenAI's Files and Batches APIs, as the mock serves them (issue 31).

``POST /v1/files`` (multipart, purpose=batch), ``GET /v1/files``, ``GET /v1/files/{id}``, ``GET
/v1/files/{id}/content``; ``POST /v1/batches`` (input_file_id, endpoint, completion_window, metadata), ``GET
/v1/batches`` (``after``/``limit`` pages, newest first), ``GET /v1/batches/{id}``, ``POST
/v1/batches/{id}/cancel``. The shapes are openai's ``FileObject`` and ``Batch`` (tests/integration/test_batch_mock.py
checks them with the SDK's own types).

A batch walks the real state machine: validating -> in_progress -> finalizing -> completed; failed (with
``errors``) when its input is not a batch file or the ``batch_fail_validation`` knob says so; expired part-way
(``batch_expire``: the next N batches stop after half of their lines; the rest are ``batch_expired`` lines in
the error file); cancelling -> cancelled on a cancel (what was answered is in the output file). Each line is
answered by the mock's own /v1 handlers (a request to itself on 127.0.0.1 with the batch's credentials), so
faults, ``mock`` objects and answers are exactly those of an online request; answers that are not 200 go to
the error file, as OpenAI's do. The output is written in an order of its own (seeded), not the input's.
Knobs (``MockConfig``): ``batch_step_ms`` (each state's stay), ``batch_finalize_ms`` (a slow finalize),
``batch_retrieve_500`` (the next N ``GET /v1/batches/{id}`` answer 500), ``batch_expire``,
``batch_fail_validation``, ``batch_queue_full`` (the next N fail with ``token_limit_exceeded``),
``batch_files_unlisted`` and ``batch_batches_unlisted`` (``GET /v1/files``, ``GET /v1/batches`` answer 405, as
a gateway without the route).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from evalsup.mock.call import Call
from evalsup.mock.state import STATE, error, json_response, new_id

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
WINDOW_S = 24 * 3600
LINE_CONCURRENCY = 32


@dataclass
class FileEntry:
    obj: dict[str, Any]
    data: bytes


@dataclass
class BatchEntry:
    obj: dict[str, Any]
    auth: dict[str, str]  # the create call's credentials, for the requests to itself
    origin: str
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None


@dataclass
class BatchStore:
    """Every file and batch of one mock app (in memory, in creation order)."""

    files: dict[str, FileEntry] = field(default_factory=dict)
    batches: dict[str, BatchEntry] = field(default_factory=dict)
    retrieve_500: int = 0  # used up from the knob as they are answered
    expire: int = 0
    fail_validation: int = 0
    queue_full: int = 0
    seen: tuple[int, int, int, int] = (0, 0, 0, 0)  # the knobs' values last read (a new value arms them again)

    def arm(self, cfg: Any) -> None:
        now = (cfg.batch_retrieve_500, cfg.batch_expire, cfg.batch_fail_validation, cfg.batch_queue_full)
        if now != self.seen:
            self.retrieve_500, self.expire, self.fail_validation, self.queue_full = now
            self.seen = now


STORE: web.AppKey[BatchStore] = web.AppKey("evalsup_mock_batches", BatchStore)


def _store(request: web.Request) -> BatchStore:
    store = request.app[STORE]
    store.arm(request.app[STATE].cfg)
    return store


def _file_obj(fid: str, nbytes: int, filename: str, purpose: str) -> dict[str, Any]:
    return {"id": fid, "object": "file", "bytes": nbytes, "created_at": int(time.time()), "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None}


def _add_file(store: BatchStore, data: bytes, filename: str, purpose: str) -> FileEntry:
    fid = new_id("file-")
    entry = FileEntry(_file_obj(fid, len(data), filename, purpose), data)
    store.files[fid] = entry
    return entry


async def upload_file(call: Call) -> web.StreamResponse:
    request = call.request
    if not request.content_type.startswith("multipart/"):
        return error(request, 400, "Expected a multipart/form-data upload.")
    purpose, filename, data = None, None, None
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            break
        if not isinstance(part, aiohttp.BodyPartReader):
            continue
        if part.name == "purpose":
            purpose = (await part.read()).decode()
        elif part.name == "file":
            filename = part.filename or "upload.jsonl"
            data = bytes(await part.read())
    if data is None:
        return error(request, 400, "Missing required parameter: 'file'.", param="file")
    if purpose not in ("batch", "user_data", "fine-tune", "assistants", "vision"):
        return error(request, 400, f"Invalid value for 'purpose': {purpose!r}.", param="purpose")
    entry = _add_file(_store(request), data, filename or "upload.jsonl", purpose)
    return json_response(entry.obj)


async def list_files(call: Call) -> web.StreamResponse:
    if call.request.app[STATE].cfg.batch_files_unlisted:  # a gateway that passes uploads on but lists nothing
        return error(call.request, 405, "Method Not Allowed.")
    store = _store(call.request)
    purpose = call.request.query.get("purpose")
    data = [f.obj for f in reversed(store.files.values()) if purpose is None or f.obj["purpose"] == purpose]
    return json_response({"object": "list", "data": data, "has_more": False})


async def get_file(call: Call) -> web.StreamResponse:
    entry = _store(call.request).files.get(call.request.match_info["file_id"])
    if entry is None:
        return error(call.request, 404, "No such File object.", code="not_found")
    return json_response(entry.obj)


async def file_content(call: Call) -> web.StreamResponse:
    entry = _store(call.request).files.get(call.request.match_info["file_id"])
    if entry is None:
        return error(call.request, 404, "No such File object.", code="not_found")
    return web.Response(body=entry.data, content_type="application/octet-stream")


def _batch_obj(bid: str, body: dict[str, Any], total: int) -> dict[str, Any]:
    now = int(time.time())
    return {"id": bid, "object": "batch", "endpoint": body["endpoint"], "errors": None,
            "input_file_id": body["input_file_id"], "completion_window": body["completion_window"],
            "status": "validating", "output_file_id": None, "error_file_id": None, "created_at": now,
            "in_progress_at": None, "expires_at": now + WINDOW_S, "finalizing_at": None, "completed_at": None,
            "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": total, "completed": 0, "failed": 0}, "metadata": body.get("metadata"),
            "model": None, "usage": None}


async def create_batch(call: Call) -> web.StreamResponse:
    request = call.request
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return error(request, 400, "We could not parse the JSON body of your request.")
    if not isinstance(body, dict):
        return error(request, 400, "The request body must be a JSON object.")
    store = _store(request)
    for name in ("input_file_id", "endpoint", "completion_window"):
        if not isinstance(body.get(name), str):
            return error(request, 400, f"Missing required parameter: '{name}'.", param=name)
    if body["endpoint"] not in ENDPOINTS:
        return error(request, 400, f"Invalid value for 'endpoint': {body['endpoint']!r}.", param="endpoint")
    if body["completion_window"] != "24h":
        return error(request, 400, "Invalid value for 'completion_window': only '24h' is supported.",
                     param="completion_window")
    meta = body.get("metadata")
    if meta is not None and (not isinstance(meta, dict) or len(meta) > 16
                             or not all(isinstance(v, str) and len(v) <= 512 for v in meta.values())):
        return error(request, 400, "Invalid 'metadata': at most 16 string values.", param="metadata")
    entry_file = store.files.get(body["input_file_id"])
    if entry_file is None:
        return error(request, 404, f"No such File object: {body['input_file_id']}.", code="not_found")
    auth = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "api-key")}
    bid = new_id("batch_")
    obj = _batch_obj(bid, body, 0)
    entry = BatchEntry(obj, auth, f"http://127.0.0.1:{request.url.port}")
    store.batches[bid] = entry
    fail: str | None = None
    if store.fail_validation > 0:
        store.fail_validation -= 1
        fail = "invalid_request"
    elif store.queue_full > 0:
        store.queue_full -= 1
        fail = "token_limit_exceeded"
    expire = store.expire > 0
    store.expire -= int(expire)
    entry.runner = asyncio.create_task(_run(request.app, store, entry, entry_file.data, fail, expire))
    return json_response(obj)


async def list_batches(call: Call) -> web.StreamResponse:
    if call.request.app[STATE].cfg.batch_batches_unlisted:
        return error(call.request, 405, "Method Not Allowed.")
    store = _store(call.request)
    q = call.request.query
    try:
        limit = max(1, min(100, int(q.get("limit", "20"))))
    except ValueError:
        return error(call.request, 400, "Invalid value for 'limit'.", param="limit")
    ids = list(reversed(store.batches))  # newest first, as OpenAI lists them
    after = q.get("after")
    if after is not None:
        ids = ids[ids.index(after) + 1:] if after in ids else []
    page = ids[:limit]
    data = [store.batches[i].obj for i in page]
    return json_response({"object": "list", "data": data, "first_id": page[0] if page else None,
                          "last_id": page[-1] if page else None, "has_more": len(ids) > limit})


async def get_batch(call: Call) -> web.StreamResponse:
    store = _store(call.request)
    if store.retrieve_500 > 0:
        store.retrieve_500 -= 1
        return error(call.request, 500)
    entry = store.batches.get(call.request.match_info["batch_id"])
    if entry is None:
        return error(call.request, 404, "No such Batch object.", code="not_found")
    return json_response(entry.obj)


async def cancel_batch(call: Call) -> web.StreamResponse:
    entry = _store(call.request).batches.get(call.request.match_info["batch_id"])
    if entry is None:
        return error(call.request, 404, "No such Batch object.", code="not_found")
    obj = entry.obj
    if obj["status"] in ("validating", "in_progress", "finalizing"):
        obj["status"], obj["cancelling_at"] = "cancelling", int(time.time())
        entry.cancel.set()
    elif obj["status"] != "cancelling" and obj["status"] != "cancelled":
        return error(call.request, 409, f"Cannot cancel a batch with status '{obj['status']}'.")
    return json_response(obj)


def _validate(data: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The batch file's lines, or the errors that fail it (OpenAI's: line numbers from 1)."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            errors.append({"code": "invalid_json_line", "message": "This line is not parseable as valid JSON.",
                           "param": None, "line": n})
            continue
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        if not isinstance(cid, str) or not isinstance(obj.get("body"), dict):
            errors.append({"code": "missing_required_parameter", "message": "custom_id and body are required.",
                           "param": "custom_id", "line": n})
        elif cid in seen:
            errors.append({"code": "duplicate_custom_id", "message": f"The custom_id {cid!r} is not unique.",
                           "param": "custom_id", "line": n})
        elif obj.get("url") != endpoint:
            errors.append({"code": "mismatched_endpoint", "message": f"The url {obj.get('url')!r} does not "
                           f"match the batch's endpoint {endpoint!r}.", "param": "url", "line": n})
        else:
            seen.add(cid)
            lines.append(obj)
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "The input file is empty.", "param": None, "line": None})
    return lines, errors


async def _answer(session: aiohttp.ClientSession, entry: BatchEntry, line: dict[str, Any]) -> dict[str, Any]:
    """One line answered by the mock's own handler: the output line (response set; error null)."""
    async with session.post(entry.origin + line["url"], data=orjson.dumps(line["body"]), headers={
            **entry.auth, "Content-Type": "application/json"}) as r:
        raw = await r.read()
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = {"error": {"message": raw[:200].decode(errors="replace"), "type": "server_error",
                              "param": None, "code": None}}
        return {"id": new_id("batch_req_"), "custom_id": line["custom_id"],
                "response": {"status_code": r.status, "request_id": r.headers.get("x-request-id"), "body": body},
                "error": None}


def _not_run(cid: str, code: str, message: str) -> dict[str, Any]:
    return {"id": new_id("batch_req_"), "custom_id": cid, "response": None,
            "error": {"code": code, "message": message}}


async def _run(app: web.Application, store: BatchStore, entry: BatchEntry, data: bytes, fail: str | None,
               expire: bool) -> None:
    """The batch's life on the provider, from validating to its end."""
    obj = entry.obj
    cfg = app[STATE].cfg

    def stay() -> float:
        return app[STATE].cfg.batch_step_ms / 1000

    async def wait(s: float) -> bool:
        """Sleep s; True when a cancel came meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(entry.cancel.wait(), s)
        return entry.cancel.is_set()

    lines, errors = _validate(data, obj["endpoint"])
    if fail == "invalid_request" and not errors:
        errors = [{"code": fail, "message": "The batch input file failed validation (mock).", "param": None,
                   "line": None}]
    elif fail and not errors:
        errors = [{"code": fail, "message": "Enqueued token limit reached for mock-model (mock).", "param": None,
                   "line": None}]
    obj["request_counts"]["total"] = len(lines)
    cancelled = await wait(stay())
    if errors and not cancelled:
        obj.update(status="failed", failed_at=int(time.time()), errors={"object": "list", "data": errors})
        return
    out: list[dict[str, Any]] = []
    err: list[dict[str, Any]] = []
    counts = obj["request_counts"]
    if not cancelled:
        obj.update(status="in_progress", in_progress_at=int(time.time()))
        todo = lines[: len(lines) // 2] if expire else lines
        sem = asyncio.Semaphore(LINE_CONCURRENCY)
        async with aiohttp.ClientSession() as session:

            async def one(line: dict[str, Any]) -> None:
                async with sem:
                    if entry.cancel.is_set():
                        return
                    got = await _answer(session, entry, line)
                    ok = got["response"]["status_code"] == 200
                    (out if ok else err).append(got)
                    counts["completed" if ok else "failed"] += 1

            await asyncio.gather(*(one(x) for x in todo))
        cancelled = entry.cancel.is_set() or await wait(stay())
    done = {x["custom_id"] for x in out} | {x["custom_id"] for x in err}
    if cancelled:
        for line in lines:
            if line["custom_id"] not in done:
                err.append(_not_run(line["custom_id"], "batch_cancelled", "This request was cancelled."))
    elif expire:
        for line in lines:
            if line["custom_id"] not in done:
                err.append(_not_run(line["custom_id"], "batch_expired", "This request could not be executed "
                                    "before the completion window expired."))
                counts["failed"] += 1
    if not cancelled:
        obj.update(status="finalizing", finalizing_at=int(time.time()))
        await asyncio.sleep(stay() + app[STATE].cfg.batch_finalize_ms / 1000)
    rng = random.Random(cfg.seed ^ len(store.batches))
    rng.shuffle(out)  # the output's order is the provider's, never the input's
    rng.shuffle(err)
    if out:
        obj["output_file_id"] = _add_file(store, b"".join(orjson.dumps(x) + b"\n" for x in out),
                                          "batch_output.jsonl", "batch_output").obj["id"]
    if err:
        obj["error_file_id"] = _add_file(store, b"".join(orjson.dumps(x) + b"\n" for x in err),
                                         "batch_error.jsonl", "batch_output").obj["id"]
    now = int(time.time())
    if cancelled:
        obj.update(status="cancelled", cancelled_at=now)
    elif expire:
        obj.update(status="expired", expired_at=now)
    else:
        obj.update(status="completed", completed_at=now)


def add_routes(app: web.Application, v1: Any) -> None:
    """The Files and Batches routes (before the /v1 catch-all)."""
    app[STORE] = BatchStore()
    r = app.router
    r.add_post("/v1/files", v1(upload_file))
    r.add_get("/v1/files", v1(list_files), allow_head=False)
    r.add_get("/v1/files/{file_id}", v1(get_file), allow_head=False)
    r.add_get("/v1/files/{file_id}/content", v1(file_content), allow_head=False)
    r.add_post("/v1/batches", v1(create_batch))
    r.add_get("/v1/batches", v1(list_batches), allow_head=False)
    r.add_get("/v1/batches/{batch_id}", v1(get_batch), allow_head=False)
    r.add_post("/v1/batches/{batch_id}/cancel", v1(cancel_batch))
