"""The output record: one line of ``results.jsonl`` per task, built by the worker (whole, or as a head and a tail
around an endpoint's large body)."""

from __future__ import annotations

import os
from typing import Any

import orjson


def record_id() -> str:
    """A record's ``id``, as OpenAI's Batch output has it: ``batch_req_`` and 24 random hex digits (unique per
    record; a task written again after a crash gets a new one)."""
    return "batch_req_" + os.urandom(12).hex()


def record_error(error: dict[str, str] | None) -> dict[str, Any] | None:
    """The record's ``error``: the server's own code (when it sent one) and message, its type and param (or
    null), and evalsup's code in ``evalsup_code`` (``http_400``, ``timeout_read``, ``stream_cut``, ...)."""
    if error is None:
        return None
    own = error["code"]
    return {"code": error.get("server_code") or own, "message": error.get("message", ""),
            "type": error.get("type"), "param": error.get("param"), "evalsup_code": own}


def output_line(task_id: str, *, status: int | None, request_id: str | None, body: Any,
                error: dict[str, str] | None, metrics: dict[str, Any], metadata: dict[str, Any] | None,
                scores: dict[str, float | None] | None = None, score_errors: dict[str, str] | None = None,
                score_detail: dict[str, Any] | None = None) -> bytes:
    """One line of results.jsonl (OpenAI Batch output format plus metrics and metadata), newline included.

    ``body`` may be an ``orjson.Fragment`` holding the endpoint's raw JSON, so it is not encoded twice.
    """
    rec: dict[str, Any] = {
        "id": record_id(),
        "custom_id": task_id,
        "response": None if status is None else {"status_code": status, "request_id": request_id or None,
                                                  "body": body},
        "error": record_error(error),
        "metrics": metrics,
    }
    if metadata:
        rec["metadata"] = metadata
    if scores is not None:
        rec["scores"] = scores
    if score_errors:
        rec["score_errors"] = score_errors
    if score_detail:  # what a scorer kept beside its score (the judge's reply), by scorer name
        rec["score_detail"] = score_detail
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)


def output_line_around(task_id: str, **fields: Any) -> tuple[bytes, bytes]:
    """The output line for a response whose body is the endpoint's own one-line JSON, as (head, tail): the
    line is head + body + tail, so a large body is written as it came, never copied into a line. ``fields``
    are output_line's, without ``body``."""
    # orjson writes a NUL byte only as the contents of a Fragment (in strings it is escaped as \u0000)
    head, _, tail = output_line(task_id, body=orjson.Fragment(b"\0"), **fields).partition(b"\0")
    return head, tail
