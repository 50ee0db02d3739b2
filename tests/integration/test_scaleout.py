"""Sharding (--shard K/N and auto), merge with a coverage check, and the deployment files."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from evalsup.config.run_config import ConfigError, parse_shard
from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, read_results, run_cli, write_tasks


def _run(tasks: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", url, str(tasks), *args)


def test_three_shards_and_merge_equal_one_run(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 900)
    data = tasks.read_bytes().splitlines(keepends=True)
    data.insert(100, b"\n")  # a blank line does not shift the numbering
    tasks.write_bytes(b"".join(data))
    for k in range(3):
        r = _run(tasks, mock.url, "--shard", f"{k}/3")
        assert r.returncode == 0, r.stderr
        shard_ids = {x["custom_id"] for x in read_results(tmp_path / "tasks.run" / f"shard-{k}-of-3")}
        assert shard_ids == {f"t{i}" for i in range(900) if i % 3 == k}
    r = _run(tasks, mock.url, "--out", str(tmp_path / "single"))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "merged.jsonl"
    m = run_cli("merge", str(tmp_path / "tasks.run"), "--tasks", str(tasks), "-o", str(out))
    assert m.returncode == 0, m.stderr
    merged = [orjson.loads(x)["custom_id"] for x in out.read_bytes().splitlines()]
    single = [x["custom_id"] for x in read_results(tmp_path / "single")]
    assert sorted(merged) == sorted(single) and len(set(merged)) == 900
    summary = orjson.loads((tmp_path / "merged.summary.json").read_bytes())
    assert summary["total"] == 900 and summary["complete"] and len(summary["shards"]) == 3
    # --sort restores input order
    m = run_cli("merge", str(tmp_path / "tasks.run"), "--tasks", str(tasks), "--sort", "-o", str(out))
    assert m.returncode == 0, m.stderr
    assert [orjson.loads(x)["custom_id"] for x in out.read_bytes().splitlines()] == [f"t{i}" for i in range(900)]


def test_merge_reports_missing_shard_and_duplicates(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 60)
    for k in (0, 1):
        assert _run(tasks, mock.url, "--shard", f"{k}/3").returncode == 0
    out = tmp_path / "m.jsonl"
    m = run_cli("merge", str(tmp_path / "tasks.run"), "--tasks", str(tasks), "-o", str(out))
    assert m.returncode == 1
    assert "shard-2-of-3: missing (0/20 done)" in m.stderr, m.stderr
    assert not out.exists()
    # duplicated ids: the three shards and a whole run of the same input besides
    assert _run(tasks, mock.url, "--shard", "2/3").returncode == 0
    assert _run(tasks, mock.url, "--out", str(tmp_path / "whole")).returncode == 0
    m = run_cli("merge", str(tmp_path / "tasks.run"), str(tmp_path / "whole"), "-o", str(out))
    assert m.returncode == 1 and "60 duplicated id(s)" in m.stderr and "t0" in m.stderr, m.stderr
    assert not out.exists()  # a failed merge writes nothing


def test_shard_auto_errors_name_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="EVALSUP_SHARDS"):
        parse_shard("auto", {"JOB_COMPLETION_INDEX": "1"})
    with pytest.raises(ConfigError, match="JOB_COMPLETION_INDEX"):
        parse_shard("auto", {})
    with pytest.raises(ConfigError, match="0 <= K < N"):
        parse_shard("3/3", {})
    tasks = write_tasks(tmp_path / "t.jsonl", 3)
    r = run_cli("run", "--shard", "auto", "--base-url", "http://127.0.0.1:9/v1", str(tasks))
    assert r.returncode == 2 and "SLURM_ARRAY_TASK_ID" in r.stderr
    r = run_cli("run", "--shard", "auto", "--no-check", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                str(tasks), env={"JOB_COMPLETION_INDEX": "0"})
    assert r.returncode == 2 and "EVALSUP_SHARDS" in r.stderr
    # sbatch --array=1-4 would never run shard 0: refused, saying what to set
    r = run_cli("run", "--shard", "auto", "--no-check", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                str(tasks), env={"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4",
                                 "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "4"})
    assert r.returncode == 2 and "not 0..N-1" in r.stderr and "EVALSUP_SHARDS" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "t.run").exists()


def test_killed_shard_resumes_only_its_own_tasks(tmp_path: Path, mock: MockThread,
                                                  start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 1200, extra={"mock": {"delay_s": 0.05}})
    env = {"JOB_COMPLETION_INDEX": "1", "EVALSUP_SHARDS": "2"}
    p = start("run", "-w", "2", "-c", "8", "--shard", "auto", "--model", "mock-model", "--base-url", mock.url,
              str(tasks), env=env)
    run_dir = tmp_path / "tasks.run" / "shard-1-of-2"
    deadline = time.monotonic() + 30
    while not (run_dir / "checkpoint.json").exists() or len(read_results(run_dir)) < 50:
        assert time.monotonic() < deadline and p.running()
        time.sleep(0.1)
    p.kill_group()
    r = run_cli("run", "-w", "2", "--shard", "auto", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                env=env)
    assert r.returncode == 0, r.stderr
    assert "resuming:" in r.stderr
    assert_exactly_once(run_dir, {f"t{i}" for i in range(1200) if i % 2 == 1})
    assert not (tmp_path / "tasks.run" / "shard-0-of-2").exists()
