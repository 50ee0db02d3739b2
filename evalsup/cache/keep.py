"""Which answers may be kept: a 200 with no error, not filtered, not cut at its token limit (unless the run
asks to keep those, ``--cache-length``). A refusal to keep is never wrong: it costs a request next time.

The same rules hold on the way out (issue 39): an entry becomes a record only when it still passes the checks
an online answer passes (``why_unfit``; for an entry read back, ``entry_unfit``: its columns' kinds first): the file
may have been damaged, edited or imported since it was kept. The run's workers (cache.lookup), `cache export` and
the estimate (cache.known: `evalsup estimate --cache`, the run's start line) ask the same ``entry_unfit``, so what
the estimate counts as free is what the run answers from the cache.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from evalsup.cache.store import Entry, shape_problem
from evalsup.tasks.routes import answer_key

# a large body checked without being built (worker.bodies.UsageOnly) is searched instead; inside a JSON string
# every quote is escaped, so these can only match the body's own keys
_CUT = re.compile(rb'"finish_reason"\s*:\s*"(length|content_filter)"|"incomplete_details"\s*:\s*\{')
_FILTERED = re.compile(rb'"finish_reason"\s*:\s*"content_filter"|"reason"\s*:\s*"content_filter"')


def why_not(parsed: Any, raw: bytes | None, keep_length: bool = False) -> str | None:
    """Why this answer's body may not be kept ("length", "content_filter", "incomplete"), or None. ``parsed``:
    the body as built (a dict), or only its usage; ``raw``: its bytes, searched when it was not built."""
    if isinstance(parsed, dict) and ("choices" in parsed or "output" in parsed or "data" in parsed):
        for c in parsed.get("choices") or ():
            reason = c.get("finish_reason") if isinstance(c, dict) else None
            if reason == "content_filter" or (reason == "length" and not keep_length):
                return str(reason)
        if parsed.get("status") == "incomplete":  # the Responses API
            details = parsed.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            if reason == "content_filter" or reason != "max_output_tokens" or not keep_length:
                return f"incomplete ({reason})"
        return None
    if raw is None:
        return "unread"
    if keep_length:
        return "content_filter" if _FILTERED.search(raw) else None
    m = _CUT.search(raw)
    return None if m is None else (m.group(1) or b"incomplete").decode()


def why_unfit(status: Any, body: bytes, path: str | None, keep_length: bool = False) -> tuple[Any, str | None]:
    """An answer from elsewhere (a cache entry about to become a record, an import's line) checked as an online
    answer is (``worker.client``: status 200, JSON, an object with the route's answer key) and as a run keeps
    one (``why_not``), and no error body: (its body parsed, None), or (None, why it is no answer to serve).
    The body is built whole (orjson): checking a large one without building it (simdjson) and searching its
    bytes for a cut costs as much here."""
    if type(status) is not int:
        return None, "status: not a number"
    if status != 200:
        return None, f"status {status}"
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, "not JSON"
    if not isinstance(parsed, dict):
        what = "null" if parsed is None else "a list" if isinstance(parsed, list) else f"a {type(parsed).__name__}"
        return None, f"{what}, not an answer"
    if parsed.get("error") is not None:
        return None, "an error body"
    need = answer_key(path) if path else None
    if need is not None and need not in parsed:
        return None, f"no {need!r}, not an answer for its route"
    why = why_not(parsed, body, keep_length)
    return (parsed, None) if why is None else (None, f"cut ({why})" if why == "length" else why)


def entry_unfit(e: Entry, path: str | None, keep_length: bool = False) -> tuple[Any, str | None]:
    """An entry read back checked before it becomes a record: its columns of the kinds evalsup writes
    (``store.shape_problem``), then its answer (``why_unfit``) for a request to ``path``: (its body parsed,
    None), or (None, why it is no answer to serve)."""
    problem = shape_problem(e)
    if problem is not None:
        return None, problem
    return why_unfit(e.status, e.body, path, keep_length)
