"""POST /v1/responses: the Responses API, plain and streamed (``event: response.*`` SSE, no [DONE]).

The answer is a message with one output_text part, or a function_call item when the request has function
``tools``. Streamed: response.created, response.in_progress, then per item output_item.added, (content_part.added,
output_text.delta..., output_text.done, content_part.done | function_call_arguments.delta..., .done),
output_item.done, and response.completed carrying the same body a plain request gets (response.incomplete when
max_output_tokens cut the text). ``mock.status`` 5xx with ``mock.in_stream`` on a streamed request is sent as
response.failed after two events, so clients see a failure inside a 200 stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from evalsup.mock import content as C
from evalsup.mock import rich
from evalsup.mock.call import Call
from evalsup.mock.state import error, new_id

ARG_PIECE = rich.ARG_PIECE


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def _input_tokens(value: Any) -> int | None:
    if isinstance(value, str):
        return C.approx_tokens(value) + 3
    if isinstance(value, list) and value:
        msgs = [m for m in value if isinstance(m, dict)]
        return C.chat_prompt_tokens(msgs) if msgs else None
    return None


def _items(key: bytes, body: dict[str, Any], text: str) -> list[dict[str, Any]]:
    func = rich.chosen_tool(body)
    if func is not None:
        tc = rich.tool_call(key, 0, func)
        return [{"type": "function_call", "id": "fc_" + tc.id[5:], "call_id": tc.id, "name": tc.name,
                 "arguments": tc.arguments, "status": "completed"}]
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return [{"type": "message", "id": "msg_" + key.hex()[:24], "status": "completed", "role": "assistant",
             "content": [part]}]


def _response(rid: str, created: int, model: str, body: dict[str, Any], output: list[dict[str, Any]],
              status: str, usage: dict[str, Any] | None, incomplete: bool) -> dict[str, Any]:
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions") if isinstance(body.get("instructions"), str) else None,
        "max_output_tokens": body.get("max_output_tokens"), "metadata": {}, "parallel_tool_calls": True,
        "previous_response_id": None, "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": tools,
        "text": {"format": {"type": "text"}}, "truncation": "disabled", "usage": usage,
    }


def _usage(input_tokens: int, output: list[dict[str, Any]], cached: int = 0, written: int = 0) -> dict[str, Any]:
    out_chars = sum(len(i.get("arguments", "")) + sum(len(p["text"]) for p in i.get("content", ())) for i in output)
    out_tokens = max(1, out_chars // 4)
    details = {"cached_tokens": cached, "cache_write_tokens": written}
    return {"input_tokens": input_tokens, "input_tokens_details": details,
            "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + out_tokens}


def _events(final: dict[str, Any]) -> Iterator[bytes]:
    seq = 0

    def ev(name: str, **fields: Any) -> bytes:
        nonlocal seq
        seq += 1
        return _event(name, {"type": name, "sequence_number": seq - 1, **fields})

    start = {**final, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield ev("response.created", response=start)
    yield ev("response.in_progress", response=start)
    for oi, item in enumerate(final["output"]):
        if item["type"] == "function_call":
            yield ev("response.output_item.added", output_index=oi, item={**item, "arguments": "",
                                                                           "status": "in_progress"})
            args = item["arguments"]
            for j in range(0, len(args), ARG_PIECE):
                yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=oi,
                         delta=args[j : j + ARG_PIECE])
            yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=oi, arguments=args)
        else:
            yield ev("response.output_item.added", output_index=oi,
                     item={**item, "content": [], "status": "in_progress"})
            part = item["content"][0]
            empty = {**part, "text": ""}
            ids = {"item_id": item["id"], "output_index": oi, "content_index": 0}
            yield ev("response.content_part.added", part=empty, **ids)
            for piece in C.stream_pieces(part["text"]):
                yield ev("response.output_text.delta", delta=piece, logprobs=[], **ids)
            yield ev("response.output_text.done", text=part["text"], logprobs=[], **ids)
            yield ev("response.content_part.done", part=part, **ids)
        yield ev("response.output_item.done", output_index=oi, item=item)
    done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield ev(done, response=final)


async def responses(call: Call) -> web.StreamResponse:
    model, early = await call.open()
    if early is not None:
        return early
    input_tokens = _input_tokens(call.body.get("input"))
    if input_tokens is None:
        return error(call.request, 400, "input must be a string or a non-empty array of items", param="input")
    fault = call.random_fault()
    if fault is not None:
        return fault
    key = C.content_key(call.cfg.seed, "responses", call.body)
    text = call.override.text if call.override.text is not None else C.natural_text(key)
    limit = call.body.get("max_output_tokens")
    incomplete = False
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < C.approx_tokens(text):
        incomplete = True
        text = C.truncate_to_tokens(text, limit)
    output = _items(key, call.body, text)
    status = "incomplete" if incomplete else "completed"
    usage = _usage(input_tokens, output, call.cached_of(input_tokens), call.written_of(input_tokens))
    final = _response(new_id("resp_"), int(time.time()), model, call.body, output, status, usage, incomplete)
    if call.tier is not None:
        final["service_tier"] = call.tier
    call.bill(model, input_tokens, usage["output_tokens"])
    gone = call.gone_response()
    if gone is not None:  # generated and billed; the client that asked is gone
        return gone
    if call.stream:
        events = _events(final)
        if call.override.cut_stream:
            return await call.send_stream(events, cut_after=4)
        why = {"code": "server_error", "message": f"The model failed to finish (mock {call.stream_fail})."}
        failed = {**final, "status": "failed", "error": why, "output": [], "usage": None}
        fail = _event("response.failed", {"type": "response.failed", "sequence_number": 2, "response": failed})
        return await call.send_stream(events, fail_event=fail)
    return await call.send_body(orjson.dumps(final))
