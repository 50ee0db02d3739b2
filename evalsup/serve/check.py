"""A batch's validation (its ``validating`` state): every line of the input file checked as OpenAI checks it
before the first request, so a bad file ends ``failed`` with OpenAI's ``errors`` naming line numbers. What evalsup
run checks too (``tasks.reader.validate``: a JSON object, custom_id, method, url, body), and what a batch adds:
each line's url is the batch's endpoint, no ``stream: true``, each custom_id once.

Duplicate ids are found with ``tasks.idset.IdSet`` (16 bytes an id; a hash match is read again from the file,
so a collision is never called a duplicate)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import validate
from evalsup.tasks.requests import BATCH_URLS

MAX_ERRORS = 100  # the errors a failed batch lists (the first ones)


@dataclass
class Checked:
    total: int = 0  # request lines
    errors: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None  # the first line's body's model


def _error(code: str, message: str, line: int, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(line number from 1, byte offset, line) of each non-blank line."""
    offset = 0
    with open(path, "rb", buffering=1 << 20) as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                yield n, offset, raw
            offset += len(raw)


def id_reader(path: Path) -> Callable[[int], str | None]:
    """``id_at(offset)``: the custom_id of the line at that offset (IdSet's exact check on a hash match)."""

    def id_at(offset: int) -> str | None:
        with open(path, "rb") as f:
            f.seek(offset)
            try:
                obj = orjson.loads(f.readline())
            except orjson.JSONDecodeError:
                return None
        cid = obj.get("custom_id") if isinstance(obj, dict) else None
        return cid if isinstance(cid, str) else None

    return id_at


def check_input(path: Path, endpoint: str, max_line_bytes: int = 16 << 20) -> Checked:
    """Every line of the batch input at ``path`` checked for a batch of ``endpoint``."""
    out = Checked()

    def err(code: str, message: str, line: int, param: str | None = None) -> None:
        if len(out.errors) < MAX_ERRORS:
            out.errors.append(_error(code, message, line, param))

    ids, id_at = IdSet(), id_reader(path)
    for n, offset, raw in lines(path):
        out.total += 1
        if len(raw) > max_line_bytes:
            err("invalid_request", f"line {n} is longer than {max_line_bytes:,} bytes", n)
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            err("invalid_json_line", f"line {n} is not valid JSON", n)
            continue
        if not isinstance(obj, dict) or "custom_id" not in obj:
            err("missing_required_parameter", f"line {n} has no custom_id", n, "custom_id")
            continue
        if not isinstance(obj["custom_id"], str) or not obj["custom_id"]:
            err("invalid_request", f"line {n}: custom_id must be a non-empty string", n, "custom_id")
            continue
        url = obj.get("url")
        if url not in BATCH_URLS:
            err("invalid_url", f"line {n}: url {url!r} is not one of {', '.join(BATCH_URLS)}", n, "url")
            continue
        if url != endpoint:
            err("mismatched_endpoint", f"line {n}: url {url} is not the batch's endpoint {endpoint}", n, "url")
            continue
        try:
            validate(obj)
        except ValueError as e:
            err("invalid_request", f"line {n}: {e}", n)
            continue
        if obj["body"].get("stream") is True:
            err("invalid_request", f"line {n}: streaming (body.stream: true) is not supported in a batch", n,
                "body.stream")
            continue
        if ids.add(obj["custom_id"], offset, id_at, log=False) is not None:
            err("duplicate_custom_id", f"line {n}: custom_id {obj['custom_id']!r} is used by an earlier line", n,
                "custom_id")
            continue
        if out.model is None and isinstance(obj["body"].get("model"), str):
            out.model = obj["body"]["model"]
    if out.total == 0:
        err("empty_file", "the input file has no request line", 0)
    return out
