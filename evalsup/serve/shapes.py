"""The OpenAI objects and errors `evalsup serve` answers with, in OpenAI's shape (checked in the tests against the
openai SDK's types): a file, a batch, a list page, an error body; ids generated, never paths. Pure: no I/O, time
passed in."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")
# OpenAI's batch states (openai.types.Batch.status)
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = "validating", "in_progress", "finalizing", "completed"
FAILED, EXPIRED, CANCELLING, CANCELLED = "failed", "expired", "cancelling", "cancelled"
ENDED = frozenset((COMPLETED, FAILED, EXPIRED, CANCELLED))
WINDOW = re.compile(r"^(\d{1,6})([smh])$")  # OpenAI accepts "24h"; serve any N s/m/h (a short one for tests)
DEFAULT_LIST_LIMIT = 20


def new_file_id() -> str:
    return "file-" + os.urandom(12).hex()


def new_batch_id() -> str:
    return "batch_" + os.urandom(12).hex()


def window_seconds(window: str) -> int | None:
    """A completion_window in seconds ("24h" -> 86400), None when it is not one."""
    m = WINDOW.match(window)
    if m is None or int(m.group(1)) <= 0:
        return None
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]


def error_body(message: str, code: str | None = None, param: str | None = None,
               type_: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error body: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def file_object(file_id: str, *, size: int, created_at: int, filename: str, purpose: str,
                expires_at: int | None) -> dict[str, Any]:
    """openai.types.FileObject, every field OpenAI fills (status "processed": the upload is complete)."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at, "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": expires_at, "status_details": None}


def batch_object(batch_id: str, *, input_file_id: str, endpoint: str, completion_window: str, created_at: int,
                 expires_at: int, metadata: dict[str, str] | None, model: str | None = None) -> dict[str, Any]:
    """openai.types.Batch as created: validating, no counts yet."""
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "model": model, "errors": None,
            "input_file_id": input_file_id, "completion_window": completion_window, "status": VALIDATING,
            "output_file_id": None, "error_file_id": None, "created_at": created_at, "in_progress_at": None,
            "expires_at": expires_at, "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "usage": None, "metadata": metadata}


_STAMP = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at", COMPLETED: "completed_at",
          FAILED: "failed_at", EXPIRED: "expired_at", CANCELLING: "cancelling_at", CANCELLED: "cancelled_at"}


def moved(batch: dict[str, Any], status: str, now: int) -> dict[str, Any]:
    """The batch in ``status``, its time stamp for that state set (once)."""
    out = {**batch, "status": status}
    stamp = _STAMP.get(status)
    if stamp is not None and out.get(stamp) is None:
        out[stamp] = now
    return out


def batch_errors(errors: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A failed batch's ``errors``: {"object": "list", "data": [{code, message, param, line}]}."""
    return {"object": "list", "data": list(errors)}


def list_page(items: Sequence[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any] | None:
    """One page of a list (newest first, as ``items`` are): the items after the id ``after``, at most
    ``limit``, with has_more, first_id and last_id. None when ``after`` names no item."""
    start = 0
    if after:
        ids = [i["id"] for i in items]
        if after not in ids:
            return None
        start = ids.index(after) + 1
    data = list(items[start:start + limit])
    return {"object": "list", "data": data, "has_more": start + limit < len(items),
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}
