"""Anthropic's Message Batches read in the planner's words (pure: no I/O).

``as_batch``: a Message Batch as the driver reads a batch (OpenAI's field names: the planner's ``on_status``
and ``evalsup status`` hold unchanged). Its states map so:

    processing_status   cancel_initiated_at   request_counts.expired   status (the planner's)   act
    in_progress         -                     -                        in_progress              wait
    canceling           -                     -                        cancelling               wait
    ended               set                   -                        cancelled                collect
    ended               null                  > 0                      expired                  collect
    ended               null                  0                        completed                collect

``parse_result``: one line of its results (``{custom_id, result: {type: succeeded|errored|canceled|expired,
message|error}}``) as an ``Answer``: a succeeded request's Message is the body, as Anthropic gave it; an errored
one's status is the HTTP status of its error type (``ERROR_STATUS``), so retrying follows the same rule as
OpenAI's error lines; canceled and expired were never run (``batch_cancelled``, ``batch_expired``).

``candidates``: which of the account's batches may be a chunk's own, for a resume whose record of the create
a crash took. A Message Batch has no metadata: a candidate is one no chunk of the journal claims, created no
earlier than the chunk's intent (less ``SKEW_S`` of clock difference), that holds as many requests as the chunk.
The driver then reads an ended candidate's first result: its custom_id must be one of the chunk's; a running
one is taken only as ``choose_running`` says.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from evalsup.batch.records import Answer

SKEW_S = 60.0  # the clock difference allowed between this machine and the provider's created_at
COUNT_KEYS = ("processing", "succeeded", "errored", "canceled", "expired")
# an errored request's error type -> the HTTP status Anthropic answers it with online
ERROR_STATUS: dict[str, int] = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "timeout_error": 504, "overloaded_error": 529,
}


def unix(t: Any) -> int | None:
    """An RFC 3339 time (Anthropic's) as unix seconds; None when absent or unreadable."""
    if isinstance(t, int | float):
        return int(t)
    if not isinstance(t, str):
        return None
    try:
        return int(datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return None


def status_of(b: dict[str, Any]) -> str:
    """The planner's status word for a Message Batch (the table above)."""
    s = b.get("processing_status")
    if s == "canceling":
        return "cancelling"
    if s != "ended":
        return "in_progress"
    if b.get("cancel_initiated_at"):
        return "cancelled"
    return "expired" if int((b.get("request_counts") or {}).get("expired") or 0) > 0 else "completed"


def total(b: dict[str, Any]) -> int:
    counts = b.get("request_counts") or {}
    return sum(int(counts.get(k) or 0) for k in COUNT_KEYS)


def as_batch(b: dict[str, Any]) -> dict[str, Any]:
    """A Message Batch in the driver's words: its results are the "output file" (``results_url``)."""
    return {"id": b.get("id"), "status": status_of(b), "request_counts": dict(b.get("request_counts") or {}),
            "created_at": unix(b.get("created_at")), "expires_at": unix(b.get("expires_at")),
            "output_file_id": b.get("results_url") if b.get("processing_status") == "ended" else None,
            "error_file_id": None, "errors": None}


def parse_result(obj: dict[str, Any]) -> Answer:
    """One line of a Message Batch's results (``Answer.tid`` is its custom_id: the driver maps it back)."""
    cid = str(obj.get("custom_id"))
    got = obj.get("result")
    result: dict[str, Any] = got if isinstance(got, dict) else {}
    kind = result.get("type")
    if kind == "succeeded":
        return Answer(cid, 200, result.get("message"), None, cid, None, "")
    if kind == "errored":
        e = result.get("error")
        err: dict[str, Any] = e if isinstance(e, dict) else {}
        i = err.get("error")
        inner: dict[str, Any] = i if isinstance(i, dict) else err  # {type: error, error: {...}}, or the inner
        etype = str(inner.get("type") or "api_error")
        message = str(inner.get("message") or etype)
        body = {"type": "error", "error": inner}  # what an online request would have had, as Anthropic gave it
        return Answer(cid, ERROR_STATUS.get(etype, 500), body, None, cid, etype, message)
    if kind == "canceled":
        return Answer(cid, None, None, None, cid, "batch_cancelled", "This request was canceled with its batch.")
    if kind == "expired":
        return Answer(cid, None, None, None, cid, "batch_expired", "This request could not be processed before "
                      "the batch expired.")
    return Answer(cid, None, None, None, cid, "batch_missing", f"an unknown result type {kind!r}")


def candidates(batches: Iterable[dict[str, Any]], count: int, planned_at: float,
               claimed: set[str]) -> list[dict[str, Any]]:
    """The account's batches that may be a chunk's own (see the module's notes), newest first."""
    out = []
    for b in batches:
        created = unix(b.get("created_at"))
        if (str(b.get("id")) not in claimed and created is not None and created >= planned_at - SKEW_S
                and total(b) == count):
            out.append(b)
    return out


class Ambiguous(Exception):
    """Which running batch is a chunk's cannot be told yet (their results will tell, once they end)."""


def choose_running(running: list[dict[str, Any]], earlier_waiting: int) -> dict[str, Any] | None:
    """The running candidate that is the chunk's, or None (its create never reached the provider). The driver
    creates Message Batches one at a time, each recorded before the next begins, and in chunk order; so a kill
    leaves at most one batch unrecorded, the lowest-numbered unrecorded chunk's, which a resume adopts first.
    One candidate, and no lower chunk of the same size still waiting to adopt: it is this chunk's. Two or more
    candidates (another client of the account made one too), or a lower chunk of its size waiting:
    ``Ambiguous``: the run stops resumably rather than guess."""
    if not running:
        return None
    if len(running) == 1 and not earlier_waiting:
        return running[0]
    raise Ambiguous(", ".join(str(b.get("id")) for b in running))
