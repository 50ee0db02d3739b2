"""Large results move from a worker's pipe into results.jsonl by splice(2): exactly once, whole lines, also when
workers are killed in the middle of sending them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import orjson
import psutil
import pytest
from conftest import assert_exactly_once, env_for, evalsup_cmd, run_cli, write_tasks

from evalsup.mock.server import MockThread

pytestmark = pytest.mark.skipif(not hasattr(os, "splice"), reason="splice(2) is Linux-only")


def _summary(run_dir: Path) -> dict[str, object]:
    return orjson.loads((run_dir / "summary.json").read_bytes())  # type: ignore[no-any-return]


def test_large_results_are_spliced_whole(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 120, extra={"mock": {"kb": 700}})
    small = write_tasks(tmp_path / "s.jsonl", 120)
    r = run_cli("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(120)})
    for rec in recs:
        body = rec["response"]["body"]
        assert len(orjson.dumps(body)) > 600_000 and body["choices"][0]["message"]["content"]
    assert _summary(tmp_path / "t.run")["spliced_results"] > 0
    # the same run with splicing off writes the same records
    r = run_cli("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, "--out",
                str(tmp_path / "plain"), str(tasks), env={"EVALSUP_SPLICE": "0"})
    assert r.returncode == 0, r.stderr
    assert _summary(tmp_path / "plain")["spliced_results"] == 0
    plain = {x["custom_id"]: x["response"]["body"] for x in assert_exactly_once(tmp_path / "plain",
                                                                                {f"t{i}" for i in range(120)})}
    assert all(plain[x["custom_id"]]["choices"] == x["response"]["body"]["choices"] for x in recs)
    # small results take the ordinary path
    assert run_cli("run", "--model", "mock-model", "--base-url", mock.url, str(small)).returncode == 0
    assert _summary(tmp_path / "s.run")["spliced_results"] == 0


@pytest.mark.slow
def test_workers_killed_while_sending_large_results(tmp_path: Path, mock: MockThread) -> None:
    n = 400
    tasks = write_tasks(tmp_path / "t.jsonl", n, extra={"mock": {"kb": 900, "delay_s": 0.05}})
    p = subprocess.Popen(evalsup_cmd("run", "-w", "3", "-c", "24", "--model", "mock-model", "--base-url", mock.url,
                                     str(tasks)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env_for())
    rng = random.Random(7)
    kills = 0
    deadline = time.monotonic() + 60
    while kills < 6 and p.poll() is None and time.monotonic() < deadline:
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
    s = _summary(tmp_path / "t.run")
    assert s["worker_restarts"] >= 3 and s["spliced_results"] > 0
