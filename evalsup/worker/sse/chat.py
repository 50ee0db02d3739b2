"""Chat-completion and (legacy) completion chunks merged into the body a non-streamed request gets.

Per choice (``index``): content pieces joined (``null`` when the choice had none: a tool call, a refusal),
``refusal`` pieces joined, tool-call deltas merged by their own ``index`` (id, type and name from the delta that
has them, ``arguments`` concatenated), logprobs lists concatenated (chat: ``content`` and ``refusal``; legacy:
``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``), the last ``finish_reason``. The usage chunk
(``stream_options.include_usage``) gives ``usage``.
"""

from __future__ import annotations

from typing import Any

_META = ("id", "created", "model", "system_fingerprint", "service_tier")
_LEGACY_LP = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class _Choice:
    __slots__ = ("finish", "logprobs", "parts", "refusal", "role", "saw_content", "tools")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.refusal: list[str] | None = None
        self.role = "assistant"
        self.finish: Any = None
        self.saw_content = False  # a content string (even "") came: "" stays "", never null
        self.tools: dict[int, dict[str, Any]] = {}
        self.logprobs: dict[str, list[Any] | None] | None = None

    def add_logprobs(self, lp: Any, keys: tuple[str, ...]) -> None:
        if not isinstance(lp, dict):
            return
        if self.logprobs is None:
            self.logprobs = dict.fromkeys(keys)
        for k in keys:
            v = lp.get(k)
            if isinstance(v, list):
                have = self.logprobs.get(k)
                if have is None:
                    self.logprobs[k] = list(v)
                else:
                    have.extend(v)

    def add_tool_calls(self, calls: list[Any]) -> bool:
        """Merge tool-call deltas; whether any arguments text came (a token, for the timings)."""
        got = False
        for pos, tc in enumerate(calls):
            if not isinstance(tc, dict):
                continue
            idx = tc.get("index", pos)
            acc = self.tools.get(idx)
            if acc is None:
                acc = self.tools[idx] = {"id": None, "type": "function", "name": None, "args": []}
            if tc.get("id"):
                acc["id"] = tc["id"]
            if tc.get("type"):
                acc["type"] = tc["type"]
            fn = tc.get("function")
            if isinstance(fn, dict):
                if fn.get("name"):
                    acc["name"] = fn["name"]
                if isinstance(fn.get("arguments"), str) and fn["arguments"]:
                    acc["args"].append(fn["arguments"])
                    got = True
        return got

    def message(self) -> dict[str, Any]:
        text: str | None = "".join(self.parts)
        if not text and (self.tools or self.refusal is not None or not self.saw_content):
            text = None
        msg: dict[str, Any] = {"role": self.role, "content": text}
        if self.refusal is not None:
            msg["refusal"] = "".join(self.refusal)
        if self.tools:
            msg["tool_calls"] = [
                {"id": t["id"], "type": t["type"], "function": {"name": t["name"], "arguments": "".join(t["args"])}}
                for _, t in sorted(self.tools.items())
            ]
        return msg


def _kind(ev: dict[str, Any]) -> str | None:
    """chat.completion or text_completion, by the chunk's object, else by its choices (delta or text)."""
    obj = ev.get("object")
    if obj == "chat.completion.chunk":
        return "chat.completion"
    if obj == "text_completion":
        return "text_completion"
    for ch in ev.get("choices") or ():
        if isinstance(ch, dict) and ("delta" in ch or "text" in ch):
            return "chat.completion" if "delta" in ch else "text_completion"
    return None  # decided by a later chunk


class ChatStream:
    """Chunks of /v1/chat/completions or /v1/completions; ``event`` returns whether the chunk carried a token."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.kind: str | None = None  # "chat.completion" or "text_completion"
        self.choices: dict[int, _Choice] = {}
        self.usage: Any = None

    def event(self, ev: dict[str, Any]) -> bool:
        for k in _META:
            if k in ev and k not in self.meta:
                self.meta[k] = ev[k]
        if self.kind is None:
            self.kind = _kind(ev)
        if ev.get("usage"):
            self.usage = ev["usage"]
        token = False
        for ch in ev.get("choices") or ():
            if not isinstance(ch, dict):
                continue
            idx = int(ch.get("index", 0))
            c = self.choices.get(idx)
            if c is None:
                c = self.choices[idx] = _Choice()
            delta = ch.get("delta")
            if isinstance(delta, dict):
                if delta.get("role"):
                    c.role = delta["role"]
                piece = delta.get("content")
                if isinstance(piece, str):
                    c.saw_content = True
                    if piece:
                        c.parts.append(piece)
                        token = True
                refusal = delta.get("refusal")
                if isinstance(refusal, str):
                    if c.refusal is None:
                        c.refusal = []
                    c.refusal.append(refusal)
                    token = token or bool(refusal)
                if delta.get("tool_calls"):
                    token = c.add_tool_calls(delta["tool_calls"]) or token
                c.add_logprobs(ch.get("logprobs"), ("content", "refusal"))
            elif "text" in ch:
                text = ch.get("text") or ""
                c.saw_content = True
                if text:
                    c.parts.append(text)
                    token = True
                c.add_logprobs(ch.get("logprobs"), _LEGACY_LP)
            if ch.get("finish_reason"):
                c.finish = ch["finish_reason"]
        return token

    def finished(self) -> bool:
        return bool(self.choices) and all(c.finish for c in self.choices.values())

    def body(self) -> dict[str, Any]:
        chat = self.kind != "text_completion"
        choices = []
        for idx in sorted(self.choices):
            c = self.choices[idx]
            if chat:
                choices.append({"index": idx, "message": c.message(), "logprobs": c.logprobs,
                                "finish_reason": c.finish})
            else:
                choices.append({"text": "".join(c.parts), "index": idx, "logprobs": c.logprobs,
                                "finish_reason": c.finish})
        out: dict[str, Any] = {"id": self.meta.get("id", ""), "object": self.kind or "chat.completion",
                               "created": self.meta.get("created", 0), "model": self.meta.get("model", "")}
        for k in ("system_fingerprint", "service_tier"):
            if k in self.meta:
                out[k] = self.meta[k]
        out["choices"] = choices
        if self.usage is not None:
            out["usage"] = self.usage
        return out
