"""Automatic worker count: without --workers a run starts with one worker and adds workers only while each
one is CPU-bound (supervisor.scaling). Real runs, real worker processes, CPU measured from /proc. In the slow
tier, which runs one test at a time: a worker is added only while the host has a core to spare, which another
test running beside it would take."""

from __future__ import annotations

from pathlib import Path

import orjson

from evalsup.mock.server import MockThread
from tests.harness import ROOT, assert_exactly_once, run_cli, summary, write_tasks

BURN = str(ROOT / "tests" / "plugins" / "busy.py") + ":burn"


def test_cpu_bound_worker_gets_company_and_every_result_is_written_once(tmp_path: Path, mock: MockThread) -> None:
    # 4 ms of CPU per task on top of the request: one worker cannot keep up with 32 requests in flight at 5 ms
    tasks = write_tasks(tmp_path / "t.jsonl", 2500)
    run = tmp_path / "run"
    p = run_cli("run", str(tasks), "--base-url", mock.url, "--model", "mock-model", "--concurrency", "32",
                "--out", str(run), "--worker-plugin", BURN, "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    s = summary(run)
    assert s["workers"] >= 2 and s["workers_added"] >= 1, s  # type: ignore[operator]
    assert s["workers"] <= s["max_workers"]  # type: ignore[operator]
    events = [orjson.loads(line) for line in (run / "events.jsonl").read_bytes().splitlines()]
    scale = [e for e in events if e["event"] == "scale"]
    assert scale and all(min(e["loads"]) >= 0.6 for e in scale), scale
    assert_exactly_once(run, {f"t{i}" for i in range(2500)})


def test_light_run_keeps_one_worker(tmp_path: Path, mock: MockThread) -> None:
    # ~150 requests a second of small answers: a few percent of a core; lasts long enough to be measured
    mock.configure(latency_ms=100, jitter_ms=5)
    tasks = write_tasks(tmp_path / "t.jsonl", 700)
    run = tmp_path / "run"
    p = run_cli("run", str(tasks), "--base-url", mock.url, "--model", "mock-model", "--concurrency", "16",
                "--out", str(run), "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    s = summary(run)
    assert s["workers"] == 1 and s["workers_added"] == 0, s
    assert_exactly_once(run, {f"t{i}" for i in range(700)})


def test_explicit_workers_are_kept(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 600)
    run = tmp_path / "run"
    p = run_cli("run", str(tasks), "--base-url", mock.url, "--model", "mock-model", "--workers", "3",
                "--concurrency", "32", "--out", str(run), "--worker-plugin", BURN, "--json", "--quiet")
    assert p.returncode == 0, p.stderr
    s = summary(run)
    assert s["workers"] == 3 and "workers_added" not in s, s
    assert len({r["metrics"]["worker"] for r in assert_exactly_once(run, {f"t{i}" for i in range(600)})}) == 3
