"""The Responses API's event stream (``response.*`` events, no [DONE]).

The body written is the one ``response.completed`` (or ``response.incomplete``) carries, as the server built it:
nothing is reconstructed from the deltas, so nothing can drift. Deltas (``response.output_text.delta``,
``response.refusal.delta``, ``response.function_call_arguments.delta``, ...) only time the tokens.
``response.failed`` and ``error`` events end the attempt with the server's own code and message.
"""

from __future__ import annotations

from typing import Any

#: events whose ``response`` is the final body
FINAL = frozenset(("response.completed", "response.incomplete"))


class StreamFailed(ValueError):
    """The server said, inside a 200 stream, that the answer failed (an ``error`` event, ``response.failed``)."""

    def __init__(self, code: str | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def failure(err: Any, default: str) -> StreamFailed:
    """A StreamFailed from an error object (OpenAI's {"code", "message"}, or a bare string)."""
    if isinstance(err, dict):
        code = err.get("code") if isinstance(err.get("code"), str) else err.get("type")
        msg = err.get("message")
        return StreamFailed(code if isinstance(code, str) else None, str(msg)[:500] if msg else default)
    if isinstance(err, str) and err:
        return StreamFailed(None, err[:500])
    return StreamFailed(None, default)


def is_responses_event(ev: dict[str, Any]) -> bool:
    kind = ev.get("type")
    return isinstance(kind, str) and (kind.startswith("response.") or kind == "error")


class ResponsesStream:
    def __init__(self) -> None:
        self.final: dict[str, Any] | None = None

    def event(self, ev: dict[str, Any]) -> bool:
        """Take one event; whether it carried a token (a delta with text)."""
        kind = ev.get("type")
        if not isinstance(kind, str):
            return False
        if kind.endswith(".delta"):
            delta = ev.get("delta")
            return isinstance(delta, str) and bool(delta)
        if kind in FINAL:
            resp = ev.get("response")
            if isinstance(resp, dict):
                self.final = resp
        elif kind == "response.failed":
            resp = ev.get("response")
            raise failure(resp.get("error") if isinstance(resp, dict) else None, "response.failed")
        elif kind == "error":
            raise failure(ev.get("error", ev), "error event in stream")
        return False

    def finished(self) -> bool:
        return self.final is not None

    def body(self) -> dict[str, Any]:
        assert self.final is not None
        return self.final
