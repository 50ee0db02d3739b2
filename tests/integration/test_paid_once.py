"""Paid once (issue 40 item 1): a kill -9 of the supervisor at a steady rate, counted at the server. The mock bills
every answer it generates, by task (the first message's text); after the rerun, the tasks billed twice are at most
the requests that were on the wire (and the answers a worker had gathered for its next write to the supervisor: at
most half its share of the concurrency, for 100 ms at most; evalsup.worker.pipes), and every task has exactly one
record. Before issue 40, up to a second of answers (or 1 MiB) waited in the supervisor's memory and was paid again."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, assert_exactly_once, complete_lines, ids_of, quiesce, run_args, run_cli, write_tasks


@pytest.fixture
def billing() -> Iterator[MockThread]:
    with MockThread(MockConfig(latency_ms=60, jitter_ms=10, seed=4, bill=True)) as m:
        yield m


def _billed_twice(mock: MockThread) -> int:
    return sum(1 for n in mock.stats()["billed_keys"].values() if n > 1)


def test_a_kill_of_the_supervisor_repays_only_what_was_on_the_wire(tmp_path: Path, billing: MockThread) -> None:
    n = 1500
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(billing, tasks, "-w", "2", "-c", "16")
    p = Run(tmp_path, *args)
    try:
        p.wait_results(run_dir, 300)
        time.sleep(0.5)  # half-way between two of the old flushes (a line in the file is what wait_results sees)
        p.workers()  # remember them: they go by themselves at their pipe's end
        p.signal(signal.SIGKILL)  # the supervisor alone, between two checkpoints
        p.p.wait()
        assert p.wait_workers_gone() == []
        quiesce(billing)
        on_wire = int(billing.stats()["max_in_flight"])  # the most requests ever on the wire at once
        before = complete_lines(run_dir / "results.jsonl")
        assert 0 < before < n, "the run must be killed mid-way"
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr
    finally:
        p.cleanup()
    assert_exactly_once(run_dir, ids_of(n))
    twice = _billed_twice(billing)
    gathered = 16 // 2  # the workers' outboxes: a write at once when half their share of -c waits
    assert on_wire <= 16 and twice <= on_wire + gathered, \
        f"{twice} tasks billed twice with at most {on_wire} requests on the wire"
    billed = billing.stats()["billed"]["mock-model"]["answers"]
    assert billed == n + twice  # no task billed three times, none lost
