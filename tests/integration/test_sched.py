"""Scheduler-grade runs (issue 19): one writer per run directory, exit codes a scheduler can act on, shard counts
from the environment, and a merge that proves coverage. Real processes against the mock on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from evalsup.config import exitcodes
from evalsup.mock.server import MockThread
from evalsup.rundir.lock import LOCK_NAME, RunDirBusy, RunDirLock, held_by
from tests.harness import (
    ROOT,
    Run,
    assert_exactly_once,
    env_for,
    evalsup_cmd,
    read_results,
    run_cli,
    wait_until,
    write_tasks,
)


def _chat(mock: MockThread) -> int:
    return int(mock.stats()["by_path"].get("/v1/chat/completions", 0))


# ------------------------------------------------------------------------------------------------ the lock


def test_two_runs_on_one_directory_one_runs_the_other_is_refused(tmp_path: Path, mock: MockThread,
                                                                 start: Callable[..., Run]) -> None:
    n = 300
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"delay_s": 0.02}})
    args = ("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, "--json", str(tasks))
    first = start(*args)
    time.sleep(0.3)
    second = start(*args)
    try:
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=120)
    finally:
        for p in (first, second):
            p.cleanup()
    # the first normally wins; whichever did, the other is refused at once, naming it
    (ran, out_r, _), (refused, out_x, err_x) = sorted(
        [(first, out1, err1), (second, out2, err2)], key=lambda x: x[0].returncode)
    assert (ran.returncode, refused.returncode) == (0, exitcodes.LOCKED), err1 + err2
    refusal = [x for x in err_x.splitlines() if "in use by another evalsup" in x]
    assert len(refusal) == 1 and f"PID {ran.pid}" in refusal[0] and "started" in refusal[0], err_x
    assert "Traceback" not in err_x
    assert orjson.loads(out_x)["exit_code"] == exitcodes.LOCKED
    assert orjson.loads(out_r)["exit_code"] == 0 and orjson.loads(out_r)["resumable"] is False
    assert_exactly_once(tmp_path / "tasks.run", {f"t{i}" for i in range(n)})
    assert _chat(mock) == n, "the refused run sent requests"
    assert mock.stats()["by_path"].get("/v1/models", 0) == 1, "the refused run checked the endpoint"


def test_lock_is_released_by_a_dead_holder_and_names_a_live_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "r.run"
    code = ("import sys, time; from pathlib import Path; from evalsup.rundir.lock import RunDirLock; "
            "RunDirLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([*evalsup_cmd()[:1], "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True,
                              env=env_for())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusy, match=f"PID {holder.pid}"):
            RunDirLock(run_dir).acquire()
        assert f"PID {holder.pid}" in (held_by(run_dir) or "")
    finally:
        holder.kill()  # as kill -9 would: the kernel drops the lock
        holder.wait()
    assert held_by(run_dir) is None
    lock = RunDirLock(run_dir)
    lock.acquire()
    assert orjson.loads((run_dir / LOCK_NAME).read_bytes())["pid"] == os.getpid()
    lock.release()


def test_fresh_and_score_respect_the_lock(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"delay_s": 0.05}})
    run_dir = tmp_path / "tasks.run"
    p = start("run", "-w", "1", "-c", "4", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "results.jsonl").exists() or (run_dir / "results.jsonl").stat().st_size == 0:
            assert p.running() and time.monotonic() < deadline
            time.sleep(0.05)
        r = run_cli("run", "--fresh", "--model", "mock-model", "--base-url", mock.url, str(tasks))
        assert r.returncode == exitcodes.LOCKED, r.stderr
        assert "in use by another evalsup" in r.stderr and f"PID {p.pid}" in r.stderr
        assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith("tasks.run")) == ["tasks.run"]
        s = run_cli("score", str(run_dir), "--scorer", "json_valid")
        assert s.returncode == exitcodes.LOCKED, s.stderr
        assert not (run_dir / "results.scored.jsonl").exists()
        assert p.running()
    finally:
        p.cleanup()


# ------------------------------------------------------------------------------------------- exit codes


def test_bad_settings_exit_2_and_leave_no_directory(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 5)
    r = run_cli("run", "--model", "no-such-model", "--base-url", mock.url, "--json", str(tasks))
    assert r.returncode == exitcodes.BAD_INPUT, r.stderr
    assert orjson.loads(r.stdout) | {"stopped": None, "run_dir": None} == {
        "exit_code": 2, "resumable": False, "exit_reason": "bad input or settings", "stopped": None,
        "run_dir": None}
    assert not (tmp_path / "tasks.run").exists(), "a refused run left its directory behind"


def test_endpoint_down_too_long_exits_75_and_says_so(tmp_path: Path, mock: MockThread) -> None:
    n = 200
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    mock.configure(down=True)
    r = run_cli("run", "--no-check", "--model", "mock-model", "--base-url", mock.url, "--max-wait-down", "1",
                "--json", str(tasks))
    assert r.returncode == exitcodes.RESUMABLE, r.stderr
    s = orjson.loads((tmp_path / "tasks.run" / "summary.json").read_bytes())
    assert s["exit_code"] == 75 and s["resumable"] is True and "max-wait-down" in s["stopped"]
    assert orjson.loads(r.stdout)["exit_code"] == 75
    mock.configure(down=False)
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "tasks.run", {f"t{i}" for i in range(n)})


def test_sigterm_while_starting_still_exits_75(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    """The lock is taken while workers start and before the endpoint check: a SIGTERM then is kept and handed
    to the supervisor, not fatal (143)."""
    n = 200
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    args = ("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    p = start(*args)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "tasks.run" / LOCK_NAME).exists():
            assert p.running() and time.monotonic() < deadline
            time.sleep(0.005)
        p.signal(15)
        _, err = p.communicate(timeout=60)
    finally:
        p.cleanup()
    assert p.returncode == exitcodes.RESUMABLE, err
    assert "Traceback" not in err
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "tasks.run", {f"t{i}" for i in range(n)})
    assert _chat(mock) == n


# ------------------------------------------------------------------------------------------------ shards


def test_run_directory_of_another_shard_count_is_refused(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40)
    out = tmp_path / "mine"
    base = ("run", "--model", "mock-model", "--base-url", mock.url, "--out", str(out))
    assert run_cli(*base, "--shard", "1/4", str(tasks)).returncode == 0
    before = (out / "results.jsonl").read_bytes()
    r = run_cli(*base, "--shard", "1/2", str(tasks))
    assert r.returncode == exitcodes.BAD_INPUT, r.stderr
    assert "created for shard 1 of 4" in r.stderr and "changed" not in r.stderr, r.stderr
    assert (out / "results.jsonl").read_bytes() == before
    # Slurm resubmission of one index with EVALSUP_SHARDS: the same shard, resumed (here: already finished)
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "1",
           "SLURM_ARRAY_TASK_COUNT": "1", "EVALSUP_SHARDS": "4"}
    r = run_cli(*base, "--shard", "auto", str(tasks), env=env)
    assert r.returncode == 0, r.stderr
    assert (out / "results.jsonl").read_bytes() == before


# ------------------------------------------------------------------------------------------------- merge


def _shard(tasks: Path, url: str, k: int, n: int) -> None:
    r = run_cli("run", "--model", "mock-model", "--base-url", url, "--shard", f"{k}/{n}", str(tasks))
    assert r.returncode == 0, r.stderr


def test_merge_proves_coverage_without_tasks(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 90)
    parent = tmp_path / "tasks.run"
    out = tmp_path / "merged.jsonl"
    out.write_bytes(b"an earlier good merge\n")
    for k in (0, 2):
        _shard(tasks, mock.url, k, 3)
    m = run_cli("merge", str(parent), "-o", str(out))
    assert m.returncode == 1, m.stderr
    assert "shard-1-of-3: missing (0/30 done)" in m.stderr, m.stderr
    assert out.read_bytes() == b"an earlier good merge\n"
    assert not list(tmp_path.glob("merged.jsonl.*")), "a failed merge left a file behind"

    # shard 1 stopped part-way: named with its done/total
    mock.configure(latency_ms=200)
    p = start("run", "-w", "1", "-c", "2", "--model", "mock-model", "--base-url", mock.url, "--shard", "1/3",
               str(tasks))
    sdir = parent / "shard-1-of-3"
    deadline = time.monotonic() + 60
    while not (sdir / "results.jsonl").exists() or len(read_results(sdir)) < 2:
        assert p.running() and time.monotonic() < deadline
        time.sleep(0.05)
    p.signal(15)
    _, err = p.communicate(timeout=60)
    assert p.returncode == exitcodes.RESUMABLE, err
    done = len(read_results(sdir))
    m = run_cli("merge", str(parent), "-o", str(out))
    assert m.returncode == 1 and f"shard-1-of-3: incomplete, {done}/30 done" in m.stderr, m.stderr
    assert out.read_bytes() == b"an earlier good merge\n"

    # finished, and an old moved-aside copy of shard 1 beside it: ignored
    mock.configure(latency_ms=5)
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--shard", "1/3", "--fresh", str(tasks))
    assert r.returncode == 0, r.stderr
    assert [x.name for x in parent.iterdir() if ".old-" in x.name]
    m = run_cli("merge", str(parent), "-o", str(out))
    assert m.returncode == 0, m.stderr
    assert sorted(orjson.loads(x)["custom_id"] for x in out.read_bytes().splitlines()) == \
        sorted(f"t{i}" for i in range(90))
    assert orjson.loads((tmp_path / "merged.summary.json").read_bytes())["complete"] is True


def test_merge_with_tasks_checks_the_fingerprint(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40)
    for k in (0, 1):
        _shard(tasks, mock.url, k, 2)
    out = tmp_path / "merged.jsonl"
    assert run_cli("merge", str(tmp_path / "tasks.run"), "--tasks", str(tasks), "-o", str(out)).returncode == 0
    good = out.read_bytes()
    edited = tmp_path / "edited.jsonl"  # the same ids, other prompts
    edited.write_bytes(tasks.read_bytes().replace(b'"q7"', b'"z7"'))
    m = run_cli("merge", str(tmp_path / "tasks.run"), "--tasks", str(edited), "-o", str(out))
    assert m.returncode == 1, m.stderr
    assert "shard-0-of-2: made from another version of" in m.stderr and "shard-1-of-2" in m.stderr, m.stderr
    assert out.read_bytes() == good


def test_slurm_script_and_kubernetes_failure_policy() -> None:
    import yaml

    script = (ROOT / "deploy" / "slurm" / "evalsup.sbatch").read_text()
    assert script.startswith("#!/bin/bash")
    assert "#SBATCH --array=" in script and "EVALSUP_SHARDS" in script and "--shard auto" in script
    assert f"{exitcodes.RESUMABLE}" in script and "scontrol requeue" in script
    r = subprocess.run(["bash", "-n", str(ROOT / "deploy" / "slurm" / "evalsup.sbatch")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    job = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "job.yaml").read_text())
    rules = job["spec"]["podFailurePolicy"]["rules"]
    by_code = {v: rule["action"] for rule in rules if "onExitCodes" in rule
               for v in rule["onExitCodes"]["values"]}
    assert by_code[exitcodes.BAD_INPUT] == "FailIndex"
    assert by_code.get(exitcodes.RESUMABLE, "Count") in ("Ignore", "Count")


def test_sigterm_while_every_endpoint_is_down_stops_at_once(tmp_path: Path, mock: MockThread,
                                                          start: Callable[..., Run]) -> None:
    """Requests parked for an outage cannot finish: on SIGTERM they go back with the tasks queued in the
    workers, the run stops without waiting out --grace (Slurm's KillWait is 30 s), and the rerun does them."""
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"delay_s": 0.02}})
    run_dir = tmp_path / "tasks.run"
    args = ("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    p = start(*args, "--grace", "60")
    p.wait_results(run_dir, at_least=100)
    mock.configure(down=True)
    wait_until(lambda: "pausing dispatch" in p.stderr, "every endpoint to be down", proc=p)
    p.signal(signal.SIGTERM)
    assert p.finish() == exitcodes.RESUMABLE, p.stderr
    assert "grace of 60s over" not in p.stderr, p.stderr
    assert p.wait_workers_gone() == []
    mock.configure(down=False)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
