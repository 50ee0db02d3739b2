"""Chaos: SIGKILL the whole supervisor at random moments, SIGKILL random workers, poison tasks, hung workers,
crash loops. Real processes and signals against the mock on 127.0.0.1; what is checked is what a user sees:
results.jsonl holds every task exactly once, and summary.json tells what happened."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import FAULTS_PLUGIN as PLUGIN
from tests.harness import (
    Run,
    assert_clean_exit,
    assert_exactly_once,
    chat_requests,
    ids_of,
    read_results,
    resume_line,
    run_args,
    run_cli,
    summary,
    wait_until,
    write_tasks,
)

SEED = int(os.environ.get("EVALSUP_CHAOS_SEED", time.time_ns() % 1_000_000))


class LineCounter:
    """Complete lines of a growing file, reading only what is new (the resume may cut a torn tail)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.lines = 0

    def count(self) -> int:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return 0
        if size < self.offset:
            self.offset = self.lines = 0
        if size > self.offset:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(size - self.offset)
            end = data.rfind(b"\n") + 1
            self.lines += data.count(b"\n")
            self.offset += end
        return self.lines


def mark_lines(tasks: Path, marks: dict[int, dict[str, object]]) -> None:
    """Add keys to some lines (by task number) of a file made by write_tasks."""
    lines = tasks.read_bytes().splitlines(keepends=True)
    for i, extra in marks.items():
        obj = orjson.loads(lines[i])
        obj.update(extra)
        lines[i] = orjson.dumps(obj) + b"\n"
    tasks.write_bytes(b"".join(lines))


@pytest.mark.slow
def test_sigkill_whole_supervisor_at_random_moments(tmp_path: Path, mock: MockThread,
                                                    start: Callable[..., Run]) -> None:
    print(f"chaos seed {SEED} (EVALSUP_CHAOS_SEED={SEED} replays the same choices)")
    rng = random.Random(SEED)
    n, kills = 6000, 4
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    # 40-120 ms a request: about 800 a second at 64 in flight, so that a budget of requests spans 0.2-2 s of
    # running, across the 1 s flush and 2 s checkpoint cycles (at a faster pace every kill came before the
    # first flush, and no session's results survived)
    mock.configure(latency_ms=80, jitter_ms=40)
    args = run_args(mock, tasks, "-w", "4", "-c", "64")
    counter = LineCounter(run_dir / "results.jsonl")
    # One kill lands at a random time during start-up (imports, the resume scan, spawning workers); the
    # others once the session has sent a random number of requests, which puts them at random points of
    # the flush and checkpoint cycles. Progress is read from the mock, which sees every request at once.
    moments = ["start-up"] + ["running"] * (kills - 1)
    rng.shuffle(moments)
    log = []
    for i, moment in enumerate(moments):
        sent0 = chat_requests(mock)
        after_s = rng.uniform(0.05, 2.5) if moment == "start-up" else float("inf")
        budget = rng.randint(150, 1600)
        p = start(*args)
        t0 = time.monotonic()
        while time.monotonic() - t0 < after_s and chat_requests(mock) - sent0 < budget:
            assert p.running(), f"seed {SEED}, kill {i}: run ended (exit {p.p.returncode}) early:\n{p.stderr}"
            assert time.monotonic() - t0 < 120, f"seed {SEED}, kill {i}: no progress:\n{p.stderr}"
            p.workers()
            time.sleep(0.005)
        p.kill_group()
        assert p.wait_workers_gone() == [], f"seed {SEED}: workers outlived the kill"
        assert "Traceback" not in p.stderr, p.stderr
        log.append((moment, round(time.monotonic() - t0, 2), chat_requests(mock) - sent0, counter.count()))
    assert 0 < counter.count() < n, f"seed {SEED}: kills (moment, s, requests, lines) {log}"

    r = run_cli(*args)
    assert r.returncode == 0, f"seed {SEED}, kills (moment, s, requests, lines) {log}\n{r.stderr}"
    assert_clean_exit(r)
    resume_line(r.stderr)
    data = (run_dir / "results.jsonl").read_bytes()
    assert data.endswith(b"\n") and b"\n\n" not in data
    recs = assert_exactly_once(run_dir, ids_of(n))  # every line parses, every id once, nothing else
    assert all(x["error"] is None and x["response"]["status_code"] == 200 for x in recs), f"seed {SEED}"
    s = summary(run_dir)
    assert s["total"] == s["succeeded"] == n, f"seed {SEED}: {s}"


@pytest.mark.slow
def test_sigkill_random_workers_during_a_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    print(f"chaos seed {SEED} (EVALSUP_CHAOS_SEED={SEED} replays the same choices)")
    rng = random.Random(SEED)
    n, workers = 6000, 4
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    mock.configure(latency_ms=80, jitter_ms=40)  # about 800 requests a second: 8 kills fit before 80 %
    p = start(*run_args(mock, tasks, "-w", str(workers), "-c", "64", "--max-restarts", "100"))
    counter = LineCounter(run_dir / "results.jsonl")
    wait_until(lambda: len(p.workers()) == workers and counter.count() > 0, "the run to get going")
    killed: list[int] = []
    while len(killed) < 8:
        deadline = time.monotonic() + rng.uniform(0.2, 0.7)
        while time.monotonic() < deadline and p.running():
            p.workers()
            time.sleep(0.01)
        # progress as the mock sees it (results reach the file up to a second later): a kill after the run
        # has drained its workers for the end would be a planned exit, not a crash
        if not p.running() or chat_requests(mock) > 0.8 * n:
            break
        victim = rng.choice(p.workers())
        victim.kill()  # SIGKILL, by PID (psutil checks it is still our worker)
        killed.append(victim.pid)
        # replaced at once: the pool is back to full strength without the victim
        wait_until(lambda: len([w for w in p.workers() if w.pid not in killed]) == workers or not p.running(),
                   "the dead worker to be replaced")
    assert len(killed) >= 5, f"seed {SEED}: only {len(killed)} kills before the run was nearly done"
    assert p.finish() == 0, p.stderr
    assert_clean_exit(p)
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs), [x for x in recs if x["error"]][:3]
    s = summary(run_dir)
    assert s["worker_restarts"] > 0
    assert s["worker_restarts_by_cause"].get("crashed") == len(killed), s["worker_restarts_by_cause"]
    assert len({x["metrics"]["worker"] for x in recs}) > workers  # the replacements did work too


@pytest.mark.parametrize("how", ["crash", "raise"])  # the worker process dies; user code raises in it
def test_poison_task_is_written_as_worker_crashed(tmp_path: Path, mock: MockThread, how: str) -> None:
    n = 300
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    mark_lines(tasks, {150: {how: True}})
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--worker-plugin", f"{PLUGIN}:{how}_marked"))
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    run_dir = tmp_path / "tasks.run"
    recs = {x["custom_id"]: x for x in assert_exactly_once(run_dir, ids_of(n))}
    poison = recs["t150"]
    assert poison["error"]["code"] == "worker_crashed", poison
    assert poison["error"]["message"]
    assert poison["response"] is None
    s = summary(run_dir)
    assert s["finished"] is True
    assert "t150" in s["poisoned"]
    assert s["worker_restarts_by_cause"].get("crashed") == 3  # --max-task-crashes defaults to 3
    innocent = sorted((k for k, x in recs.items() if x["error"] is not None and k != "t150"),
                      key=lambda k: int(k[1:]))
    assert not innocent, (f"{len(innocent)} tasks that crash nothing were written as failed "
                          f"(they shared a worker with the poison task): {innocent[:5]}...{innocent[-3:]}")
    assert s["poisoned"] == ["t150"]
    assert s["failed"] == 1 and s["succeeded"] == n - 1


@pytest.mark.slow
def test_crashed_and_hung_workers_are_replaced_and_their_tasks_handed_on(
        tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    n = 300
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    mark_lines(tasks, {100: {"once": "crash"}, 200: {"once": "hang"}})
    marks = tmp_path / "marks"
    marks.mkdir()
    p = start(*run_args(mock, tasks, "-w", "2", "--hang-timeout", "3", "--worker-plugin", f"{PLUGIN}:once"),
              env={"EVALSUP_TEST_MARKS": str(marks)})
    assert p.finish() == 0, p.stderr
    assert_clean_exit(p)
    assert sorted(x.name for x in marks.iterdir()) == ["t100.crash", "t200.hang"]  # both happened
    assert p.wait_workers_gone() == [], "the hung worker was left behind"
    run_dir = tmp_path / "tasks.run"
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs), [x for x in recs if x["error"]][:3]
    s = summary(run_dir)
    by_cause = s["worker_restarts_by_cause"]
    assert by_cause.get("crashed") == 1 and by_cause.get("hung") == 1, by_cause
    assert s["worker_restarts"] == 2 and s["poisoned"] == []


def test_restart_intensity_stops_resumably(tmp_path: Path, mock: MockThread) -> None:
    n = 400
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    mark_lines(tasks, {i: {"crash": True} for i in range(10, n, 20)})
    run_dir = tmp_path / "tasks.run"
    base = run_args(mock, tasks, "-w", "2", "--max-task-crashes", "100")
    r = run_cli(*base[:-1], "--max-restarts", "3", "--worker-plugin", f"{PLUGIN}:crash_marked", base[-1])
    assert r.returncode == 75, f"exit {r.returncode}\n{r.stderr}"  # resumable
    assert_clean_exit(r)
    assert "restarts" in r.stderr and "3" in r.stderr, r.stderr
    assert any("resume" in x for x in r.stderr.splitlines()), f"no line says how to resume:\n{r.stderr}"
    assert (run_dir / "checkpoint.json").exists()
    recs = read_results(run_dir)
    assert len(recs) == len({x["custom_id"] for x in recs}) < n

    r = run_cli(*base[:-1], "--max-restarts", "10", base[-1])  # the crashing plugin is gone
    assert r.returncode == 0, r.stderr
    resume_line(r.stderr)
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs), [x for x in recs if x["error"]][:3]
