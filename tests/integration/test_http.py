"""The HTTP side against the mock's fault injection: retries, Retry-After, breaker, rate limits, streaming,
connection check and secrets. Real HTTP on 127.0.0.1, real worker processes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletion

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, lines, read_results, run_cli, summary, write_tasks


def _post(url: str, obj: dict[str, Any]) -> None:
    req = urllib.request.Request(url, data=orjson.dumps(obj), headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()






def test_429_retry_after_is_honoured(tmp_path: Path, mock: MockThread) -> None:
    tasks = lines(tmp_path / "t.jsonl", [
        {"id": f"r{i}", "prompt": f"q{i}", "mock": {"status": 429, "retry_after": 1.0, "times": 1}} for i in range(20)
    ])
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "t.run")
    assert len(recs) == 20
    for rec in recs:
        assert rec["error"] is None and rec["response"]["status_code"] == 200
        assert rec["metrics"]["attempts"] == 1, "a 429 is the server's flow control: it uses up no attempt"
        assert rec["metrics"]["total_s"] >= 1.0, "the second request came before Retry-After"
        assert rec["metrics"]["latency_s"] < rec["metrics"]["total_s"]  # the server's time: the last attempt
    assert summary(tmp_path / "t.run")["retries"] == 20


def test_failed_attempts_are_retried_400_is_final(tmp_path: Path, mock: MockThread) -> None:
    # one request in flight, so the failures below never form an outage-like run that trips the breaker
    objs: list[dict[str, Any]] = [{"id": f"a{i}", "prompt": f"q{i}", "mock": {"status": 500, "times": 2}}
                                  for i in range(4)]
    objs += [{"id": f"b{i}", "prompt": f"q{i}", "mock": {"reset": True, "times": 1}} for i in range(4)]
    objs += [{"id": "bad", "prompt": "x", "mock": {"status": 400}}]
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli("run", "-w", "1", "-c", "1", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "t.run")}
    assert len(recs) == 9
    for i in range(4):
        assert recs[f"a{i}"]["error"] is None and recs[f"a{i}"]["metrics"]["attempts"] == 3
        assert recs[f"b{i}"]["error"] is None and recs[f"b{i}"]["metrics"]["attempts"] == 2
    bad = recs["bad"]
    assert bad["metrics"]["attempts"] == 1
    assert bad["error"]["code"] == "http_400"
    assert bad["response"]["status_code"] == 400 and "error" in bad["response"]["body"]
    s = summary(tmp_path / "t.run")
    assert s["failed"] == 1 and s["errors"] == {"http_400": 1} and s["retries"] == 12


@pytest.mark.parametrize("fault", ["fail_500", "reset"])
def test_burst_of_500s_or_resets_is_ridden_out(tmp_path: Path, mock: MockThread, fault: str,
                                                start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 800, extra={"mock": {"delay_s": 0.05}})  # ~2.5 s of work
    p = start("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    results = tmp_path / "t.run" / "results.jsonl"
    deadline = time.monotonic() + 30
    while not results.exists() or results.stat().st_size < 10_000:
        assert time.monotonic() < deadline and p.running()
        time.sleep(0.05)
    mock.configure(**{fault: 1.0})  # every request fails for a second and a half
    time.sleep(1.5)
    mock.configure(**{fault: 0.0})
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    recs = read_results(tmp_path / "t.run")
    assert len(recs) == 800 and all(x["error"] is None for x in recs)
    assert summary(tmp_path / "t.run")["retries"] > 0


def test_random_faults_all_recover(tmp_path: Path) -> None:
    with MockThread(MockConfig(fail_500=0.15, fail_429=0.1, retry_after_s=0.05, reset=0.05, malformed=0.05,
                               seed=3)) as m:
        tasks = write_tasks(tmp_path / "t.jsonl", 150)
        r = run_cli("run", "-w", "2", "--max-attempts", "12", "--model", "mock-model", "--base-url", m.url, str(tasks))
        assert r.returncode == 0, r.stderr
        recs = read_results(tmp_path / "t.run")
        assert len(recs) == 150 and all(x["error"] is None for x in recs)
        for x in recs:
            ChatCompletion.model_validate(x["response"]["body"])
        assert summary(tmp_path / "t.run")["retries"] > 0


def test_endpoint_outage_opens_breaker_and_fails_nothing(tmp_path: Path, mock: MockThread,
                                                          start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 600, extra={"mock": {"delay_s": 0.05}})
    p = start("run", "-w", "2", "-c", "16", "--max-attempts", "3", "--model", "mock-model", "--base-url", mock.url,
              str(tasks))
    results = tmp_path / "t.run" / "results.jsonl"
    deadline = time.monotonic() + 30
    while not results.exists() or results.stat().st_size < 20_000:
        assert time.monotonic() < deadline and p.running()
        time.sleep(0.05)
    _post(mock.url.replace("/v1", "/_mock/config"), {"down": True})
    time.sleep(2.5)
    during = len(read_results(tmp_path / "t.run")) if results.exists() else 0
    _post(mock.url.replace("/v1", "/_mock/config"), {"down": False})
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    recs = read_results(tmp_path / "t.run")
    assert len(recs) == 600 and during < 600
    failed = [x for x in recs if x["error"] is not None]
    assert failed == [], failed[:3]
    s = summary(tmp_path / "t.run")
    assert s["breaker"]["opened"] >= 1 and s["breaker"]["down_s"] > 1.0
    assert "endpoint looks down" in err and "endpoint is back" in err


def test_global_rate_limit_across_workers(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 200)
    _post(mock.url.replace("/v1", "/_mock/reset"), {})
    r = run_cli("run", "-w", "4", "-c", "64", "--max-requests-per-s", "50", "--no-check", "--model", "mock-model",
                "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    arrivals = sorted(mock.stats()["arrivals"])
    assert len(arrivals) == 200
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert rate <= 50 * 1.1, f"{rate:.1f} requests/s against a limit of 50"
    # and no one-second window holds much more than the limit (each worker's first slot may coincide)
    worst = max(sum(1 for b in arrivals if a <= b < a + 1.0) for a in arrivals)
    assert worst <= 50 + 4 + 2, worst


def test_streaming_ttft_and_reassembled_body(tmp_path: Path, mock: MockThread) -> None:
    objs = [{"custom_id": f"s{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}]}} for i in range(20)]
    plain = lines(tmp_path / "plain.jsonl", objs)
    streamed = lines(tmp_path / "stream.jsonl", objs)
    assert run_cli("run", "--base-url", mock.url, str(plain)).returncode == 0
    r = run_cli("run", "--stream", "--base-url", mock.url, str(streamed))
    assert r.returncode == 0, r.stderr
    a = {x["custom_id"]: x for x in read_results(tmp_path / "plain.run")}
    b = {x["custom_id"]: x for x in read_results(tmp_path / "stream.run")}
    for cid, rec in b.items():
        body = rec["response"]["body"]
        ChatCompletion.model_validate(body)
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"] == a[cid]["response"]["body"]["choices"][0]["message"]
        assert body["choices"][0]["finish_reason"] == a[cid]["response"]["body"]["choices"][0]["finish_reason"]
        assert body["usage"] == a[cid]["response"]["body"]["usage"]
        assert 0 < rec["metrics"]["ttft_s"] <= rec["metrics"]["latency_s"]
    s = summary(tmp_path / "stream.run")
    assert s["ttft_s"]["p50"] is not None and s["tokens"]["completion"] > 0


def test_cut_stream_is_retried_never_written_as_success(tmp_path: Path, mock: MockThread) -> None:
    objs = [{"id": f"c{i}", "prompt": f"q{i}", "mock": {"cut_stream": True, "times": 1}} for i in range(10)]
    objs.append({"id": "always-cut", "prompt": "x", "mock": {"cut_stream": True}})
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli("run", "--stream", "--max-attempts", "3", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "t.run")}
    for i in range(10):
        assert recs[f"c{i}"]["error"] is None and recs[f"c{i}"]["metrics"]["attempts"] == 2
    cut = recs["always-cut"]
    assert cut["error"]["code"] == "stream_cut" and cut["metrics"]["attempts"] == 3
    assert cut["response"] is None


@pytest.mark.parametrize("case", ["unreachable", "401", "unknown-model"])
def test_connection_check_stops_before_any_task(tmp_path: Path, case: str) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 5)
    with MockThread(MockConfig(api_key="right-key")) as m:
        url, model, env = m.url, "mock-model", {"OPENAI_API_KEY": "right-key"}
        if case == "unreachable":
            url = "http://127.0.0.1:9/v1"
        elif case == "401":
            env = {"OPENAI_API_KEY": "wrong-key-value"}
        else:
            model = "no-such-model"
        r = run_cli("run", "--model", model, "--base-url", url, str(tasks), env=env)
        assert r.returncode == 2
        assert m.stats()["by_path"].get("/v1/chat/completions", 0) == 0
    msg = r.stderr.strip().splitlines()[-1]
    assert {"unreachable": "cannot reach", "401": "refused the API key", "unknown-model": "no-such-model"}[case] in msg
    assert "wrong-key-value" not in r.stderr
    assert not (tmp_path / "t.run" / "results.jsonl").exists()


def test_api_key_never_written_even_when_echoed(tmp_path: Path) -> None:
    secret = "sk-live-very-secret-0123456789"
    with MockThread(MockConfig(api_key=secret, echo_headers_in_errors=True)) as m:
        objs = [{"id": f"e{i}", "prompt": "x", "mock": {"status": 400}} for i in range(5)]
        objs += [{"id": f"o{i}", "prompt": "x"} for i in range(5)]
        tasks = lines(tmp_path / "t.jsonl", objs)
        r = run_cli("run", "--model", "mock-model", "--base-url", m.url, str(tasks), env={"OPENAI_API_KEY": secret})
        assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    for f in (tmp_path / "t.run").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    recs = read_results(tmp_path / "t.run")
    assert sum(1 for x in recs if x["error"]) == 5


def test_max_response_mb_makes_an_error_record(tmp_path: Path, mock: MockThread) -> None:
    tasks = lines(tmp_path / "t.jsonl", [{"id": "big", "prompt": "x", "mock": {"kb": 2048}},
                                          {"id": "small", "prompt": "y"}])
    r = run_cli("run", "--max-response-mb", "1", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "t.run")}
    assert recs["big"]["error"]["code"] == "response_too_large"
    assert recs["small"]["error"] is None


