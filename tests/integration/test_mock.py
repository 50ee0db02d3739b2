"""The OpenAI-compatible mock server: formats (checked with the official SDK types), determinism, faults."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from evalsup.mock import MockConfig, MockThread, start_mock
from evalsup.tasks.billed import billed
from tests.mock_http import Resp, request

MSG: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def mock() -> Iterator[MockThread]:
    with MockThread(MockConfig(seed=7)) as m:
        yield m


@pytest.fixture(autouse=True)
def _clean(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "mock" in request.fixturenames:  # restore the shared server's knobs after each test
        m: MockThread = request.getfixturevalue("mock")
        admin(m, "/_mock/config", dict(_DEFAULTS, down=False))
        admin(m, "/_mock/reset", {})


_DEFAULTS: dict[str, Any] = {
    "latency_ms": 0,
    "jitter_ms": 0,
    "response_kb": 0,
    "fail_500": 0,
    "fail_429": 0,
    "retry_after_s": 1.0,
    "reset": 0,
    "malformed": 0,
    "cut_stream": 0,
    "seed": 7,
    "models": ["mock-model"],
    "api_key": None,
    "echo_headers_in_errors": False,
    "capacity": 0,
    "queue": 0,
    "cached": 0,
    "written": 0,
}


def post(m: MockThread, path: str, body: Any, headers: dict[str, str] | None = None) -> Resp:
    return request(m.url, "POST", "/v1" + path, body, headers)


def chat(m: MockThread, **extra: Any) -> Resp:
    return post(m, "/chat/completions", {"model": "mock-model", "messages": MSG, **extra})


def admin(m: MockThread, path: str, body: Any = None) -> Any:
    r = request(m.url, "GET" if body is None else "POST", path, body)
    assert r.status == 200, r.body
    return r.json()


def sdk(m: MockThread, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=m.url, api_key=kw.pop("api_key", "k"), max_retries=0, timeout=10, **kw)


# ---------------------------------------------------------------------------------------------- formats


def test_chat_completion_format(mock: MockThread) -> None:
    r = chat(mock)
    assert r.status == 200
    assert r.headers["x-request-id"]
    assert r.headers["Content-Type"].startswith("application/json")
    c = ChatCompletion.model_validate(r.json())
    assert c.id.startswith("chatcmpl-") and c.object == "chat.completion" and c.model == "mock-model"
    assert c.created > 1_600_000_000
    assert c.choices[0].finish_reason == "stop" and c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content
    assert c.usage is not None and c.usage.completion_tokens >= 1 and c.usage.prompt_tokens >= 1
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    # n choices, and max_tokens truncation with finish_reason "length"
    c = ChatCompletion.model_validate(chat(mock, n=3).json())
    assert [ch.index for ch in c.choices] == [0, 1, 2]
    c = ChatCompletion.model_validate(chat(mock, max_tokens=2).json())
    assert c.choices[0].finish_reason == "length" and len(c.choices[0].message.content or "") <= 8


def test_chat_stream_format_matches_non_streamed(mock: MockThread) -> None:
    plain = ChatCompletion.model_validate(chat(mock).json()).choices[0].message.content
    r = chat(mock, stream=True, stream_options={"include_usage": True})
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert r.headers["x-request-id"]
    events = r.events()
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == plain
    # without include_usage: no usage chunk
    events = chat(mock, stream=True).events()
    assert events[-1] == "[DONE]"
    assert ChatCompletionChunk.model_validate(events[-2]).choices[0].finish_reason == "stop"
    assert all(ChatCompletionChunk.model_validate(e).usage is None for e in events[:-1])


def test_openai_client(mock: MockThread) -> None:
    client = sdk(mock)
    c = client.chat.completions.create(model="mock-model", messages=MSG)
    text = c.choices[0].message.content
    assert text and c.usage is not None
    stream = client.chat.completions.create(
        model="mock-model",
        messages=MSG,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(parts) == text
    assert usage == c.usage
    assert [m.id for m in client.models.list()] == ["mock-model"]
    assert client.models.retrieve("mock-model").id == "mock-model"
    # the SDK asks for base64 embeddings by default
    e = client.embeddings.create(model="mock-model", input=["a", "b"])
    assert len(e.data) == 2 and len(e.data[0].embedding) == 8
    comp = client.completions.create(model="mock-model", prompt="Say hi")
    assert comp.choices[0].text


def test_completions_format_and_stream(mock: MockThread) -> None:
    body = {"model": "mock-model", "prompt": "Once upon a time"}
    c = Completion.model_validate(post(mock, "/completions", body).json())
    assert c.id.startswith("cmpl-") and c.object == "text_completion"
    assert c.choices[0].finish_reason == "stop" and c.usage is not None
    events = post(mock, "/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}).events()
    assert events[-1] == "[DONE]"
    # Like OpenAI, intermediate chunks carry finish_reason null, which the SDK's Completion type (used for
    # streamed completions too, built without validation) does not allow: validate them with "stop" put in.
    for e in events[:-3]:  # the last three: finish chunk, usage chunk, [DONE]
        assert e["choices"][0]["finish_reason"] is None
    chunks = [Completion.model_validate(e) for e in _fill_finish(events[:-1])]
    assert all(ch.object == "text_completion" for ch in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage == c.usage
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == c.choices[0].text
    sdk_text = "".join(
        ch.choices[0].text
        for ch in sdk(mock).completions.create(model="mock-model", prompt=body["prompt"], stream=True)
    )
    assert sdk_text == c.choices[0].text
    # a batch of prompts gets one choice per prompt
    c = Completion.model_validate(post(mock, "/completions", {**body, "prompt": ["a", "b", "c"]}).json())
    assert [ch.index for ch in c.choices] == [0, 1, 2]


def _fill_finish(events: list[Any]) -> list[Any]:
    return [
        {**e, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in e["choices"]]} for e in events
    ]


def test_embeddings(mock: MockThread) -> None:
    body = {"model": "mock-model", "input": ["alpha", "beta"]}
    e = CreateEmbeddingResponse.model_validate(post(mock, "/embeddings", body).json())
    assert e.object == "list" and [d.index for d in e.data] == [0, 1]
    assert all(len(d.embedding) == 8 for d in e.data) and e.usage.prompt_tokens >= 2
    assert e.data[0].embedding != e.data[1].embedding
    # same item, same vector, whatever the batch
    single = CreateEmbeddingResponse.model_validate(post(mock, "/embeddings", {**body, "input": "beta"}).json())
    assert single.data[0].embedding == e.data[1].embedding
    e16 = CreateEmbeddingResponse.model_validate(post(mock, "/embeddings", {**body, "dimensions": 16}).json())
    assert len(e16.data[0].embedding) == 16
    b64 = post(mock, "/embeddings", {**body, "encoding_format": "base64"}).json()
    raw = base64.b64decode(b64["data"][1]["embedding"])
    assert list(struct.unpack("<8f", raw)) == pytest.approx(e.data[1].embedding, rel=1e-6)


# ---------------------------------------------------------------------------------------------- determinism


def _text(r: Resp) -> str:
    return str(r.json()["choices"][0]["message"]["content"])


def test_content_is_deterministic_per_seed_and_request(mock: MockThread) -> None:
    a = _text(chat(mock))
    assert _text(chat(mock)) == a
    assert _text(chat(mock, mock={"delay_s": 0})) == a  # the mock object does not change content
    assert _text(chat(mock, messages=[{"role": "user", "content": "other"}])) != a
    with MockThread(MockConfig(seed=7, fail_500=0.5, reset=0.2)) as same_seed:
        got = []
        for _ in range(20):
            try:
                r = chat(same_seed)
            except (ConnectionError, http.client.HTTPException):
                continue
            if r.status == 200:
                got.append(_text(r))
        assert got and set(got) == {a}  # faults never change the text of what does succeed
    admin(mock, "/_mock/config", {"seed": 8})
    assert _text(chat(mock)) != a


def test_fault_sequence_is_deterministic_per_seed(mock: MockThread) -> None:
    def run() -> list[int]:
        admin(mock, "/_mock/config", {"seed": 3, "fail_500": 0.3, "fail_429": 0.2})
        return [chat(mock).status for _ in range(60)]

    first = run()
    assert first == run()
    assert 0 < first.count(500) < 40 and 0 < first.count(429) < 30 and first.count(200) > 10


# ---------------------------------------------------------------------------------------------- faults


def test_fault_500(mock: MockThread) -> None:
    admin(mock, "/_mock/config", {"fail_500": 1.0})
    r = chat(mock)
    assert r.status == 500 and r.headers["x-request-id"]
    err = r.json()["error"]
    assert err["type"] == "server_error" and err["message"]
    with pytest.raises(openai.InternalServerError):
        sdk(mock).chat.completions.create(model="mock-model", messages=MSG)


def test_fault_429_with_retry_after(mock: MockThread) -> None:
    admin(mock, "/_mock/config", {"fail_429": 1.0, "retry_after_s": 2})
    r = chat(mock)
    assert r.status == 429 and r.headers["Retry-After"] == "2"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError):
        sdk(mock).chat.completions.create(model="mock-model", messages=MSG)


def test_fault_reset(mock: MockThread) -> None:
    admin(mock, "/_mock/config", {"reset": 1.0})
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        chat(mock)
    with pytest.raises(openai.APIConnectionError):
        sdk(mock).chat.completions.create(model="mock-model", messages=MSG)
    stats = mock.stats()
    assert stats["faults"]["reset"] == 2 and stats["statuses"] == {}


def test_fault_malformed(mock: MockThread) -> None:
    admin(mock, "/_mock/config", {"malformed": 1.0})
    r = chat(mock)
    assert r.status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.body)
    events = chat(mock, stream=True).body.decode().split("\n\n")
    with pytest.raises(json.JSONDecodeError):
        for ev in events:
            if ev.startswith("data: {"):
                json.loads(ev[6:])


def test_per_request_overrides(mock: MockThread) -> None:
    r = chat(mock, mock={"status": 503})
    assert r.status == 503 and r.json()["error"]["type"] == "server_error"
    r = chat(mock, mock={"status": 429, "retry_after": 0.5})
    assert r.status == 429 and r.headers["Retry-After"] == "0.5" and r.headers["retry-after-ms"] == "500"
    assert _text(chat(mock, mock={"text": "exactly this"})) == "exactly this"
    events = chat(mock, stream=True, mock={"text": "exactly this"}).events()
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "exactly this"
    t0 = time.monotonic()
    assert chat(mock, mock={"delay_s": 0.2}).status == 200
    assert time.monotonic() - t0 >= 0.19
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        chat(mock, mock={"reset": True})
    with pytest.raises(json.JSONDecodeError):
        json.loads(chat(mock, mock={"malformed": True}).body)
    assert 9_000 < len(chat(mock, mock={"kb": 10}).body) < 11_500
    # overrides are for that request only
    assert chat(mock).status == 200


def test_override_times_limits_faults_to_first_attempts(mock: MockThread) -> None:
    assert [chat(mock, mock={"status": 500, "times": 2}).status for _ in range(4)] == [500, 500, 200, 200]
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        chat(mock, mock={"reset": True, "times": 1})
    assert chat(mock, mock={"reset": True, "times": 1}).status == 200
    # another request body is another request; delay/text still apply once the faults are spent
    ov = {"status": 429, "retry_after": 0, "times": 1, "text": "t"}
    assert chat(mock, mock=ov).status == 429
    assert _text(chat(mock, mock=ov)) == "t"
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        chat(mock, stream=True, mock={"cut_stream": True, "times": 1})
    assert chat(mock, stream=True, mock={"cut_stream": True, "times": 1}).events()[-1] == "[DONE]"
    admin(mock, "/_mock/reset", {})  # forgets the attempts too
    assert chat(mock, mock={"status": 500, "times": 2}).status == 500


def test_cut_stream(mock: MockThread) -> None:
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        chat(mock, stream=True, mock={"cut_stream": True})
    stream = sdk(mock).chat.completions.create(
        model="mock-model",
        messages=MSG,
        stream=True,
        extra_body={"mock": {"cut_stream": True}},
    )
    got: list[ChatCompletionChunk] = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in stream:
            got.append(chunk)
    assert got and got[0].choices[0].delta.role == "assistant"  # some chunks arrived before the cut
    assert all(c.choices[0].finish_reason is None for c in got)
    # without streaming: half of the announced body, then the connection drops
    with pytest.raises(http.client.IncompleteRead):
        chat(mock, mock={"cut_stream": True, "kb": 64})
    stats = mock.stats()
    assert stats["faults"]["cut_stream"] == 3 and stats["statuses"] == {"200": 3}


def test_random_cut_streams(mock: MockThread) -> None:
    """--cut-stream P: a share of the answers cut midway, as a "cut_stream" override cuts one."""
    admin(mock, "/_mock/config", {"cut_stream": 1.0})
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        chat(mock, stream=True)
    admin(mock, "/_mock/config", {"cut_stream": 0.5, "seed": 5})
    cut = 0
    for _ in range(40):
        try:
            chat(mock, stream=True)
        except (ConnectionError, http.client.HTTPException):
            cut += 1
    assert 5 < cut < 35
    assert mock.stats()["faults"]["cut_stream"] == cut + 1


def test_bad_requests(mock: MockThread) -> None:
    r = request(mock.url, "POST", "/v1/chat/completions", None)
    assert r.status == 400 and "error" in r.json()
    assert chat(mock, messages=[]).status == 400
    assert chat(mock, mock={"status": "x"}).status == 400
    r = request(mock.url, "GET", "/v1/nope")
    assert r.status == 404 and r.json()["error"]["message"]
    r = request(mock.url, "POST", "/_mock/config", {"no_such_knob": 1})
    assert r.status == 400


def test_down_via_config(mock: MockThread) -> None:
    assert admin(mock, "/_mock/config", {"down": True})["down"] is True
    for _ in range(3):
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            chat(mock)
    with pytest.raises(openai.APIConnectionError):
        sdk(mock).models.list()
    stats = admin(mock, "/_mock/stats")  # admin endpoints still answer
    assert stats["faults"]["down"] == 4 and stats["requests"] == 4
    admin(mock, "/_mock/config", {"down": False})
    assert chat(mock).status == 200


def test_api_key(mock: MockThread) -> None:
    admin(mock, "/_mock/config", {"api_key": "sk-secret", "echo_headers_in_errors": True})
    r = chat(mock)
    assert r.status == 401 and r.json()["error"]["code"] == "invalid_api_key"
    body = {"model": "mock-model", "messages": MSG}
    r = post(mock, "/chat/completions", body, {"Authorization": "Bearer wrong"})
    assert r.status == 401
    assert r.json()["error"]["request_headers"]["Authorization"] == "Bearer wrong"  # echoed on purpose
    with pytest.raises(openai.AuthenticationError):
        sdk(mock, api_key="nope").models.list()
    ok = sdk(mock, api_key="sk-secret").chat.completions.create(model="mock-model", messages=MSG)
    assert ok.choices[0].message.content
    assert mock.stats()["auth_headers_seen"] == 3


def test_unknown_model(mock: MockThread) -> None:
    r = post(mock, "/chat/completions", {"model": "gpt-nope", "messages": MSG})
    assert r.status == 404
    err = r.json()["error"]
    assert err["code"] == "model_not_found" and err["type"] == "invalid_request_error" and "gpt-nope" in err["message"]
    assert post(mock, "/embeddings", {"model": "gpt-nope", "input": "x"}).status == 404
    with pytest.raises(openai.NotFoundError):
        sdk(mock).chat.completions.create(model="gpt-nope", messages=MSG)


@pytest.mark.parametrize("kb", [1, 64, 1024])
def test_response_kb_sizing(mock: MockThread, kb: int) -> None:
    admin(mock, "/_mock/config", {"response_kb": kb})
    r = chat(mock)
    assert abs(len(r.body) - kb * 1024) <= 0.1 * kb * 1024
    ChatCompletion.model_validate(r.json())
    streamed = chat(mock, stream=True).events()
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in streamed[:-1]) == _text(r)
    c = post(mock, "/completions", {"model": "mock-model", "prompt": "p"})
    assert abs(len(c.body) - kb * 1024) <= 0.1 * kb * 1024


# ---------------------------------------------------------------------------------------------- stats, latency


def test_stats_and_reset(mock: MockThread) -> None:
    admin(mock, "/_mock/reset", {})
    results: list[int] = []

    def slow() -> None:
        results.append(chat(mock, mock={"delay_s": 0.6}).status)

    threads = [threading.Thread(target=slow) for _ in range(5)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 0.5
    while admin(mock, "/_mock/stats")["in_flight"] < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert admin(mock, "/_mock/stats")["in_flight"] == 5
    for t in threads:
        t.join()
    post(mock, "/embeddings", {"model": "mock-model", "input": "x"}, {"Authorization": "Bearer k"})
    s = mock.stats()
    assert s == admin(mock, "/_mock/stats") | {"arrivals": s["arrivals"]}
    assert results == [200] * 5
    assert s["requests"] == 6 and s["in_flight"] == 0 and s["max_in_flight"] == 5
    assert s["by_path"] == {"/v1/chat/completions": 5, "/v1/embeddings": 1}
    assert s["statuses"] == {"200": 6} and s["auth_headers_seen"] == 1
    assert len(s["arrivals"]) == 6 and all(abs(a - time.time()) < 60 for a in s["arrivals"])
    admin(mock, "/_mock/reset", {})
    s = mock.stats()
    assert s["requests"] == 0 and s["arrivals"] == [] and s["statuses"] == {}


def test_latency_knob(mock: MockThread) -> None:
    admin(mock, "/_mock/config", {"latency_ms": 100, "jitter_ms": 20})
    t0 = time.monotonic()
    assert chat(mock).status == 200
    assert 0.075 <= time.monotonic() - t0 < 1.0


def test_configure_from_thread(mock: MockThread) -> None:
    cfg = mock.configure(fail_500=1.0)
    assert cfg.fail_500 == 1.0 and chat(mock).status == 500
    mock.configure(fail_500=0.0)
    assert chat(mock).status == 200


# ---------------------------------------------------------------------------------------------- other runners


def test_start_mock_on_plain_asyncio_loop() -> None:
    async def main() -> None:
        server = await start_mock(MockConfig(reset=0.0))
        try:
            assert server.url == f"http://127.0.0.1:{server.port}/v1"
            async with aiohttp.ClientSession() as s:
                body = {"model": "mock-model", "messages": MSG}
                async with s.post(server.url + "/chat/completions", json=body) as r:
                    ChatCompletion.model_validate(await r.json())
                server.configure(reset=1.0)
                with pytest.raises(aiohttp.ClientError):
                    async with s.post(server.url + "/chat/completions", json=body) as r:
                        await r.read()
            assert server.stats.requests == 2 and server.stats.faults == {"reset": 1}
        finally:
            await server.close()

    asyncio.run(main())


def test_serve_forever_prints_url() -> None:
    code = "from evalsup.mock import MockConfig, serve_forever\nserve_forever(MockConfig(), '127.0.0.1', 0)\n"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line.startswith("mock endpoint on http://127.0.0.1:") and line.endswith("/v1")
            port = int(line.rsplit(":", 1)[1].split("/")[0])
            r = request(f"http://127.0.0.1:{port}/v1", "GET", "/v1/models")
            assert r.status == 200 and r.json()["data"][0]["id"] == "mock-model"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_client_going_away_mid_response_is_quiet(mock: MockThread, caplog: pytest.LogCaptureFixture) -> None:
    u = urlsplit(mock.url)
    for stream in (False, True):
        body = json.dumps({"model": "mock-model", "messages": MSG, "stream": stream, "mock": {"kb": 16384}}).encode()
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.read(1000)
        assert conn.sock is not None
        conn.sock.close()
        conn.close()
    deadline = time.monotonic() + 5
    while mock.stats()["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mock.stats()["faults"].get("client_gone") == 2
    assert chat(mock).status == 200
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def _leave_early(mock: MockThread, body: dict[str, Any]) -> None:
    """Send a chat request and go away before its answer (a hedge's losing copy, a client's timeout)."""
    u = urlsplit(mock.url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=0.3)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json"})
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()


def test_a_held_request_whose_client_leaves_is_billed_all_the_same() -> None:
    """A provider bills a request it began generating even if the client goes away (issue 40): the mock bills a
    request of its slow share once the client left it, without waiting out the hold, and sends nothing; one it
    would have failed (an override's 500) is not billed."""
    with MockThread(MockConfig(slow=1.0, slow_ms=60_000, bill=True)) as m:
        _leave_early(m, {"model": "mock-model", "messages": MSG})
        _leave_early(m, {"model": "mock-model", "messages": [{"role": "user", "content": "fails"}],
                         "mock": {"status": 500}})
        deadline = time.monotonic() + 10
        while m.stats()["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.02)
        st = m.stats()
    assert st["in_flight"] == 0  # not held the minute out
    assert st["faults"].get("slow") == 2 and st["statuses"] == {}  # nothing answered
    assert st["billed"]["mock-model"]["answers"] == 1 and st["billed_keys"] == {MSG[0]["content"]: 1}


def test_cached_prompt_tokens_and_the_service_tier(mock: MockThread) -> None:
    """``cached``: that share of the prompt reported read from the provider's cache, in chat's usage (a stream's
    usage chunk too) and the Responses API's; a tier asked is echoed, as OpenAI does."""
    mock.configure(cached=0.5)
    c = ChatCompletion.model_validate(chat(mock, service_tier="flex").json())
    assert c.service_tier == "flex" and c.usage is not None and c.usage.prompt_tokens_details is not None
    assert c.usage.prompt_tokens_details.cached_tokens == c.usage.prompt_tokens // 2
    events = chat(mock, stream=True, stream_options={"include_usage": True}, service_tier="flex").events()
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]
    assert all(x.service_tier == "flex" for x in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.model_dump() == c.usage.model_dump()
    r = request(mock.url, "POST", "/v1/responses", {"model": "mock-model", "input": "What is 2+2? " * 10})
    usage = r.json()["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] == usage["input_tokens"] // 2
    mock.configure(cached=0.0)  # (the default)
    plain = chat(mock).json()
    assert "prompt_tokens_details" not in plain["usage"] and "service_tier" not in plain  # as before: no details


def test_prompt_tokens_reported_written_to_the_cache(mock: MockThread) -> None:
    """``written``: that share of the prompt reported written to the provider's cache (``cache_write_tokens``, as
    evalsup reads it: ``tasks.billed``) whatever the request marked, beside the share read from it."""
    mock.configure(cached=0.5, written=0.25)
    usage = chat(mock).json()["usage"]
    pt = usage["prompt_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": pt // 2, "cache_write_tokens": pt // 4}
    assert billed(usage).written == pt // 4 and billed(usage).cached == pt // 2
    r = request(mock.url, "POST", "/v1/responses", {"model": "mock-model", "input": "What is 2+2? " * 10})
    details = r.json()["usage"]["input_tokens_details"]
    assert details["cache_write_tokens"] == r.json()["usage"]["input_tokens"] // 4
    mock.configure(cached=0.0, written=1.0)
    usage = chat(mock).json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": usage["prompt_tokens"]}
