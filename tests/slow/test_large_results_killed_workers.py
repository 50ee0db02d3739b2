"""Large results while workers are killed in the middle of sending them (slow): exactly once, whole lines.
(Large results without kills: integration/test_large_results.py.)"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, summary, write_tasks


@pytest.mark.slow
def test_workers_killed_while_sending_large_results(tmp_path: Path, mock: MockThread,
                                                    start: Callable[..., Run]) -> None:
    n = 400
    tasks = write_tasks(tmp_path / "t.jsonl", n, extra={"mock": {"kb": 900, "delay_s": 0.05}})
    p = start("run", "-w", "3", "-c", "24", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + 60
    while kills < 6 and p.running() and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.3, 0.8))
        try:
            kids = psutil.Process(p.pid).children()
        except psutil.NoSuchProcess:
            break
        if kids:
            os.kill(rng.choice(kids).pid, signal.SIGKILL)
            kills += 1
    _, err = p.communicate(timeout=180)
    assert p.returncode == 0, err
    assert kills >= 3
    recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(n)})
    assert all(x["error"] is None for x in recs)
    s = summary(tmp_path / "t.run")
    assert s["worker_restarts"] >= 3
    assert s["results_via_ring"] > 0  # killed workers' lines still in their rings were written whole
