"""Issue 18 item 4: `evalsup run --retry-failed [CODE,...]` replaces the chosen error records, crash-safely
(kill -9 during a retry; the states a crash between the rewrite's steps leaves), on finished, stopped and
sharded runs. Real processes, real files, the mock on 127.0.0.1."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from evalsup.mock.server import MockThread
from evalsup.rundir.results_file import iter_records
from tests.harness import (
    Run,
    assert_clean_exit,
    assert_exactly_once,
    chat_requests,
    complete_lines,
    fail_once,
    finished_run,
    ids_of,
    quiesce,
    read_results,
    run_args,
    run_cli,
    summary,
    wait_until,
    write_tasks,
)


def test_retry_failed_replaces_the_failed_records(tmp_path: Path, mock: MockThread) -> None:
    bad = {3, 17, 40, 41, 99}
    _tasks, run_dir, args = finished_run(tmp_path, mock, 100, "--max-attempts", "1", tasks_extra=fail_once(bad))
    recs = read_results(run_dir)
    assert {r["custom_id"] for r in recs if r["error"]} == {f"t{i}" for i in bad}
    sent = chat_requests(mock)  # (no reset_stats: it would forget the attempts behind mock.times)

    r = run_cli(*args[:-1], "--retry-failed", "timeout,http_500", args[-1])  # other codes: nothing to do
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent

    r = run_cli(*args[:-1], "--retry-failed", args[-1])  # `--retry-failed tasks.jsonl`: every error
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    assert chat_requests(mock) == sent + len(bad)
    recs = assert_exactly_once(run_dir, ids_of(100))
    assert all(x["error"] is None for x in recs)
    s = summary(run_dir)
    assert s["total"] == s["succeeded"] == 100 and s["failed"] == 0
    replaced = [orjson.loads(x) for x in (run_dir / "replaced.jsonl").read_bytes().splitlines()]
    assert {x["custom_id"] for x in replaced} == {f"t{i}" for i in bad}


def test_kill_during_retry_failed_then_rerun_is_exactly_once(tmp_path: Path, mock: MockThread,
                                                             start: Callable[..., Run]) -> None:
    n = 600
    bad = set(range(0, n, 3))  # 200 failed records
    _tasks, run_dir, args = finished_run(tmp_path, mock, n, "--max-attempts", "1", tasks_extra=fail_once(bad))
    assert sum(1 for r in read_results(run_dir) if r["error"]) == len(bad)
    mock.configure(latency_ms=300, jitter_ms=50)
    retry = (*args[:-1], "-c", "8", "--retry-failed", "http_400", args[-1])
    p = start(*retry)
    results = run_dir / "results.jsonl"
    wait_until(lambda: (run_dir / "replaced.jsonl").exists() or not p.running(), "the rewrite")
    p.wait_results(run_dir, n - len(bad) + 20)  # the compacted file plus some retried records
    p.kill_group()
    assert p.wait_workers_gone() == []
    assert complete_lines(results) < n, "the retry finished before it could be killed"
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    r = run_cli(*retry)
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)


@pytest.mark.parametrize("step", ["written", "committed", "results_renamed"])
def test_a_crash_inside_the_rewrite_is_completed_or_undone(tmp_path: Path, mock: MockThread, step: str) -> None:
    """The states a crash between the rewrite's steps leaves (evalsup.rundir.rewrite): the next run finishes a
    committed rewrite and drops one that was not; either way every task ends up once."""
    bad = {1, 5, 9}
    _tasks, run_dir, args = finished_run(tmp_path, mock, 30, "--max-attempts", "1", tasks_extra=fail_once(bad))
    done = tmp_path / "done.run"
    shutil.copytree(run_dir, done)
    from evalsup.rundir.rewrite import NEXT, rewrite

    rewrite(done, lambda rec: rec["error"] is not None)  # the rewrite, finished, on a copy
    if step == "written":  # step 1 done, no commit: undone
        shutil.copy(done / "results.jsonl", run_dir / "results.jsonl.new")
        expect_requests = 0
    elif step == "committed":  # step 2 done: completed
        shutil.copy(done / "results.jsonl", run_dir / "results.jsonl.new")
        shutil.copy(done / "replaced.jsonl", run_dir / "replaced.jsonl.new")
        shutil.copy(done / "checkpoint.json", run_dir / NEXT)
        expect_requests = len(bad)
    else:  # step 3 done too
        shutil.copy(done / "results.jsonl", run_dir / "results.jsonl")
        shutil.copy(done / "checkpoint.json", run_dir / NEXT)
        expect_requests = len(bad)
    sent = chat_requests(mock)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent + expect_requests
    recs = assert_exactly_once(run_dir, ids_of(30))
    assert sum(1 for x in recs if x["error"]) == (len(bad) if step == "written" else 0)
    assert not list(run_dir.glob("*.new")) and not (run_dir / NEXT).exists()



def test_retry_failed_in_a_shard_resends_only_its_own_tasks(tmp_path: Path, mock: MockThread) -> None:
    bad = {2, 4, 5, 7}
    _tasks, _run_dir, args = finished_run(tmp_path, mock, 40, "--max-attempts", "1", "--shard", "0/2",
                                       tasks_extra=fail_once(bad))
    shard = tmp_path / "tasks.run" / "shard-0-of-2"
    assert {r["custom_id"] for r in read_results(shard) if r["error"]} == {"t2", "t4"}
    sent = chat_requests(mock)
    r = run_cli(*args[:-1], "--retry-failed", args[-1])
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent + 2
    recs = assert_exactly_once(shard, {f"t{i}" for i in range(0, 40, 2)})
    assert all(x["error"] is None for x in recs)


def test_retry_failed_on_a_run_killed_mid_way(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    """A stopped run: outstanding tasks, records after the checkpoint, maybe a torn last line, failed records.
    --retry-failed rewrites it and the run finishes: every task once, none failed."""
    n = 1500
    bad = set(range(0, n, 7))
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, n)
    tasks.write_bytes(b"".join(
        orjson.dumps({**orjson.loads(line), **({"mock": {"status": 400, "times": 1}} if i in bad else {})}) + b"\n"
        for i, line in enumerate(tasks.read_bytes().splitlines())))
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "2", "--max-attempts", "1")
    mock.configure(latency_ms=100, jitter_ms=20)
    p = start(*args)
    p.wait_results(run_dir, 400)
    time.sleep(0.3)
    p.kill_group()
    assert p.wait_workers_gone() == []
    failed_ids = {r[2]["custom_id"] for r in iter_records(run_dir / "results.jsonl") if r[2]["error"]}
    failed = len(failed_ids)
    assert failed > 0
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    r = run_cli(*args[:-1], "--retry-failed", args[-1])
    assert r.returncode == 0, r.stderr
    assert f"{failed:,} failed record(s) taken out" in r.stderr, r.stderr
    recs = assert_exactly_once(run_dir, ids_of(n))
    # the retried ones succeed; tasks first sent by this run fail their first attempt as the mock says
    still = {x["custom_id"] for x in recs if x["error"]}
    assert not still & failed_ids and still <= {f"t{i}" for i in bad}
    r = run_cli(*args[:-1], "--retry-failed", args[-1])
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)
    assert summary(run_dir)["succeeded"] == n
