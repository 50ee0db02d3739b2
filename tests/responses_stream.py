"""A Responses API stream, event by event, each event checked against the OpenAI SDK's types (test_sse,
test_fidelity)."""

from __future__ import annotations

from typing import Any

import orjson
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter


def responses_events(final: dict[str, Any]) -> list[bytes]:
    start = {**final, "status": "in_progress", "output": [], "usage": None}
    msg = final["output"][0]
    evs: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": {**msg, "content": []}},
        {"type": "response.output_text.delta", "item_id": msg["id"], "output_index": 0, "content_index": 0,
         "delta": "Hello ", "logprobs": []},
        {"type": "response.output_text.delta", "item_id": msg["id"], "output_index": 0, "content_index": 0,
         "delta": "world", "logprobs": []},
        {"type": "response.completed", "response": final},
    ]
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    out = []
    for seq, ev in enumerate(evs):
        ev["sequence_number"] = seq
        adapter.validate_python(ev)
        out.append(b"event: " + ev["type"].encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n")
    return out


RESPONSE_FINAL = {
    "id": "resp_1", "object": "response", "created_at": 1700000000, "status": "completed", "model": "gpt-x",
    "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello world", "annotations": []}]}],
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
    "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0,
    "usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
              "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5},
}

