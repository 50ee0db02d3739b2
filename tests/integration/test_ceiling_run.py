"""RUN_DIR/concurrency in a real run: a ceiling written while the run goes holds the endpoint to it, status shows
it, and removing the file gives the run its --max-concurrency back."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, assert_exactly_once, complete_lines, memory_samples, run_cli, wait_until, write_tasks


def put(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_ceiling_written_mid_run_holds_the_endpoint_to_it(tmp_path: Path, start: Callable[..., Run]) -> None:
    with MockThread(MockConfig(latency_ms=200, jitter_ms=20, seed=1)) as m:
        tasks = write_tasks(tmp_path / "t.jsonl", 2000)
        run_dir = tmp_path / "t.run"
        p = start("run", "--model", "mock-model", "--base-url", m.url, "--max-concurrency", "64",
                  "--monitor-interval", "0.2", str(tasks))
        wait_until(lambda: m.stats()["in_flight"] > 8, "more than 8 requests held at once", proc=p)
        put(run_dir / "concurrency", "4\n")
        wait_until(lambda: any(s.get("ceiling") == 4 for s in memory_samples(run_dir)), "the ceiling applied",
                   proc=p)
        wait_until(lambda: m.stats()["in_flight"] <= 4, "the requests above the ceiling to come back", proc=p)
        m.reset_stats()  # from here on, the most requests the mock holds at once
        done = complete_lines(run_dir / "results.jsonl")
        p.wait_results(run_dir, done + 40)  # the run goes on under its ceiling
        status = run_cli("status", str(run_dir))
        held = m.stats()["max_in_flight"]
        assert 0 < held <= 4, held
        assert "ceiling 4 (concurrency)" in status.stdout, status.stdout
        (run_dir / "concurrency").unlink()  # back to --max-concurrency
        wait_until(lambda: m.stats()["in_flight"] > 4, "more than 4 in flight once the file is gone", proc=p)
        assert p.finish() == 0, p.stderr
    assert_exactly_once(run_dir, {f"t{i}" for i in range(2000)})
    assert f"concurrency ceiling 4 ({run_dir / 'concurrency'})" in p.stderr
    assert "removed: back to --concurrency" in p.stderr
