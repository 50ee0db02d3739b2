"""Chat answers beyond plain text: tool calls (when the request has ``tools``), logprobs (when asked), refusals
(``mock.refusal``). Never padded; the same body whether streamed or not, so a reassembled stream equals it.

A plan per choice says what the choice holds; ``body`` and ``events`` render it as a whole body or as SSE chunks
in OpenAI's shapes (tool call deltas by index: id, type and name first, then the arguments in pieces).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from evalsup.mock import content as C
from evalsup.mock.state import FINGERPRINT, SSE_DONE, sse

ARG_PIECE = 8  # characters of a tool call's arguments per streamed delta


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as a string


@dataclass(frozen=True)
class Plan:
    """One choice: text, or a refusal, or a tool call; with token logprobs when asked (top_k alternatives)."""

    text: str | None
    refusal: str | None = None
    tool: ToolCall | None = None
    finish: str = "stop"
    logprobs: bool = False
    top_k: int = 0
    tokens: int = 1


def wants_rich(body: dict[str, Any], refusal: str | None) -> bool:
    return refusal is not None or body.get("logprobs") is True or chosen_tool(body) is not None


def chosen_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The function the mock calls: the one tool_choice names, else the first function tool; None for
    tool_choice "none" or no function tools. Accepts chat's ({"type", "function": {...}}) and the Responses
    API's flat ({"type", "name", "parameters"}) tool shapes."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    funcs = []
    for t in tools:
        if isinstance(t, dict) and t.get("type") == "function":
            f = t.get("function", t)
            if isinstance(f, dict) and isinstance(f.get("name"), str):
                funcs.append(f)
    if not funcs:
        return None
    if isinstance(choice, dict):
        want = (choice.get("function") or choice).get("name")
        for f in funcs:
            if f["name"] == want:
                return f
    return funcs[0]


def tool_call(key: bytes, index: int, func: dict[str, Any]) -> ToolCall:
    """Deterministic arguments: each declared property gets a word (a number for number/integer types)."""
    h = hashlib.blake2b(key + b"tool" + index.to_bytes(4, "big"), digest_size=32).digest()
    params = func.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    args: dict[str, Any] = {}
    for j, (name, spec) in enumerate((props or {"arg": {}}).items()):
        kind = spec.get("type") if isinstance(spec, dict) else None
        b = h[j % len(h)]
        args[name] = b if kind in ("integer", "number") else C.natural_text(key + bytes([b]), index).split()[0]
    return ToolCall("call_" + h[:12].hex(), str(func["name"]), orjson.dumps(args).decode())


def _token(piece: str, top_k: int) -> dict[str, Any]:
    h = hashlib.blake2b(piece.encode(), digest_size=8).digest()
    lp = -round(h[0] / 64, 4)
    tok = {"token": piece, "logprob": lp, "bytes": list(piece.encode())}
    top = [dict(tok)] + [{"token": f"{piece.strip()}~{k}", "logprob": round(lp - 1 - k, 4), "bytes": None}
                          for k in range(1, top_k)]
    return {**tok, "top_logprobs": top[:top_k]}


def plans(call_body: dict[str, Any], key: bytes, answers: list[C.Answer], refusal: str | None) -> list[Plan]:
    lp = call_body.get("logprobs") is True
    top = call_body.get("top_logprobs")
    top_k = top if isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= 20 else 0
    func = chosen_tool(call_body)
    out = []
    for i, a in enumerate(answers):
        if refusal is not None:
            out.append(Plan(None, refusal=refusal, logprobs=lp, top_k=top_k, tokens=C.approx_tokens(refusal)))
        elif func is not None:
            tc = tool_call(key, i, func)
            out.append(Plan(None, tool=tc, finish="tool_calls", tokens=C.approx_tokens(tc.arguments) + 5))
        else:
            out.append(Plan(a.text, finish=a.finish, logprobs=lp, top_k=top_k, tokens=a.tokens))
    return out


def _usage(ps: list[Plan], prompt_tokens: int) -> dict[str, int]:
    completion = sum(p.tokens for p in ps)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _message(p: Plan) -> tuple[dict[str, Any], dict[str, Any] | None]:
    msg: dict[str, Any] = {"role": "assistant", "content": p.text}
    if p.refusal is not None:
        msg["refusal"] = p.refusal
    if p.tool is not None:
        fn = {"name": p.tool.name, "arguments": p.tool.arguments}
        msg["tool_calls"] = [{"id": p.tool.id, "type": "function", "function": fn}]
    logprobs = None
    if p.logprobs:
        said = p.refusal if p.refusal is not None else p.text or ""
        toks = [_token(x, p.top_k) for x in C.stream_pieces(said)]
        logprobs = {"content": None, "refusal": toks} if p.refusal is not None else {"content": toks, "refusal": None}
    return msg, logprobs


def body(cid: str, created: int, model: str, ps: list[Plan], prompt_tokens: int) -> bytes:
    choices = []
    for i, p in enumerate(ps):
        msg, logprobs = _message(p)
        choices.append({"index": i, "message": msg, "logprobs": logprobs, "finish_reason": p.finish})
    return orjson.dumps({"id": cid, "object": "chat.completion", "created": created, "model": model,
                        "choices": choices, "usage": _usage(ps, prompt_tokens), "system_fingerprint": FINGERPRINT})


def events(cid: str, created: int, model: str, ps: list[Plan], prompt_tokens: int, usage: bool) -> Iterator[bytes]:
    def chunk(i: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> bytes:
        out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "system_fingerprint": FINGERPRINT,
                               "choices": [{"index": i, "delta": delta, "logprobs": logprobs,
                                            "finish_reason": finish}]}
        if usage:
            out["usage"] = None
        return sse(out)

    for i, p in enumerate(ps):
        yield chunk(i, {"role": "assistant", "content": None if p.text is None else ""})
        if p.tool is not None:
            t = p.tool
            head = {"index": 0, "id": t.id, "type": "function", "function": {"name": t.name, "arguments": ""}}
            yield chunk(i, {"tool_calls": [head]})
            for j in range(0, len(t.arguments), ARG_PIECE):
                yield chunk(i, {"tool_calls": [{"index": 0, "function": {"arguments": t.arguments[j:j + ARG_PIECE]}}]})
        else:
            field = "refusal" if p.refusal is not None else "content"
            for piece in C.stream_pieces(p.refusal if p.refusal is not None else p.text or ""):
                lp = None
                if p.logprobs:
                    toks = [_token(piece, p.top_k)]
                    lp = {"content": None, "refusal": None, field: toks}
                yield chunk(i, {field: piece}, lp)
        yield chunk(i, {}, None, p.finish)
    if usage:
        yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": FINGERPRINT, "choices": [], "usage": _usage(ps, prompt_tokens)})
    yield SSE_DONE
