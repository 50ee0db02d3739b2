"""What running against a real engine (`transformers serve`, tests/slow/test_real_engine.py, scripts/bench_engine.py)
showed, reproduced against the project's mock so that it is tested on every run."""

from __future__ import annotations

from pathlib import Path

from evalsup.mock.server import MockThread
from tests.harness import memory_samples, run_cli, write_tasks


def test_a_small_fixed_concurrency_is_what_goes_on_the_wire(tmp_path: Path, mock: MockThread) -> None:
    """`--concurrency 1` with the workers left automatic (up to 4) sent 4 requests at once: the total was raised
    to one per possible worker. A sweep from 1 against a real engine measured 4 for 1 and 2."""
    c = 1
    mock.configure(latency_ms=20, jitter_ms=0)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 30)
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "-c", str(c), "--monitor-interval", "0.2",
                str(tasks))
    assert r.returncode == 0, r.stderr
    assert mock.stats()["max_in_flight"] == c
    limits = {s["concurrency_limit"] for s in memory_samples(tmp_path / "tasks.run")} - {0, None}
    assert limits == {c}, limits  # what memory.jsonl (and the progress line) says is what was sent
