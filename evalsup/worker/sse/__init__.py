"""Server-sent events from a streaming answer, reassembled into the non-streaming body.

Which kind of stream it is comes from its first event: ``response.*`` events (the Responses API, see
``responses``) or chat/legacy completion chunks (see ``chat``). Time to first token and the mean gap between
token-carrying events are kept for all of them.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from evalsup.worker.sse.chat import ChatStream
from evalsup.worker.sse.responses import ResponsesStream, StreamFailed, failure, is_responses_event

__all__ = ["StreamAssembler", "StreamCut", "StreamFailed"]


class StreamCut(Exception):
    """The stream ended before it said it was done (no [DONE], no finish_reason, no response.completed)."""


class StreamAssembler:
    """Feeds on SSE bytes; keeps time to first token and the mean gap between token chunks."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._buf = b""
        self.done = False
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.token_chunks = 0
        self.stream: ChatStream | ResponsesStream | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data
        while True:
            i = self._buf.find(b"\n")
            if i < 0:
                return
            line, self._buf = self._buf[:i].rstrip(b"\r"), self._buf[i + 1 :]
            if line.startswith(b"data:"):
                self._event(line[5:].strip())

    def _event(self, data: bytes) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        if not data:
            return
        ev = orjson.loads(data)
        if not isinstance(ev, dict):
            return
        stream = self.stream
        if stream is None:
            stream = self.stream = ResponsesStream() if is_responses_event(ev) else ChatStream()
        if isinstance(stream, ChatStream) and "error" in ev and not ev.get("choices"):
            raise failure(ev["error"], "error event in stream")
        if stream.event(ev):
            now = time.monotonic()
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
            self.token_chunks += 1

    def complete(self) -> bool:
        s = self.stream
        if isinstance(s, ResponsesStream):
            return s.finished()
        return s is not None and (self.done or s.finished())

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def itl_s(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.token_chunks < 2:
            return None
        return (self.last_token - self.first_token) / (self.token_chunks - 1)

    def body(self) -> dict[str, Any]:
        if not self.complete() or self.stream is None:
            raise StreamCut("stream ended before [DONE]" if not isinstance(self.stream, ResponsesStream)
                            else "stream ended before response.completed")
        return self.stream.body()
