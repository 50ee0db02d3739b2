"""Tail hedging (issue 28, `--hedge`): in the tail of a run, a request on the wire far past the p95 gets a
second copy on another endpoint; the first answer is the record, the other copy is cancelled, each task is
written once and the summary counts the hedges. Real processes, real HTTP against two mocks, one of which
holds every 4th request it gets (`slow`) far longer than the run; the decision as a unit is in
unit/test_hedge.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import assert_exactly_once, ids_of, run_cli, summary, write_tasks


@pytest.fixture
def replicas() -> Iterator[tuple[MockThread, MockThread]]:
    # the first holds a quarter of its requests for a minute (a stuck slot); the second answers all in ~20 ms
    with MockThread(MockConfig(latency_ms=20, jitter_ms=5, slow=0.25, slow_ms=60_000, seed=0)) as stuck, \
            MockThread(MockConfig(latency_ms=20, jitter_ms=5, seed=1)) as fine:
        yield stuck, fine


def test_stuck_requests_in_the_tail_are_hedged_to_the_other_replica_and_written_once(
        tmp_path: Path, replicas: tuple[MockThread, MockThread]) -> None:
    stuck, fine = replicas
    n = 60
    tasks = write_tasks(tmp_path / "t.jsonl", n, form="prompt")
    r = run_cli("run", "-w", "1", "-c", "8", "--hedge", "--model", "mock-model", "--base-url", stuck.url,
                "--base-url", fine.url, str(tasks), timeout=120)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "t.run"
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs), [x for x in recs if x["error"]][:3]
    hedged = [x for x in recs if x["metrics"].get("hedged")]
    won = [x for x in hedged if x["metrics"]["hedge_won"]]
    # the held requests were answered by their copy, on the other replica: no task waited out the held minute
    # (a liveness bound, far from the ~1 s a run takes; total_s counts from the first copy's start)
    assert stuck.stats()["faults"].get("slow", 0) >= 1
    assert any(x["metrics"]["endpoint"]["index"] == 1 for x in won), hedged
    assert max(x["metrics"]["total_s"] for x in recs) < 30, sorted(x["metrics"]["total_s"] for x in recs)[-3:]
    assert all("hedged" not in x["metrics"] for x in recs if x not in hedged)
    s = summary(run_dir)
    assert s["hedges"] == {"sent": len(hedged), "won": len(won)}, s["hedges"]
    assert s["succeeded"] == n and s["failed"] == 0
    assert "hedges" in r.stdout + r.stderr  # the final table's row

