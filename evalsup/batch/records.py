"""A line of a provider's output or error file read (``Answer``), and the record and RESULT meta made of it: the
same shape as an online run's (``tasks.records.output_line``), with the batch's and the request's ids in the
record's ``metrics.batch``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalsup.scoring.scorers import Scored
from evalsup.tasks.billed import billed, by_batch, tier_of
from evalsup.tasks.records import output_line
from evalsup.tasks.secrets import Scrubber


@dataclass
class Answer:
    """What the provider said for one request: ``status`` None when it never ran it (expired, cancelled,
    missing from both files)."""

    tid: str
    status: int | None
    body: Any
    request_id: str | None  # the HTTP request id of the answer (response.request_id)
    line_id: str | None  # the batch request's own id (batch_req_...)
    code: str | None  # the provider's error code (or evalsup's when it has none)
    message: str

    @property
    def error(self) -> dict[str, Any] | None:
        """The error as the worker's records carry it: evalsup's code, the server's beside it."""
        if self.status == 200:
            return None
        if self.status is None:
            return {"code": self.code or "batch_missing", "message": self.message}
        err = self.body.get("error") if isinstance(self.body, dict) else None
        err = err if isinstance(err, dict) else {}
        out = {"code": f"http_{self.status}", "message": str(err.get("message") or self.message)}
        for k in ("type", "param"):
            if err.get(k) is not None:
                out[k] = err[k]
        if err.get("code"):
            out["server_code"] = str(err["code"])
        return out


def parse_line(obj: dict[str, Any]) -> Answer:
    """One line of an output or error file (OpenAI's shape)."""
    tid = str(obj.get("custom_id"))
    resp = obj.get("response")
    err = obj.get("error") or {}
    if isinstance(resp, dict) and isinstance(resp.get("status_code"), int):
        body = resp.get("body")
        code = None
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = body["error"].get("code")
        return Answer(tid, resp["status_code"], body, resp.get("request_id"), obj.get("id"), code,
                      str(err.get("message") or ""))
    return Answer(tid, None, None, None, obj.get("id"), str(err.get("code") or "batch_missing"),
                  str(err.get("message") or "the provider gave no answer for this request"))


def not_run(tid: str, code: str, message: str) -> Answer:
    return Answer(tid, None, None, None, None, code, message)


def build(a: Answer, key: int, attempts: int, pid: int, endpoint: dict[str, Any], batch: dict[str, Any],
          metadata: dict[str, Any], scored: Scored | None, waited_s: float,
          scrub: Scrubber | None = None, *, model: str | None = None,
          own_model: bool = False) -> tuple[list[bytes], dict[str, Any]]:
    """The record of a batch answer and its RESULT meta (``ipc.messages.ResultMeta``). ``batch``: the batch id,
    the request's id and the chunk, kept in ``metrics.batch``; ``waited_s``: from the chunk's intent to its
    collection (the provider's queue and work: a batch answer has no latency of its own). ``scrub``: the run's
    secrets taken out of the body, the error and the scores' errors (an error that echoes the URL). ``model``:
    the model the request asked (``own_model``: the task named it), which prices the answer when its response
    names no model with a price (``worker.records.Extras``: the same meta ``md`` and ``metrics.model``). The
    meta's ``bt`` says the answer came from the batch (``tasks.billed.by_batch``: not from the online request
    --batch-fallback online sent after it): the budget prices it at the batch API's rates, as a resume's
    read-back does, so the live spend, the resume's and summary.json's agree."""
    error = a.error
    body = a.body
    if scrub:
        error, body = scrub.json(error) if error else error, scrub.json(body) if body else body
    metrics: dict[str, Any] = {"latency_s": 0.0, "queue_s": round(waited_s, 6), "total_s": round(waited_s, 6),
                               "attempts": attempts, "worker": pid, "endpoint": endpoint,
                               "batch": {**batch, "request_id": a.line_id}}
    usage = a.body.get("usage") if isinstance(a.body, dict) else None
    if own_model and model is not None and isinstance(usage, dict):
        metrics["model"] = model  # a task's own model: the read-back prices by it as the budget does
    line = output_line(a.tid, status=a.status, request_id=a.request_id, body=body, error=error,
                       metrics=metrics, metadata=metadata or None,
                       scores=None if scored is None else scored.scores,
                       score_errors=None if scored is None else scrub.json(scored.errors) if scrub else scored.errors)
    bill = billed(usage)  # OpenAI's names, or an Anthropic Message's; read as the read-back reads them
    info: dict[str, Any] = {
        "k": key, "ok": error is None, "lat": 0.0, "att": attempts, "rb": len(line), "ec": error["code"] if error
        else None, "ttft": None, "rt": max(0, attempts - 1), "pt": bill.prompt, "ct": bill.completion,
        "sc": None if scored is None else scored.scores, "ep": 0}
    if bill.cached:
        info["cr"] = bill.cached
    if bill.written:
        info["cw"] = bill.written
    if bill.written_1h:
        info["w1"] = bill.written_1h
    tier = tier_of(a.body)
    if tier is not None and isinstance(usage, dict):
        info["tr"] = tier
    answered = a.body.get("model") if isinstance(a.body, dict) else None
    if isinstance(answered, str) and answered and answered != model and isinstance(usage, dict):
        info["md"] = answered
    if isinstance(usage, dict) and by_batch(batch):
        info["bt"] = 1  # the batch API's answer: the budget spends it at the batch's rates, as the read-back does
    if scored is not None and scored.unscored:
        info["us"] = scored.unscored
    return [line], info
