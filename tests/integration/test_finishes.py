"""Every run finishes (issue 18): a task that always fails for itself, rate-limit storms, a key revoked mid-run,
a frozen process tree, and 200 answers that are not answers. Real processes, real HTTP on 127.0.0.1."""

from __future__ import annotations

import http.server
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, assert_exactly_once, lines, read_results, run_cli, summary

POISON = {"500": {"status": 500}, "reset": {"reset": True}, "slow": {"delay_s": 5.0},
          "cut": {"cut_stream": True}}
CODES = {"500": "http_500", "reset": "connection_error", "slow": "timeout_total", "cut": "stream_cut"}






# each fault once as a block of 20 in 220 (the hardest: the breaker sees many distinct tasks fail), and the
# placements alone and at the end with the always-500 task
@pytest.mark.parametrize(("fault", "where"), [("500", "alone"), ("500", "end"), ("500", "block"), ("reset", "block"),
                                              ("slow", "block"), ("cut", "block")])
def test_a_task_that_always_fails_gets_its_record_and_the_run_ends(tmp_path: Path, mock: MockThread, fault: str,
                                                                   where: str) -> None:
    healthy = 0 if where == "alone" else 200
    bad = 20 if where == "block" else 1
    rows = [{"id": f"ok{i}", "prompt": f"q{i}"} for i in range(healthy)]
    poison = [{"id": f"bad{i}", "prompt": f"p{i}", "mock": POISON[fault]} for i in range(bad)]
    at = {"alone": 0, "end": len(rows), "block": 100}[where]
    rows[at:at] = poison
    tasks = lines(tmp_path / "t.jsonl", rows)
    extra = ["--timeout", "1"] if fault == "slow" else ["--stream"] if fault == "cut" else []
    t0 = time.monotonic()
    r = run_cli("run", "-w", "2", "-c", "16", "--max-attempts", "3", "--model", "mock-model", "--base-url", mock.url,
                *extra, str(tasks), timeout=180)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", {str(o["id"]) for o in rows})}
    assert all(recs[f"ok{i}"]["error"] is None for i in range(healthy))
    for i in range(bad):
        rec = recs[f"bad{i}"]
        assert rec["error"]["code"] == CODES[fault], rec["error"]
        assert rec["metrics"]["attempts"] == 3  # its own attempts, used up; never more than --max-attempts
    # bounded by the attempts' backoff (0.5 + 1 s at most) and timeouts, not by --max-wait-down (600 s)
    assert took < 60, f"took {took:.0f}s"


def test_attempts_never_exceed_max_attempts_through_false_alarms(tmp_path: Path, mock: MockThread) -> None:
    rows = [{"id": f"bad{i}", "prompt": f"p{i}", "mock": {"status": 502}} for i in range(30)]
    tasks = lines(tmp_path / "t.jsonl", rows)
    r = run_cli("run", "-w", "1", "-c", "30", "--max-attempts", "2", "--model", "mock-model", "--base-url", mock.url,
                str(tasks), timeout=120)
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "t.run")
    assert len(recs) == 30 and {x["metrics"]["attempts"] for x in recs} == {2}
    assert "the failures were those tasks' own" in r.stderr  # the breaker checked the endpoint: it serves


def test_rate_limit_storm_and_cut_streams_fail_nothing(tmp_path: Path) -> None:
    with MockThread(MockConfig(latency_ms=2, fail_429=0.3, retry_after_s=0.05, seed=3)) as mock:
        rows = [{"id": f"t{i}", "prompt": f"q{i}", **({"mock": {"cut_stream": True, "times": 1}} if i % 5 == 0
                                                       else {})} for i in range(500)]
        tasks = lines(tmp_path / "t.jsonl", rows)
        r = run_cli("run", "-w", "2", "--stream", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                    timeout=180)
        assert r.returncode == 0, r.stderr
        recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(500)})
        assert [x for x in recs if x["error"] is not None] == []
        assert mock.stats()["faults"].get("429", 0) > 100


def test_429s_with_500s_fail_nothing(tmp_path: Path) -> None:
    with MockThread(MockConfig(latency_ms=1, fail_429=0.25, fail_500=0.10, retry_after_s=0.02, seed=5)) as mock:
        # the default settings (adaptive); 600 tasks rather than the 1,500, for the suite's time
        rows = [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(600)]
        tasks = lines(tmp_path / "t.jsonl", rows)
        r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks), timeout=180)
        assert r.returncode == 0, r.stderr
        recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(600)})
        assert [x for x in recs if x["error"] is not None] == []


def test_rate_limited_past_the_budget_is_a_rate_limited_record(tmp_path: Path, mock: MockThread) -> None:
    rows = [{"id": "ok", "prompt": "q"}, {"id": "limited", "prompt": "p", "mock": {"status": 429, "retry_after": 0.3}}]
    tasks = lines(tmp_path / "t.jsonl", rows)
    r = run_cli("run", "-w", "1", "--max-rate-limited-wait", "1", "--model", "mock-model", "--base-url", mock.url,
                str(tasks))
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "t.run")}
    assert recs["ok"]["error"] is None
    assert recs["limited"]["error"]["code"] == "rate_limited" and recs["limited"]["metrics"]["attempts"] == 1


def _wait_for_results(run_dir: Path, n: int, p: Run, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(read_results(run_dir)) < n if (run_dir / "results.jsonl").exists() else True:
        assert time.monotonic() < deadline and p.running(), "the run did not get going"
        time.sleep(0.05)


def test_a_key_revoked_mid_run_stops_resumably_and_fails_nothing(tmp_path: Path, start: Callable[..., Run]) -> None:
    rows = [{"id": f"t{i}", "prompt": f"q{i}", "mock": {"delay_s": 0.01}} for i in range(3000)]
    tasks = lines(tmp_path / "t.jsonl", rows)
    env = {"OPENAI_API_KEY": "sk-good"}
    with MockThread(MockConfig(latency_ms=1, api_key="sk-good")) as mock:
        args = ("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, str(tasks))
        p = start(*args, env=env)
        _wait_for_results(tmp_path / "t.run", 200, p)
        mock.configure(api_key="sk-rotated")  # the key in use is revoked
        _, err = p.communicate(timeout=60)
        assert p.returncode == 75, err
        assert "refused the API key" in err and "rerun" in err
        recs = read_results(tmp_path / "t.run")
        assert recs and all(x["error"] is None for x in recs), [x for x in recs if x["error"]][:3]
        assert "Traceback" not in err
        mock.configure(api_key="sk-good")  # a good key: the rerun carries on
        r = run_cli(*args, env=env)
        assert r.returncode == 0, r.stderr
        recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(3000)})
        assert all(x["error"] is None for x in recs)


@pytest.mark.parametrize("c", ["1", "16"])
def test_a_task_refused_for_itself_gets_its_record_and_the_run_finishes(tmp_path: Path, mock: MockThread,
                                                                         c: str) -> None:
    # a 403 (say a gateway's rule on that prompt) and a 401 on the very last task: no request of the run follows
    # them, and at -c 1 nothing else is in flight to vouch for the key; the key check (a request of evalsup's own)
    # shows the key is taken, so each is that task's own record, not a stopped run
    rows: list[dict[str, Any]] = [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(40)]
    rows.insert(20, {"id": "own", "prompt": "p", "mock": {"status": 403}})
    rows.append({"id": "last", "prompt": "p", "mock": {"status": 401}})
    tasks = lines(tmp_path / "t.jsonl", rows)
    r = run_cli("run", "-w", "1", "-c", c, "--model", "mock-model", "--base-url", mock.url, str(tasks), timeout=60)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", {str(o["id"]) for o in rows})}
    assert recs["own"]["error"]["evalsup_code"] == "http_403" and recs["last"]["error"]["evalsup_code"] == "http_401"
    assert sorted(k for k, x in recs.items() if x["error"] is not None) == ["last", "own"]
    assert "refused the API key" not in r.stderr


def test_a_frozen_and_thawed_tree_keeps_its_workers(tmp_path: Path, mock: MockThread,
                                                     start: Callable[..., Run]) -> None:
    rows = [{"id": f"t{i}", "prompt": f"q{i}", "mock": {"delay_s": 0.02}} for i in range(900)]
    tasks = lines(tmp_path / "t.jsonl", rows)
    p = start("run", "-w", "2", "-c", "8", "--hang-timeout", "2", "--model", "mock-model", "--base-url", mock.url,
              str(tasks))
    _wait_for_results(tmp_path / "t.run", 100, p)
    p.signal_group(signal.SIGSTOP)  # as docker pause freezes the container's processes
    time.sleep(4)
    p.signal_group(signal.SIGCONT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(900)})
    s = summary(tmp_path / "t.run")
    assert s["worker_restarts"] == 0, err
    assert "hung" not in err


class _JsonServer(http.server.BaseHTTPRequestHandler):
    def answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    def do_POST(self) -> None:
        status, body = self.answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class _NotAnAnswer(_JsonServer):
    def answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        return 200, {"id": "x", "object": "chat.completion", "model": "m"}  # no "choices"


@pytest.fixture
def not_an_answer() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAnAnswer)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_a_200_without_choices_is_an_invalid_response_record(tmp_path: Path, not_an_answer: str) -> None:
    tasks = lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(3)])
    r = run_cli("run", "-w", "1", "-c", "1", "--no-check", "--max-attempts", "2", "--model", "m", "--base-url",
                not_an_answer, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "t.run")
    assert len(recs) == 3
    for rec in recs:
        assert rec["error"]["code"] == "invalid_response" and rec["metrics"]["attempts"] == 2
    assert summary(tmp_path / "t.run")["succeeded"] == 0


class _RefusesThenFalls(_JsonServer):
    """Answers tasks, refuses the one asking "bad" (401), and gives 500 to everything else: evalsup's own
    requests (the key check, the breaker's probe) find a server that has just gone wrong."""

    def answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        status, body = 200, {"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
        if b'"bad"' in raw:
            status, body = 401, {"error": {"message": "no", "type": "invalid_request_error", "code": "x"}}
        elif b'"q' not in raw:
            status, body = 500, {"error": {"message": "broken", "type": "server_error"}}
        return status, body


def test_a_refusal_whose_key_check_finds_the_server_down_still_ends_the_run(tmp_path: Path) -> None:
    # the last task is refused and the key check gets no verdict (500s): the endpoint is tripped as down, and
    # --max-wait-down ends the run resumably rather than the task waiting for a verdict for ever
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusesThenFalls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rows = [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(5)] + [{"id": "bad", "prompt": "bad"}]
        tasks = lines(tmp_path / "t.jsonl", rows)
        r = run_cli("run", "-w", "1", "-c", "1", "--no-check", "--max-wait-down", "1", "--model", "m",
                    "--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1", str(tasks), timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 75, r.stderr
    assert "--max-wait-down" in r.stderr.strip().splitlines()[-1], r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "t.run")}
    assert sorted(recs) == [f"t{i}" for i in range(5)] and all(x["error"] is None for x in recs.values()), r.stderr
