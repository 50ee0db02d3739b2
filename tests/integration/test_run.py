"""`evalsup run` end to end: real worker processes, real pipes, real HTTP against the mock on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, read_results, run_cli, write_tasks


def test_2000_tasks_4_workers_exactly_once(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2000)
    r = run_cli("run", "--workers", "4", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tasks.run"
    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(2000)})
    pids = set()
    for rec in recs:
        assert set(rec) >= {"id", "custom_id", "response", "error", "metrics"}
        assert rec["error"] is None
        assert rec["response"]["status_code"] == 200
        assert rec["response"]["request_id"]
        ChatCompletion.model_validate(rec["response"]["body"])
        assert rec["metrics"]["attempts"] == 1
        assert rec["metrics"]["latency_s"] > 0
        pids.add(rec["metrics"]["worker"])
    assert len(pids) == 4, f"work went to {len(pids)} workers"
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["total"] == summary["succeeded"] == 2000
    assert summary["failed"] == 0
    assert summary["workers"] == 4 and summary["worker_restarts"] == 0
    assert summary["latency_s"]["p50"] <= summary["latency_s"]["p90"] <= summary["latency_s"]["p99"]
    assert summary["requests_per_s"] > 0 and summary["wall_s"] > 0
    assert summary["peak_rss_mb"]["worker_max"] > 0 and summary["peak_rss_mb"]["total"] >= \
        summary["peak_rss_mb"]["supervisor"]
    assert "2,000 done" in r.stdout  # the table


def test_a_run_too_short_for_a_memory_sample_says_so(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 5)
    r = run_cli("run", "-w", "1", "--monitor-interval", "60", "--model", "mock-model", "--base-url", mock.url,
                str(tasks))
    assert r.returncode == 0, r.stderr
    summary = orjson.loads((tmp_path / "tasks.run" / "summary.json").read_bytes())
    assert summary["total"] == 5
    # no sample was taken: no figure, rather than a peak of 0 MB
    assert summary["peak_rss_mb"] == {"supervisor": None, "worker_max": None, "total": None}
    assert "not sampled" in r.stdout and "0 MB" not in r.stdout


def test_batch_form_all_endpoints_and_metadata(tmp_path: Path, mock: MockThread) -> None:
    lines = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}, "expected": "A"},
        {"custom_id": "comp", "method": "POST", "url": "/v1/completions",
         "body": {"model": "mock-model", "prompt": "hi"}, "metadata": {"k": 1}},
        {"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {"model": "mock-model", "input": "hi"}},
        {"id": "simple", "prompt": "hello", "expected": "B", "choices": ["A", "B"]},
    ]
    tasks = tmp_path / "batch.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b"\n\n")  # blank lines are skipped
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "batch.run")}
    assert set(recs) == {"chat", "comp", "emb", "simple"}
    ChatCompletion.model_validate(recs["chat"]["response"]["body"])
    Completion.model_validate(recs["comp"]["response"]["body"])
    CreateEmbeddingResponse.model_validate(recs["emb"]["response"]["body"])
    ChatCompletion.model_validate(recs["simple"]["response"]["body"])
    assert recs["chat"]["metadata"] == {"expected": "A"}
    assert recs["comp"]["metadata"] == {"k": 1}  # the line's own metadata, as given
    assert "metadata" not in recs["emb"]
    assert recs["simple"]["metadata"] == {"expected": "B", "choices": ["A", "B"]}


def test_base_url_with_v1_is_not_doubled_and_api_key_is_sent(tmp_path: Path) -> None:
    from evalsup.mock.server import MockConfig

    with MockThread(MockConfig(api_key="sk-test-secret-123")) as m:
        tasks = write_tasks(tmp_path / "t.jsonl", 20, form="prompt")
        r = run_cli("run", "--model", "mock-model", str(tasks), env={"OPENAI_BASE_URL": m.url + "/",
                                                                     "OPENAI_API_KEY": "sk-test-secret-123"})
        assert r.returncode == 0, r.stderr
        recs = read_results(tmp_path / "t.run")
        assert all(x["response"]["status_code"] == 200 for x in recs)
        assert m.stats()["auth_headers_seen"] >= 20
        for f in (tmp_path / "t.run").iterdir():
            assert b"sk-test-secret-123" not in f.read_bytes(), f.name
        assert "sk-test-secret-123" not in r.stdout + r.stderr


def test_no_endpoint_is_a_one_line_error(tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 3)
    r = run_cli("run", str(tasks))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert "OPENAI_BASE_URL" in r.stderr and "--base-url" in r.stderr and "evalsup demo" in r.stderr


BAD_LINES = [
    (b'{"id": "x", "messages": [', "malformed JSON"),
    (b'{"id": "x", "prompt": "caf\xe9"}', "invalid UTF-8"),
    (b'["not", "an", "object"]', "must be a JSON object"),
    (b'{"prompt": "no id"}', "missing id"),
    (b'{"id": "t3", "prompt": "dup"}', "duplicate id 't3'"),
    (b'{"id": "huge", "prompt": "' + b"x" * 300_000 + b'"}', "longer than --max-line-mb 0.25"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_bad_line_stops_with_file_and_line(tmp_path: Path, mock: MockThread, bad: bytes, message: str) -> None:
    """Found by the pre-scan before any request (issue 28): no request reaches the endpoint, nothing is
    written; the line is named the same way, and a rerun meets it again."""
    tasks = write_tasks(tmp_path / "t.jsonl", 300)
    data = tasks.read_bytes().splitlines(keepends=True)
    data.insert(250, bad + b"\n")  # line 251
    tasks.write_bytes(b"".join(data))
    r = run_cli("run", "--max-line-mb", "0.25", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 2, r.stderr
    err_lines = [x for x in r.stderr.splitlines() if f"{tasks}:251:" in x]
    assert len(err_lines) == 1 and message in err_lines[0], r.stderr
    assert r.stderr.count("\n") == 1 and "--on-invalid skip" in r.stderr, r.stderr
    assert mock.stats()["requests"] == 0  # not even the endpoint check
    assert not (tmp_path / "t.run").exists()
    again = run_cli("run", "--max-line-mb", "0.25", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert again.returncode == 2 and f"{tasks}:251:" in again.stderr, again.stderr


def test_on_invalid_skip_records_bad_lines(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 100)
    data = tasks.read_bytes().splitlines(keepends=True)
    for pos, (bad, _) in zip((10, 20, 30, 40, 50, 60), BAD_LINES, strict=True):
        data.insert(pos, bad + b"\n")
    tasks.write_bytes(b"".join(data))
    r = run_cli("run", "--on-invalid", "skip", "--max-line-mb", "0.25", "--model", "mock-model",
                "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(100)})
    invalid = [orjson.loads(x) for x in (tmp_path / "t.run" / "invalid.jsonl").read_bytes().splitlines()]
    assert [x["line"] for x in invalid] == [11, 21, 31, 41, 51, 61]
    assert orjson.loads((tmp_path / "t.run" / "summary.json").read_bytes())["invalid"] == 6
    # the pre-scan counted them before the first request, in one line
    said = [x for x in r.stderr.splitlines() if "bad lines of" in x]
    assert len(said) == 1 and said[0].startswith(
        f"evalsup: {tasks}: 6 bad lines of 106 will be skipped (--on-invalid skip; recorded in invalid.jsonl as "
        "the run reads them); the first: line 11: malformed JSON"), r.stderr


def _children(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _start_slow_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run],
                    n: int = 3000) -> tuple[Run, list[int]]:
    tasks = write_tasks(tmp_path / "t.jsonl", n, extra={"mock": {"delay_s": 0.2}})
    # -c 64: a fixed pace (the default is adaptive since issue 21), slow enough to be interrupted mid-run
    p = start("run", "-w", "3", "-c", "64", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    deadline = time.monotonic() + 20
    workers: list[int] = []
    while time.monotonic() < deadline and len(workers) < 3:
        time.sleep(0.2)
        workers = _children(p.pid)
    assert len(workers) == 3
    while not (tmp_path / "t.run" / "results.jsonl").exists() or \
            (tmp_path / "t.run" / "results.jsonl").stat().st_size == 0:
        time.sleep(0.1)
        assert time.monotonic() < deadline + 20
    return p, workers


def test_killing_supervisor_leaves_no_worker(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    p, workers = _start_slow_run(tmp_path, mock, start)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert _wait_gone(workers) == [], "workers outlived their supervisor"


def test_ctrl_c_stops_cleanly(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    p, workers = _start_slow_run(tmp_path, mock, start)
    os.kill(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 75, err  # resumable (evalsup.config.exitcodes.RESUMABLE)
    assert "Traceback" not in err
    assert "resume" in err
    assert _wait_gone(workers) == []
    recs = read_results(tmp_path / "t.run")  # every line complete and parseable
    assert len(recs) == len({x["custom_id"] for x in recs}) > 0
