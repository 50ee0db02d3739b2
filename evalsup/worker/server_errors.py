"""What a server said when it said no: its error code and message read out of the body, whatever its shape.

Shapes read: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (and ``{"error": "text"}``), vLLM's
``{"object": "error", "message", "type", "code"}``, FastAPI's ``{"detail": "text"}`` and its validation list
``{"detail": [{"loc": [...], "msg", "type"}]}``, and a plain-text or HTML body (trimmed). The attempt's error keeps
evalsup's own code in ``code`` (retries, the breaker and the summary count by it); the server's code, type and
param ride along as ``server_code``, ``type`` and ``param``, and ``tasks.record_error`` puts them in the record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_MESSAGE = 500
MAX_TEXT_BODY = 2000

#: Headers that carry a request id, in the order they are looked for (OpenAI and most servers use the first).
REQUEST_ID_HEADERS = ("x-request-id", "request-id", "x-amzn-requestid", "x-amz-request-id", "apim-request-id",
                      "x-correlation-id", "x-trace-id")


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The server's request id, or None (never "")."""
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def text_body(raw: bytes) -> str:
    """A body that is not JSON, as text for the record: decoded, trimmed to MAX_TEXT_BODY characters."""
    text = raw.decode("utf-8", "replace").strip()
    return text if len(text) <= MAX_TEXT_BODY else text[:MAX_TEXT_BODY] + "..."


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _fastapi_list(items: list[Any]) -> tuple[str | None, str]:
    """FastAPI's validation errors: "body.model: Field required; ..." and the first item's type as the code."""
    parts = []
    code = None
    for it in items:
        if isinstance(it, dict):
            loc = it.get("loc")
            where = ".".join(str(x) for x in loc) if isinstance(loc, list) else ""
            msg = it.get("msg") or it.get("message") or ""
            parts.append(f"{where}: {msg}" if where else str(msg))
            code = code or _str(it.get("type"))
        else:
            parts.append(str(it))
    return code, "; ".join(parts)


def server_error(body: Any) -> dict[str, str]:
    """The server's own ``code``, ``message``, ``type``, ``param`` found in an error body (only those found)."""
    out: dict[str, str] = {}
    if isinstance(body, str):
        if body.strip():
            out["message"] = _short(body)
        return out
    if not isinstance(body, dict):
        return out
    err = body.get("error")
    src: dict[str, Any] = body
    if isinstance(err, dict):
        src = err
    elif isinstance(err, str) and err:
        out["message"] = _short(err)
    detail = body.get("detail")
    if "message" not in out and detail is not None and not isinstance(err, dict):
        if isinstance(detail, str):
            out["message"] = _short(detail)
        elif isinstance(detail, list):
            code, msg = _fastapi_list(detail)
            out["message"] = _short(msg)
            if code:
                out["code"] = code
        elif isinstance(detail, dict):
            src = detail
    said = _str(src.get("message")) or _str(src.get("msg"))
    if said and "message" not in out:
        out["message"] = _short(said)
    for key in ("code", "type", "param"):
        value = _str(src.get(key))
        if value and key not in out:
            out[key] = value[:200]
    return out


def http_error(status: int, body: Any) -> dict[str, str]:
    """The attempt's error for an HTTP error status: evalsup's ``http_<status>`` with the server's message,
    and its code, type and param when it gave them."""
    found = server_error(body)
    err = {"code": f"http_{status}", "message": found.get("message") or f"HTTP {status}"}
    if "code" in found:
        err["server_code"] = found["code"]
    for key in ("type", "param"):
        if key in found:
            err[key] = found[key]
    return err
