"""SSE reassembly and error-body reading, on streams shaped as OpenAI's servers send them, checked with the
openai SDK's own types. No processes: the assembler and the parsers are pure."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response

from evalsup.tasks.records import output_line
from evalsup.worker.server_errors import http_error, request_id_of, server_error, text_body
from evalsup.worker.sse import StreamAssembler, StreamCut, StreamFailed
from tests.responses_stream import RESPONSE_FINAL as FINAL
from tests.responses_stream import responses_events as _responses_events

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-x",
        "system_fingerprint": "fp_1"}


def _chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    ch = {**BASE, "choices": choices, **extra}
    ChatCompletionChunk.model_validate(ch)  # the test's own streams are what the SDK accepts
    return ch


def _delta(i: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    return {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _feed(events: list[dict[str, Any] | bytes], split: int = 7, done: bool = True) -> StreamAssembler:
    raw = b"".join(e if isinstance(e, bytes) else b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    if done:
        raw += b"data: [DONE]\n\n"
    asm = StreamAssembler(0.0)
    for i in range(0, len(raw), split):  # in small pieces: events cut across reads
        asm.feed(raw[i : i + split])
    return asm


def test_tool_call_deltas_merge_into_one_call_with_null_content() -> None:
    tc0 = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    events = [
        _chunk([_delta(0, {"role": "assistant", "content": None, "tool_calls": [tc0]})]),
        _chunk([_delta(0, {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]})]),
        _chunk([_delta(0, {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]})]),
        _chunk([_delta(0, {"tool_calls": [{"index": 1, "id": "call_2", "type": "function",
                                           "function": {"name": "get_time", "arguments": "{}"}}]})]),
        _chunk([_delta(0, {}, "tool_calls")]),
    ]
    body = _feed(events).body()
    msg = ChatCompletion.model_validate(body).choices[0].message
    assert msg.content is None and body["choices"][0]["message"]["content"] is None
    assert msg.tool_calls is not None and len(msg.tool_calls) == 2
    first, second = msg.tool_calls
    assert (first.id, first.type, first.function.name) == ("call_1", "function", "get_weather")  # type: ignore[union-attr]
    assert orjson.loads(first.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert (second.id, second.function.name, second.function.arguments) == ("call_2", "get_time", "{}")  # type: ignore[union-attr]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_several_choices_logprobs_refusal_and_usage() -> None:
    def lp(tok: str) -> dict[str, Any]:
        return {"content": [{"token": tok, "logprob": -0.5, "bytes": list(tok.encode()), "top_logprobs": []}],
                "refusal": None}

    events = [
        _chunk([_delta(0, {"role": "assistant", "content": ""})], usage=None),
        _chunk([_delta(1, {"role": "assistant", "content": None, "refusal": ""})], usage=None),
        _chunk([_delta(0, {"content": "Hel"}, logprobs=lp("Hel"))], usage=None),
        _chunk([_delta(1, {"refusal": "I can't "})], usage=None),
        _chunk([_delta(0, {"content": "lo"}, logprobs=lp("lo"))], usage=None),
        _chunk([_delta(1, {"refusal": "help."})], usage=None),
        _chunk([_delta(0, {}, "stop"), _delta(1, {}, "stop")], usage=None),
        _chunk([], usage={"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}),
    ]
    asm = _feed(events)
    body = asm.body()
    cc = ChatCompletion.model_validate(body)
    assert [c.index for c in cc.choices] == [0, 1]
    assert cc.choices[0].message.content == "Hello" and cc.choices[0].message.refusal is None
    assert [t.token for t in cc.choices[0].logprobs.content or []] == ["Hel", "lo"]  # type: ignore[union-attr]
    assert cc.choices[1].message.content is None and cc.choices[1].message.refusal == "I can't help."
    assert body["choices"][1]["logprobs"] is None
    assert cc.usage is not None and cc.usage.total_tokens == 11
    assert asm.ttft_s is not None and asm.itl_s is not None


def test_legacy_completion_stream_concatenates_text_and_logprobs() -> None:
    def chunk(i: int, text: str, finish: str | None, offset: int) -> dict[str, Any]:
        lp = {"tokens": [text], "token_logprobs": [-0.1], "top_logprobs": [{text: -0.1}], "text_offset": [offset]}
        return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                "choices": [{"index": i, "text": text, "logprobs": lp, "finish_reason": finish}]}

    body = _feed([chunk(0, "a", None, 0), chunk(1, "x", None, 0), chunk(0, "b", "length", 1),
                  chunk(1, "y", "stop", 1)]).body()
    cp = Completion.model_validate(body)
    assert [c.text for c in cp.choices] == ["ab", "xy"]
    assert cp.choices[0].logprobs is not None and cp.choices[0].logprobs.tokens == ["a", "b"]
    assert cp.choices[0].logprobs.text_offset == [0, 1] and cp.choices[0].finish_reason == "length"


def test_chunks_without_object_are_read_by_their_choices() -> None:
    bare = [{"id": "x", "created": 1, "model": "m", "choices": [_delta(0, {"role": "assistant", "content": "Hi"})]},
            {"id": "x", "created": 1, "model": "m", "choices": [_delta(0, {}, "stop")]}]
    body = _feed([{"id": "x", "created": 1, "model": "m", "choices": []}, *bare]).body()  # a first chunk says nothing
    assert ChatCompletion.model_validate(body).choices[0].message.content == "Hi"


def test_chat_stream_without_done_or_finish_is_cut_and_error_event_fails() -> None:
    asm = _feed([_chunk([_delta(0, {"role": "assistant", "content": "Hi"})])], done=False)
    with pytest.raises(StreamCut):
        asm.body()
    with pytest.raises(StreamFailed) as info:
        _feed([_chunk([_delta(0, {"content": "Hi"})]),
               {"error": {"message": "engine died", "type": "server_error", "code": "server_error"}}])
    assert info.value.code == "server_error" and info.value.message == "engine died"


def test_responses_stream_writes_the_completed_events_body() -> None:
    asm = _feed(list(_responses_events(FINAL)), done=False)  # the Responses API sends no [DONE]
    body = asm.body()
    assert body == FINAL and Response.model_validate(body).output_text == "Hello world"
    assert asm.ttft_s is not None and asm.token_chunks == 2
    cut = _feed(_responses_events(FINAL)[:-1], done=True)  # a [DONE] alone does not finish a response
    with pytest.raises(StreamCut):
        cut.body()


def test_responses_failed_and_error_events_carry_the_servers_code() -> None:
    events = _responses_events(FINAL)[:3]
    failed = {"type": "response.failed", "sequence_number": 3,
              "response": {**FINAL, "status": "failed", "error": {"code": "server_error", "message": "oops"}}}
    with pytest.raises(StreamFailed) as info:
        _feed([*events, failed], done=False)
    assert (info.value.code, info.value.message) == ("server_error", "oops")
    err = {"type": "error", "sequence_number": 3, "code": "rate_limit_exceeded", "message": "slow down", "param": None}
    with pytest.raises(StreamFailed) as info:
        _feed([*events, err], done=False)
    assert (info.value.code, info.value.message) == ("rate_limit_exceeded", "slow down")


@pytest.mark.parametrize(("body", "want"), [
    ({"error": {"message": "bad model", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}},
     {"code": "model_not_found", "message": "bad model", "type": "invalid_request_error", "param": "model"}),
    ({"error": "overloaded"}, {"message": "overloaded"}),
    ({"object": "error", "message": "max_tokens too large", "type": "BadRequestError", "param": None, "code": 400},
     {"message": "max_tokens too large", "type": "BadRequestError"}),
    ({"detail": "Model not found"}, {"message": "Model not found"}),
    ({"detail": [{"loc": ["body", "model"], "msg": "Field required", "type": "missing"},
                 {"loc": ["body", "input"], "msg": "Field required", "type": "missing"}]},
     {"code": "missing", "message": "body.model: Field required; body.input: Field required"}),
    ("Internal   Server\nError", {"message": "Internal Server Error"}),
    ({"unrelated": 1}, {}),
])
def test_server_error_bodies_of_every_shape(body: Any, want: dict[str, str]) -> None:
    assert server_error(body) == want


def test_http_error_keeps_evalsups_code_and_the_servers() -> None:
    err = http_error(404, {"error": {"message": "no such model", "code": "model_not_found", "type": "x"}})
    assert err == {"code": "http_404", "message": "no such model", "server_code": "model_not_found", "type": "x"}
    assert http_error(502, text_body(b"<html>" + b"x" * 5000 + b"</html>"))["message"].endswith("...")
    assert http_error(500, None) == {"code": "http_500", "message": "HTTP 500"}
    assert request_id_of({"x-request-id": ""}) is None and request_id_of({"request-id": "r1"}) == "r1"


def test_output_record_ids_and_error_fields() -> None:
    fields: dict[str, Any] = {"status": 404, "request_id": None, "metrics": {}, "metadata": None}
    err = http_error(404, {"error": {"message": "no such model", "code": "model_not_found"}})
    a = orjson.loads(output_line("t1", body={"error": {}}, error=err, **fields))
    b = orjson.loads(output_line("t1", body={"error": {}}, error=err, **fields))
    assert a["id"].startswith("batch_req_") and len(a["id"]) == len("batch_req_") + 24 and a["id"] != b["id"]
    assert a["custom_id"] == "t1" and a["response"]["request_id"] is None
    assert a["error"] == {"code": "model_not_found", "message": "no such model", "type": None, "param": None,
                          "evalsup_code": "http_404"}
    plain = orjson.loads(output_line("t2", body=None, error={"code": "timeout_read", "message": "m"},
                                     **{**fields, "status": None}))
    assert plain["error"]["code"] == plain["error"]["evalsup_code"] == "timeout_read" and plain["response"] is None
