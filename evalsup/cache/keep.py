"""Which answers may be kept: a 200 with no error, not filtered, not cut at its token limit (unless the run
asks to keep those, ``--cache-length``). A refusal to keep is never wrong: it costs a request next time."""

from __future__ import annotations

import re
from typing import Any

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
