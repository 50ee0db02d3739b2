"""OpenAI fidelity end to end: every body evalsup writes (chat, completions, embeddings, responses; streamed and
not) validates with the openai SDK's types, streamed bodies equal plain ones, error records follow the schema
table of docs/evaluations.md. Real CLI runs against the project's mock (and a small FastAPI-style server) on
127.0.0.1."""

from __future__ import annotations

import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import orjson
import pytest
from aiohttp import web
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from evalsup.mock.server import MockThread
from tests.harness import env_for, evalsup_cmd, read_results, run_cli
from tests.responses_stream import RESPONSE_FINAL as FINAL
from tests.responses_stream import responses_events as _responses_events

SDK_TYPE: dict[str, Any] = {"/v1/chat/completions": ChatCompletion, "/v1/completions": Completion,
                            "/v1/embeddings": CreateEmbeddingResponse, "/v1/responses": Response}

# The record table of docs/evaluations.md ("Output records"), as a JSON schema.
_ERROR = {"type": "object", "required": ["code", "message", "type", "param", "evalsup_code"],
          "additionalProperties": False,
          "properties": {"code": {"type": "string", "minLength": 1}, "message": {"type": "string"},
                         "type": {"type": ["string", "null"]}, "param": {"type": ["string", "null"]},
                         "evalsup_code": {"type": "string", "minLength": 1}}}
RECORD_SCHEMA = {
    "type": "object", "required": ["id", "custom_id", "response", "error", "metrics"],
    "properties": {
        "id": {"type": "string", "pattern": "^batch_req_[0-9a-f]{24}$"},
        "custom_id": {"type": "string"},
        "response": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["status_code", "request_id", "body"], "additionalProperties": False,
            "properties": {"status_code": {"type": "integer"},
                           "request_id": {"type": ["string", "null"], "minLength": 1}, "body": {}}}]},
        "error": {"oneOf": [{"type": "null"}, _ERROR]},
        "metrics": {"type": "object", "required": ["latency_s", "attempts"]},
    },
}

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
MSG = [{"role": "user", "content": "What is the weather?"}]
TASKS: list[tuple[str, str, dict[str, Any]]] = [
    ("chat", "/v1/chat/completions", {"messages": MSG}),
    ("chat-n2", "/v1/chat/completions", {"messages": MSG, "n": 2}),
    ("chat-tools", "/v1/chat/completions", {"messages": MSG, "tools": TOOLS}),
    ("chat-tools-n2", "/v1/chat/completions", {"messages": MSG, "tools": TOOLS, "n": 2}),
    ("chat-logprobs", "/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 2}),
    ("chat-refusal", "/v1/chat/completions", {"messages": MSG, "logprobs": True, "mock": {"refusal": "I can't."}}),
    ("cmpl", "/v1/completions", {"prompt": "Once upon"}),
    ("cmpl-n2", "/v1/completions", {"prompt": ["a", "b"], "n": 2}),
    ("emb", "/v1/embeddings", {"input": ["x", "y"]}),
    ("resp", "/v1/responses", {"input": "Tell me a story."}),
    ("resp-items", "/v1/responses", {"input": MSG, "instructions": "Be brief."}),
    ("resp-tools", "/v1/responses", {"input": "Weather?", "tools": [
        {"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]}),
    ("resp-short", "/v1/responses", {"input": "Tell me a long story.", "max_output_tokens": 2}),
]


def _write(path: Path, rows: list[tuple[str, str, dict[str, Any]]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"custom_id": cid, "method": "POST", "url": url,
                                            "body": {"model": "mock-model", **body}}) + b"\n"
                              for cid, url, body in rows))
    return path


def _records(run_dir: Path) -> dict[str, dict[str, Any]]:
    recs = {r["custom_id"]: r for r in read_results(run_dir)}
    for r in recs.values():
        jsonschema.validate(r, RECORD_SCHEMA)
    return recs


def test_every_body_validates_with_the_sdk_streamed_or_not(tmp_path: Path, mock: MockThread) -> None:
    plain = _write(tmp_path / "plain.jsonl", TASKS)
    streamed = _write(tmp_path / "stream.jsonl", TASKS)
    r = run_cli("run", "--base-url", mock.url, str(plain))
    assert r.returncode == 0, r.stderr
    r = run_cli("run", "--stream", "--base-url", mock.url, str(streamed))
    assert r.returncode == 0, r.stderr
    a, b = _records(tmp_path / "plain.run"), _records(tmp_path / "stream.run")
    urls = {cid: url for cid, url, _ in TASKS}
    for cid, url in urls.items():
        for rec in (a[cid], b[cid]):
            assert rec["error"] is None, rec
            assert rec["response"]["request_id"].startswith("req_")
            SDK_TYPE[url].model_validate(rec["response"]["body"])
        pb, sb = a[cid]["response"]["body"], b[cid]["response"]["body"]
        if url in ("/v1/chat/completions", "/v1/completions"):
            assert sb["choices"] == pb["choices"], cid  # tool calls, logprobs, refusals, n > 1: all equal
            assert sb["usage"] == pb["usage"] and sb["object"] == pb["object"]
        elif url == "/v1/responses":
            assert {k: v for k, v in sb.items() if k not in ("id", "created_at")} == \
                {k: v for k, v in pb.items() if k not in ("id", "created_at")}, cid
        if url != "/v1/embeddings":  # streamed: time to first token for all three kinds
            assert 0 < b[cid]["metrics"]["ttft_s"] <= b[cid]["metrics"]["latency_s"], cid
    tool = ChatCompletion.model_validate(b["chat-tools"]["response"]["body"]).choices[0]
    assert tool.message.content is None and tool.finish_reason == "tool_calls"
    assert tool.message.tool_calls is not None and len(tool.message.tool_calls) == 1
    args = orjson.loads(tool.message.tool_calls[0].function.arguments)  # type: ignore[union-attr]
    assert set(args) == {"city", "days"}
    assert len(b["chat-n2"]["response"]["body"]["choices"]) == 2
    refusal = ChatCompletion.model_validate(b["chat-refusal"]["response"]["body"]).choices[0]
    assert refusal.message.refusal == "I can't." and refusal.message.content is None
    assert refusal.logprobs is not None and "".join(t.token for t in refusal.logprobs.refusal or []) == "I can't."
    lp = ChatCompletion.model_validate(b["chat-logprobs"]["response"]["body"]).choices[0]
    assert lp.logprobs is not None and "".join(t.token for t in lp.logprobs.content or []) == lp.message.content
    resp = Response.model_validate(b["resp"]["response"]["body"])
    assert resp.status == "completed" and resp.output_text
    assert Response.model_validate(b["resp-tools"]["response"]["body"]).output[0].type == "function_call"
    assert Response.model_validate(b["resp-short"]["response"]["body"]).status == "incomplete"


def test_error_records_take_the_servers_code_and_keep_evalsups(tmp_path: Path, mock: MockThread) -> None:
    rows: list[tuple[str, str, dict[str, Any]]] = [
        ("bad-400", "/v1/chat/completions", {"messages": MSG, "mock": {"status": 400}}),
        ("no-model", "/v1/chat/completions", {"messages": MSG, "model": "gpt-nope"}),
        ("fails-in-stream", "/v1/chat/completions", {"messages": MSG, "mock": {"status": 500, "in_stream": True}}),
        ("resp-fails", "/v1/responses", {"input": "x", "mock": {"status": 503, "in_stream": True}}),
        ("ok", "/v1/responses", {"input": "x"}),
    ]
    rows = [(c, u, {**b, "model": b.get("model", "mock-model")}) for c, u, b in rows]
    tasks = _write(tmp_path / "t.jsonl", rows)
    r = run_cli("run", "--stream", "--max-attempts", "2", "--no-check", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = _records(tmp_path / "t.run")
    bad = recs["bad-400"]
    assert bad["error"]["code"] == bad["error"]["evalsup_code"] == "http_400"  # the mock sends code null for 400
    assert bad["response"]["status_code"] == 400 and bad["error"]["type"] == "invalid_request_error"
    nm = recs["no-model"]
    assert (nm["error"]["code"], nm["error"]["evalsup_code"], nm["error"]["param"]) == \
        ("model_not_found", "http_404", "model")
    assert "gpt-nope" in nm["error"]["message"] and nm["response"]["body"]["error"]["code"] == "model_not_found"
    for cid in ("fails-in-stream", "resp-fails"):
        rec = recs[cid]
        assert rec["error"]["code"] == "server_error" and rec["error"]["evalsup_code"] == "stream_error", rec
        assert rec["metrics"]["attempts"] == 2 and rec["response"] is None
    assert recs["ok"]["error"] is None
    assert len({rec["id"] for rec in recs.values()}) == len(recs)


# ------------------------------------------------------------------ a server of another kind (transformers serve)


def _fastapi_like() -> web.Application:
    """Answers as FastAPI-based servers do: {"detail": ...} errors, plain-text 5xx, no x-request-id, and SSE on
    /v1/responses whatever the request asked for."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        what = body["messages"][0]["content"]
        if what == "detail":
            return web.json_response({"detail": "Model mock-model is not loaded"}, status=400)
        if what == "detail-list":
            return web.json_response({"detail": [{"loc": ["body", "messages", 0, "role"], "msg": "Field required",
                                                  "type": "missing"}]}, status=422)
        return web.Response(text="upstream connect error or disconnect/reset before headers", status=503,
                            headers={"request-id": "gw-7"})

    async def responses(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in _responses_events(FINAL):
            await resp.write(ev)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
    return app


@pytest.fixture
def fastapi_like() -> Iterator[str]:
    import asyncio

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_fastapi_like())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/v1"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def test_other_servers_errors_and_unasked_sse(tmp_path: Path, fastapi_like: str) -> None:
    rows: list[tuple[str, str, dict[str, Any]]] = [
        ("detail", "/v1/chat/completions", {"messages": [{"role": "user", "content": "detail"}]}),
        ("detail-list", "/v1/chat/completions", {"messages": [{"role": "user", "content": "detail-list"}]}),
        ("text-503", "/v1/chat/completions", {"messages": [{"role": "user", "content": "text"}]}),
        ("sse-anyway", "/v1/responses", {"input": "hi"}),  # no "stream": the server streams all the same
    ]
    tasks = _write(tmp_path / "t.jsonl", rows)
    r = run_cli("run", "--no-check", "--max-attempts", "2", "--base-url", fastapi_like, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = _records(tmp_path / "t.run")
    d = recs["detail"]
    assert d["error"]["message"] == "Model mock-model is not loaded" and d["error"]["code"] == "http_400"
    assert d["response"]["request_id"] is None and d["response"]["body"] == {"detail": "Model mock-model is not loaded"}
    dl = recs["detail-list"]["error"]
    assert (dl["code"], dl["evalsup_code"]) == ("missing", "http_422")
    assert dl["message"] == "body.messages.0.role: Field required"
    t = recs["text-503"]
    assert t["error"]["message"] == "upstream connect error or disconnect/reset before headers"
    assert t["response"]["body"] == t["error"]["message"] and t["response"]["request_id"] == "gw-7"
    assert t["metrics"]["attempts"] == 2
    sse = recs["sse-anyway"]
    assert sse["error"] is None and sse["metrics"]["attempts"] == 1 and "ttft_s" in sse["metrics"]
    assert Response.model_validate(sse["response"]["body"]).output_text == "Hello world"


# ------------------------------------------------------------------ the mock's own CLI and fault modes


def _call(url: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else orjson.dumps(body)
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, orjson.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read()), dict(e.headers)


def test_mock_cli_serves_named_models_and_a_revoked_key() -> None:
    proc = subprocess.Popen(evalsup_cmd("mock", "--port", "0", "--model", "alpha", "--model", "beta",
                                        "--revoke-after", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_for())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("mock endpoint on "), line + (proc.stderr.read() if proc.stderr else "")
        url = line.split()[-1]
        root = url.rsplit("/v1", 1)[0]
        status, models, _ = _call(url, "/models")
        assert status == 200 and [m["id"] for m in models["data"]] == ["alpha", "beta"]
        chat = {"model": "beta", "messages": MSG}
        assert _call(url, "/chat/completions", chat)[0] == 200
        status, body, _ = _call(url, "/chat/completions", chat)  # the third /v1 request: the key is revoked
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
        assert _call(url, "/chat/completions", {**chat, "model": "mock-model"})[0] == 401
        _call(root, "/_mock/config", {"revoke_after": None})
        assert _call(url, "/chat/completions", {**chat, "model": "mock-model"})[0] == 404
        _call(root, "/_mock/config", {"revoked": True})
        assert _call(url, "/responses", {"model": "alpha", "input": "x"})[0] == 401
        _call(root, "/_mock/config", {"revoked": False, "fail_429": 1.0, "retry_after_s": 3})
        status, body, headers = _call(url, "/responses", {"model": "alpha", "input": "x"})
        assert status == 429 and headers["Retry-After"] == "3" and body["error"]["code"] == "rate_limit_exceeded"
    finally:
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------------ the mock's streams, event by event


def _raw_events(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    req = urllib.request.Request(url + path, data=orjson.dumps({**body, "stream": True}),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = resp.read()
    data = [line[5:].strip() for line in text.split(b"\n") if line.startswith(b"data:")]
    return [orjson.loads(d) for d in data if d != b"[DONE]"]


@pytest.mark.parametrize("cid", [c for c, u, _ in TASKS if u != "/v1/embeddings"])
def test_mock_stream_events_are_the_sdks_and_match_its_accumulators(mock: MockThread, cid: str) -> None:
    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    _, url, body = next(t for t in TASKS if t[0] == cid)
    body = {"model": "mock-model", **body, "stream_options": {"include_usage": True}} \
        if url != "/v1/responses" else {"model": "mock-model", **body}
    events = _raw_events(mock.url, url[3:], body)
    if url == "/v1/responses":
        adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
        for ev in events:
            adapter.validate_python(ev, strict=False)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created" and events[-1]["type"] in ("response.completed",
                                                                                 "response.incomplete")
        if events[-1]["type"] == "response.incomplete":
            return  # OpenAI ends such a stream so; the SDK's helper waits for response.completed only
        client = openai.OpenAI(base_url=mock.url, api_key="k", max_retries=0, timeout=10)
        with client.responses.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
            final = s.get_final_response()
        want = Response.model_validate(events[-1]["response"])
        assert final.output_text == want.output_text and final.status == want.status
        assert [(o.type, o.id, getattr(o, "arguments", None)) for o in final.output] == \
            [(o.type, o.id, getattr(o, "arguments", None)) for o in want.output]
    elif url == "/v1/chat/completions":
        for ev in events:
            ChatCompletionChunk.model_validate(ev)
        client = openai.OpenAI(base_url=mock.url, api_key="k", max_retries=0, timeout=10)
        kw = {k: v for k, v in body.items() if k not in ("stream", "mock")}
        with client.chat.completions.stream(**kw, extra_body={"mock": body["mock"]} if "mock" in body else None) as s:
            sdk_final = s.get_final_completion()
        from evalsup.worker.sse import StreamAssembler

        asm = StreamAssembler(0.0)
        asm.feed(b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n")
        ours = ChatCompletion.model_validate(asm.body())
        for a, b in zip(ours.choices, sdk_final.choices, strict=True):
            assert a.message.content == b.message.content and a.message.refusal == b.message.refusal
            assert a.finish_reason == b.finish_reason
            assert [(t.id, t.function.name, t.function.arguments) for t in a.message.tool_calls or []] == \
                [(t.id, t.function.name, t.function.arguments) for t in b.message.tool_calls or []]  # type: ignore[union-attr]
            assert a.logprobs == b.logprobs
        assert ours.usage == sdk_final.usage
    else:  # the SDK types a legacy chunk as Completion, whose finish_reason cannot be the null chunks carry
        assert all(e["object"] == "text_completion" for e in events)
        finished = [c for e in events for c in e["choices"] if c["finish_reason"]]
        assert sorted(c["index"] for c in finished) == list(range(len(finished))) and finished
        assert events[-1]["usage"]["total_tokens"] > 0
