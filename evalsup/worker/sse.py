"""Server-sent events from a streaming completion, reassembled into the non-streaming body."""

from __future__ import annotations

import time
from typing import Any

import orjson


class StreamCut(Exception):
    """The stream ended before it said it was done (no [DONE], no finish_reason)."""


class StreamAssembler:
    """Feeds on SSE bytes; keeps time to first token and the mean gap between content chunks."""

    def __init__(self, start: float) -> None:
        self.start = start
        self._buf = b""
        self.done = False
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.token_chunks = 0
        self.meta: dict[str, Any] = {}
        self.kind: str | None = None  # "chat.completion" or "text_completion"
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: Any = None

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
        if "error" in ev and not ev.get("choices"):
            raise ValueError(f"error event in stream: {str(ev['error'])[:200]}")
        for k in ("id", "created", "model", "system_fingerprint"):
            if k in ev and k not in self.meta:
                self.meta[k] = ev[k]
        obj = ev.get("object", "")
        if self.kind is None:
            self.kind = "chat.completion" if obj == "chat.completion.chunk" else "text_completion"
        if ev.get("usage"):
            self.usage = ev["usage"]
        now = time.monotonic()
        for ch in ev.get("choices") or ():
            idx = int(ch.get("index", 0))
            c = self.choices.setdefault(idx, {"parts": [], "role": "assistant", "finish_reason": None})
            piece = ""
            delta = ch.get("delta")
            if isinstance(delta, dict):
                if delta.get("role"):
                    c["role"] = delta["role"]
                piece = delta.get("content") or ""
                if delta.get("tool_calls"):
                    c.setdefault("tool_calls", []).extend(delta["tool_calls"])
            elif "text" in ch:
                piece = ch.get("text") or ""
            if piece:
                c["parts"].append(piece)
                if self.first_token is None:
                    self.first_token = now
                self.last_token = now
                self.token_chunks += 1
            if ch.get("finish_reason"):
                c["finish_reason"] = ch["finish_reason"]

    def complete(self) -> bool:
        return self.done or (bool(self.choices) and all(c["finish_reason"] for c in self.choices.values()))

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def itl_s(self) -> float | None:
        if self.first_token is None or self.last_token is None or self.token_chunks < 2:
            return None
        return (self.last_token - self.first_token) / (self.token_chunks - 1)

    def body(self) -> dict[str, Any]:
        if not self.complete():
            raise StreamCut("stream ended before [DONE]")
        chat = self.kind == "chat.completion"
        choices = []
        for idx in sorted(self.choices):
            c = self.choices[idx]
            text = "".join(c["parts"])
            if chat:
                msg: dict[str, Any] = {"role": c["role"], "content": text}
                if c.get("tool_calls"):
                    msg["tool_calls"] = c["tool_calls"]
                choices.append({"index": idx, "message": msg, "finish_reason": c["finish_reason"], "logprobs": None})
            else:
                choices.append({"index": idx, "text": text, "finish_reason": c["finish_reason"], "logprobs": None})
        out: dict[str, Any] = {"id": self.meta.get("id", ""), "object": self.kind or "chat.completion",
                               "created": self.meta.get("created", 0), "model": self.meta.get("model", "")}
        if "system_fingerprint" in self.meta:
            out["system_fingerprint"] = self.meta["system_fingerprint"]
        out["choices"] = choices
        if self.usage is not None:
            out["usage"] = self.usage
        return out
