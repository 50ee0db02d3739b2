"""A batch's finalizing: its run's results.jsonl split into OpenAI's output file (the answers with status 200)
and error file (the rest), each line in OpenAI's batch output shape {id, custom_id, response: {status_code,
request_id, body}, error} (evalsup's metrics, metadata and scores left out). An expired batch's unanswered lines
go to the error file as ``batch_expired``. Each custom_id at most once (a record seen twice is written once: the
first; the ids held in a ``tasks.idset.IdSet``, 16 bytes each). Both files are written to temp paths and
fsynced; the caller renames them in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.serve.check import id_reader, lines
from evalsup.tasks.idset import IdSet
from evalsup.tasks.records import record_id

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


@dataclass
class Split:
    answered: int = 0  # lines in the output file
    errors: int = 0  # lines in the error file


def _records(results: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(offset, record) of each complete line (a torn last line is no record)."""
    if not results.exists():
        return
    offset = 0
    with open(results, "rb", buffering=1 << 20) as f:
        for raw in f:
            if raw.endswith(b"\n"):
                yield offset, orjson.loads(raw)
            offset += len(raw)


def openai_line(rec: dict[str, Any]) -> tuple[bool, bytes]:
    """(is it an answer, its line in OpenAI's shape). The top-level error is for failures that have no HTTP
    response of their own, as OpenAI's; a 4xx/5xx answer is in the response with error null."""
    resp = rec.get("response")
    err = rec.get("error")
    ok = isinstance(resp, dict) and resp.get("status_code") == 200 and err is None
    if err is not None and (resp is None or resp.get("status_code") == 200):
        error: dict[str, Any] | None = {"code": err.get("code"), "message": err.get("message", "")}
    else:
        error = None
    line = {"id": rec.get("id") or record_id(), "custom_id": rec["custom_id"], "response": resp, "error": error}
    return ok, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def _sync_close(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def split(results: Path, input_path: Path, out_path: Path, err_path: Path, expired: bool) -> Split:
    """Write the output and error files of a run's ``results`` (see the module's doc)."""
    written, id_at = IdSet(), id_reader(results)  # the ids written, by their record's offset
    s = Split()
    out_f, err_f = open(out_path, "wb"), open(err_path, "wb")  # noqa: SIM115 - closed by _sync_close
    try:
        for offset, rec in _records(results):
            if written.add(rec["custom_id"], offset, id_at, log=False) is not None:
                continue  # written already
            ok, line = openai_line(rec)
            (out_f if ok else err_f).write(line)
            s.answered += ok
            s.errors += not ok
        if expired:
            for _, _, raw in lines(input_path):
                cid = orjson.loads(raw)["custom_id"]
                if written.find(cid, id_at) is not None:
                    continue
                err_f.write(orjson.dumps({"id": record_id(), "custom_id": cid, "response": None,
                                          "error": {"code": "batch_expired", "message": EXPIRED_MESSAGE}},
                                         option=orjson.OPT_APPEND_NEWLINE))
                s.errors += 1
    finally:
        _sync_close(out_f)
        _sync_close(err_f)
    return s
