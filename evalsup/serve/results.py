"""A batch's finalizing: its run's results.jsonl split into OpenAI's output file (the answers with status 200)
and error file (the rest), each line in OpenAI's batch output shape {id, custom_id, response: {status_code,
request_id, body}, error} (evalsup's metrics, metadata and scores left out). An expired batch's unanswered lines
go to the error file as ``batch_expired``. Each custom_id at most once (a record seen twice is written once: the
first; the ids held in a ``tasks.idset.IdSet``, 16 bytes each). Both files are written to temp paths and
fsynced; the caller renames them in. The same results give the same bytes however many times they are split (a
finalizing cut by a kill -9 is done again): a line the run did not answer gets an id derived from the batch's
and its custom_id, never a random one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.serve.check import id_reader, lines
from evalsup.tasks.idset import IdSet

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


@dataclass
class Split:
    answered: int = 0  # lines in the output file
    errors: int = 0  # lines in the error file
    input_tokens: int = 0  # summed over the answers' usage (chat's prompt/completion, or responses' input/output)
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def add_usage(self, body: Any) -> None:
        u = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(u, dict):
            return
        self.input_tokens += _int(u.get("prompt_tokens", u.get("input_tokens")))
        self.output_tokens += _int(u.get("completion_tokens", u.get("output_tokens")))
        details_in = u.get("prompt_tokens_details") or u.get("input_tokens_details")
        details_out = u.get("completion_tokens_details") or u.get("output_tokens_details")
        self.cached_tokens += _int(details_in.get("cached_tokens")) if isinstance(details_in, dict) else 0
        self.reasoning_tokens += _int(details_out.get("reasoning_tokens")) if isinstance(details_out, dict) else 0

    def usage(self) -> dict[str, Any]:
        """The Batch's ``usage`` (openai.types.BatchUsage)."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


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


def line_id(batch_id: str, custom_id: str) -> str:
    """The ``id`` of an output line without a record id of the run's (an expired batch's unanswered line): OpenAI's
    shape (``batch_req_`` and 24 hex digits), the same at every finalizing."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}:{custom_id}".encode()).hexdigest()[:24]


def openai_line(rec: dict[str, Any], batch_id: str = "") -> tuple[bool, bytes]:
    """(is it an answer, its line in OpenAI's shape). The top-level error is for failures that have no HTTP
    response of their own, as OpenAI's; a 4xx/5xx answer is in the response with error null. The line's id is
    the record's (a record without one: ``line_id``)."""
    resp = rec.get("response")
    err = rec.get("error")
    ok = isinstance(resp, dict) and resp.get("status_code") == 200 and err is None
    if err is not None and (resp is None or resp.get("status_code") == 200):
        error: dict[str, Any] | None = {"code": err.get("code"), "message": err.get("message", "")}
    else:
        error = None
    cid = rec["custom_id"]
    line = {"id": rec.get("id") or line_id(batch_id, cid), "custom_id": cid, "response": resp, "error": error}
    return ok, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def _sync_close(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def split(results: Path, input_path: Path, out_path: Path, err_path: Path, expired: bool, batch_id: str = "") -> Split:
    """Write the output and error files of a run's ``results`` (see the module's doc); ``batch_id`` seeds the ids of
    an expired batch's unanswered lines."""
    written, id_at = IdSet(), id_reader(results)  # the ids written, by their record's offset
    s = Split()
    out_f, err_f = open(out_path, "wb"), open(err_path, "wb")  # noqa: SIM115 - closed by _sync_close
    try:
        for offset, rec in _records(results):
            if written.add(rec["custom_id"], offset, id_at, log=False) is not None:
                continue  # written already
            ok, line = openai_line(rec, batch_id)
            if ok:
                s.add_usage(rec["response"].get("body"))
            (out_f if ok else err_f).write(line)
            s.answered += ok
            s.errors += not ok
        if expired:
            for _, _, raw in lines(input_path):
                cid = orjson.loads(raw)["custom_id"]
                if written.find(cid, id_at) is not None:
                    continue
                err_f.write(orjson.dumps({"id": line_id(batch_id, cid), "custom_id": cid, "response": None,
                                          "error": {"code": "batch_expired", "message": EXPIRED_MESSAGE}},
                                         option=orjson.OPT_APPEND_NEWLINE))
                s.errors += 1
    finally:
        _sync_close(out_f)
        _sync_close(err_f)
    return s
