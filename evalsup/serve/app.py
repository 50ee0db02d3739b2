"""The HTTP side of `evalsup serve` (aiohttp): OpenAI's Files and Batches routes, /health, /metrics, the keys'
check. Every answer and error in OpenAI's shape (``shapes.py``); another key's object answers 404, as if it did not
exist. An upload is streamed to a temp file under tmp/ with the size and line limits counted as it comes (over
either: 413, the temp file removed, the rest of the body read and dropped so the client reads the answer), then
fsynced and recorded: visible only once whole."""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import BodyPartReader, web

from evalsup.serve import shapes
from evalsup.serve.auth import bearer, owner_of
from evalsup.serve.runner import Batches
from evalsup.tasks.requests import BATCH_URLS

CHUNK = 1 << 20
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 200 << 20  # OpenAI's 200 MB
    max_lines: int = 1_000_000


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.body = status, shapes.error_body(message, code, param, type_)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _not_found(kind: str, oid: str, param: str = "id") -> ApiError:
    return ApiError(404, f"No such {kind}: {oid}", None, param)


def _page(request: web.Request, items: list[dict[str, Any]], most: int, kind: str) -> web.Response:
    """One page of a list (``after``, ``limit`` at most ``most``); an ``after`` that names nothing of the caller's
    is that id's 404."""
    page = shapes.list_page(items, request.query.get("after"), _limit(request, most))
    if page is None:
        raise _not_found(kind, request.query["after"], "after")
    return _json(page)


class Api:
    def __init__(self, batches: Batches, owners: frozenset[str] | None, limits: Limits) -> None:
        self.batches, self.store, self.owners, self.limits = batches, batches.store, owners, limits

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.errors_and_keys])
        app.add_routes([
            web.get("/health", self.health), web.get("/metrics", self.metrics),
            web.post("/v1/files", self.upload), web.get("/v1/files", self.list_files),
            web.get("/v1/files/{file_id}", self.get_file), web.delete("/v1/files/{file_id}", self.delete_file),
            web.get("/v1/files/{file_id}/content", self.file_content),
            web.post("/v1/batches", self.create_batch), web.get("/v1/batches", self.list_batches),
            web.get("/v1/batches/{batch_id}", self.get_batch),
            web.post("/v1/batches/{batch_id}/cancel", self.cancel_batch),
            web.get("/v1/models", self.models), web.get("/v1/models/{model:.+}", self.models),
        ])
        return app

    @web.middleware
    async def errors_and_keys(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path.startswith("/v1/"):
                request["owner"] = self._owner(request)
            return await handler(request)
        except ApiError as e:
            return _json(e.body, e.status)
        except web.HTTPNotFound:
            return _json(shapes.error_body(f"Unknown request URL: {request.method} {request.path}",
                                           "unknown_url"), 404)
        except web.HTTPMethodNotAllowed:
            return _json(shapes.error_body(f"Method {request.method} not allowed on {request.path}",
                                           "method_not_allowed"), 405)

    def _owner(self, request: web.Request) -> str:
        if self.owners is None:
            return ""
        key = bearer(request.headers.get("Authorization"))
        if key is None:
            raise ApiError(401, "You didn't provide an API key (Authorization: Bearer KEY).", "missing_api_key")
        owner = owner_of(key)
        if owner not in self.owners:
            raise ApiError(401, "Incorrect API key provided.", "invalid_api_key")
        return owner

    # health and metrics
    async def health(self, request: web.Request) -> web.Response:
        if self.batches.stopping:
            return _json({"status": "stopping"}, 503)
        return _json({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        by_state: dict[str, int] = {}
        done = failed = 0
        for rec in self.store.batches.values():
            by_state[rec.batch["status"]] = by_state.get(rec.batch["status"], 0) + 1
            done += rec.batch["request_counts"]["completed"]
            failed += rec.batch["request_counts"]["failed"]
        lines = ["# HELP evalsup_serve_batches Batches by state.", "# TYPE evalsup_serve_batches gauge"]
        lines += [f'evalsup_serve_batches{{state="{s}"}} {by_state.get(s, 0)}'
                  for s in (shapes.VALIDATING, shapes.IN_PROGRESS, shapes.FINALIZING, shapes.COMPLETED,
                            shapes.FAILED, shapes.EXPIRED, shapes.CANCELLING, shapes.CANCELLED)]
        lines += ["# HELP evalsup_serve_requests Requests of the batches held, by result.",
                  "# TYPE evalsup_serve_requests gauge",
                  f'evalsup_serve_requests{{result="completed"}} {done}',
                  f'evalsup_serve_requests{{result="failed"}} {failed}',
                  "# HELP evalsup_serve_files Files held.", "# TYPE evalsup_serve_files gauge",
                  f"evalsup_serve_files {len(self.store.files)}",
                  "# HELP evalsup_serve_running_batches Batches whose run is going.",
                  "# TYPE evalsup_serve_running_batches gauge",
                  f"evalsup_serve_running_batches {len(self.batches.running)}"]
        ended = [r for r in self.store.batches.values() if isinstance(r.extra.get("latency_s"), dict)]
        if ended:  # the upstream's latency over the last batch that ended
            last = max(ended, key=lambda r: r.batch.get("completed_at") or r.batch.get("cancelled_at")
                       or r.batch.get("expired_at") or 0)
            lines += ["# HELP evalsup_serve_upstream_latency_seconds The upstream's answer latency over the "
                      "requests of the batch that ended last.", "# TYPE evalsup_serve_upstream_latency_seconds gauge"]
            lines += [f'evalsup_serve_upstream_latency_seconds{{quantile="{q}"}} {last.extra["latency_s"][k]}'
                      for q, k in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")) if k in last.extra["latency_s"]]
        lines.append("")
        return web.Response(text="\n".join(lines), content_type="text/plain")

    def _open_for_new_work(self) -> None:
        """A new upload or batch while the server drains is refused (the client tries again after the restart)."""
        if self.batches.stopping:
            raise ApiError(503, "The server is stopping; try again shortly.", "server_stopping",
                           type_="server_error")

    @staticmethod
    def _owned(request: web.Request, table: dict[str, Any], key: str, pattern: Any, kind: str) -> Any:
        """The record the route's id names, when it is well formed and the caller's key owns it; else the 404 of
        an id that does not exist (another key's ids are not revealed)."""
        oid = request.match_info[key]
        rec = table.get(oid) if pattern.match(oid) else None
        if rec is None or rec.owner != request["owner"]:
            raise _not_found(kind, oid)
        return rec

    # files
    def _file(self, request: web.Request) -> dict[str, Any]:
        return self._owned(request, self.store.files, "file_id", shapes.FILE_ID, "File").file  # type: ignore[no-any-return]

    async def upload(self, request: web.Request) -> web.Response:
        self._open_for_new_work()
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "Upload the file as multipart/form-data with fields purpose and file.",
                           "invalid_request")
        reader = await request.multipart()
        purpose: str | None = None
        path: Path | None = None
        filename = "upload.jsonl"
        size = 0
        try:
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "purpose":
                    purpose = (await part.text()).strip()
                elif part.name == "file" and path is None:
                    filename = os.path.basename(part.filename or filename) or filename
                    path = self.store.upload_path()
                    size = await self._receive(part, path, reader)
                else:
                    await part.release()
            if path is None:
                raise ApiError(400, "Missing the file field.", "missing_required_parameter", "file")
            if purpose != "batch":
                raise ApiError(400, f"purpose {purpose!r} is not supported: only 'batch'.", "invalid_value",
                               "purpose")
            _first_line_is_json(path)
            now = int(self.batches.clock())
            file = shapes.file_object(shapes.new_file_id(), size=size, created_at=now, filename=filename,
                                      purpose="batch", expires_at=now + self.batches.settings.retention_s)
            self.store.add_file(request["owner"], file, path)
            path = None
            return _json(file)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise ApiError(507, "The server's disk is full: the file was not stored.", "insufficient_storage",
                               type_="server_error") from None
            raise
        finally:
            if path is not None:
                path.unlink(missing_ok=True)

    async def _receive(self, part: BodyPartReader, path: Path, reader: Any) -> int:
        size = lines = 0
        last = b"\n"
        with open(path, "wb") as f:
            while chunk := await part.read_chunk(CHUNK):
                size += len(chunk)
                lines += chunk.count(b"\n")
                last = chunk[-1:]
                if size > self.limits.max_bytes or lines > self.limits.max_lines:
                    await _drop_rest(part, reader)
                    what = (f"{self.limits.max_bytes / (1 << 20):g} MB" if size > self.limits.max_bytes
                            else f"{self.limits.max_lines:,} lines")
                    raise ApiError(413, f"The file is larger than the server's limit of {what}.", "file_too_large",
                                   "file")
                try:
                    f.write(chunk)
                except OSError:  # the disk is full: answer once the client has sent it all
                    await _drop_rest(part, reader)
                    raise
            if last != b"\n" and lines + 1 > self.limits.max_lines:  # the last line has no newline
                raise ApiError(413, f"The file is larger than the server's limit of {self.limits.max_lines:,} "
                                    "lines.", "file_too_large", "file")
            f.flush()
            os.fsync(f.fileno())
        if size == 0:
            raise ApiError(400, "The file is empty.", "empty_file", "file")
        return size

    async def list_files(self, request: web.Request) -> web.Response:
        purpose = request.query.get("purpose")
        items = [f for f in self.store.owned_files(request["owner"]) if purpose is None or f["purpose"] == purpose]
        asc = request.query.get("order") == "asc"
        items.sort(key=lambda f: (f["created_at"], f["id"]), reverse=not asc)
        return _page(request, items, 10_000, "File")

    async def get_file(self, request: web.Request) -> web.Response:
        return _json(self._file(request))

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        file = self._file(request)
        return web.FileResponse(self.store.data_path(file["id"]),
                                headers={"Content-Type": "application/octet-stream"})

    async def delete_file(self, request: web.Request) -> web.Response:
        file = self._file(request)
        self.store.delete_file(file["id"])
        return _json({"id": file["id"], "object": "file", "deleted": True})

    # models
    async def models(self, request: web.Request) -> web.Response:
        """The first upstream's model list (or one model), as it answers: what a batch may name. Clients
        (evalsup's own connection check among them) ask it before they send a batch."""
        s = self.batches.settings
        url = s.upstreams[0].rstrip("/") + request.path.removeprefix("/v1")
        key = os.environ.get(s.api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session, \
                    session.get(url, headers=headers) as r:
                body = await r.read()
                return web.Response(body=body, status=r.status, content_type="application/json")
        except (aiohttp.ClientError, TimeoutError):
            raise ApiError(502, "The upstream did not answer its model list.", "upstream_unavailable",
                           type_="server_error") from None

    # batches
    def _batch(self, request: web.Request) -> dict[str, Any]:
        return self._owned(request, self.store.batches, "batch_id", shapes.BATCH_ID, "Batch").batch  # type: ignore[no-any-return]

    async def create_batch(self, request: web.Request) -> web.Response:
        self._open_for_new_work()
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise ApiError(400, "The body is not valid JSON.", "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "The body must be a JSON object.", "invalid_request")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str) or not body[name]:
                raise ApiError(400, f"Missing required parameter: '{name}'.", "missing_required_parameter", name)
        if body["endpoint"] not in BATCH_URLS:
            raise ApiError(400, f"endpoint {body['endpoint']!r} is not supported: one of {', '.join(BATCH_URLS)}.",
                           "invalid_value", "endpoint")
        if shapes.window_seconds(body["completion_window"]) is None:
            raise ApiError(400, f"completion_window {body['completion_window']!r} is not one: e.g. '24h'.",
                           "invalid_value", "completion_window")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and all(
                isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                for k, v in metadata.items())):
            raise ApiError(400, "metadata: at most 16 pairs of strings (keys up to 64, values up to 512 "
                                "characters).", "invalid_value", "metadata")
        fid = body["input_file_id"]
        rec = self.store.files.get(fid) if shapes.FILE_ID.match(fid) else None
        if rec is None or rec.owner != request["owner"]:
            raise _not_found("File", fid, "input_file_id")
        if rec.file["purpose"] != "batch":
            raise ApiError(400, f"File {fid} has purpose {rec.file['purpose']!r}, not 'batch'.", "invalid_value",
                           "input_file_id")
        batch = self.batches.create(request["owner"], fid, body["endpoint"], body["completion_window"], metadata)
        return _json(batch)

    async def list_batches(self, request: web.Request) -> web.Response:
        items = sorted(self.store.owned_batches(request["owner"]), key=lambda b: (b["created_at"], b["id"]),
                       reverse=True)
        return _page(request, items, 100, "Batch")

    async def get_batch(self, request: web.Request) -> web.Response:
        return _json(self._batch(request))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request)
        return _json(self.batches.cancel(batch["id"]))


def _limit(request: web.Request, most: int) -> int:
    raw = request.query.get("limit", str(shapes.DEFAULT_LIST_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(400, f"limit must be an integer from 1 to {most}.", "invalid_value", "limit")
    return int(raw)


DROP_MOST = 1 << 30  # past this much more of a refused body, the connection is closed instead


async def _drop_rest(part: BodyPartReader, reader: Any) -> None:
    """Read and drop what is left of the request's body (up to DROP_MOST), so the client reads the answer
    instead of a reset."""
    dropped = 0
    while dropped <= DROP_MOST and (chunk := await part.read_chunk(CHUNK)):
        dropped += len(chunk)
    if dropped > DROP_MOST:
        return
    while (nxt := await reader.next()) is not None:
        await nxt.release()


def _first_line_is_json(path: Path) -> None:
    """A batch file is JSONL: its first line is a JSON object (every line is checked when a batch runs it)."""
    with open(path, "rb") as f:
        first = f.readline(16 << 20)
    try:
        ok = isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        ok = False
    if not ok:
        raise ApiError(400, "The file is not JSONL: its first line is not a JSON object.", "invalid_file_format",
                       "file")
