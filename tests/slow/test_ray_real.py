"""A real Ray cluster (a head and a second node, from Ray's PyPI wheel) running 4 shards against the mock, with
one shard's evalsup process and another shard's Ray worker killed mid-run: Ray retries both, each retry resumes
its shard, and the merge at the end holds every task exactly once."""

from __future__ import annotations

import importlib.util
import os
import signal
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import ROOT, complete_lines, env_for, evalsup_cmd, wait_until, write_tasks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="Ray is not installed (pip install 'evalsup[ray]')")

N_TASKS = 2000
RAY_ENV = ("RAY_USAGE_STATS_ENABLED", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_TMPDIR")
SHARDS = 4


def _ray_tmp(monkeypatch: pytest.MonkeyPatch) -> str:
    """A temp dir of the test's own for Ray's sessions (short: Ray's socket paths must stay short) and its
    address file (RAY_TMPDIR), so the test runs beside another Ray on this machine."""
    tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    (Path(tmp) / "ray").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    return tmp


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A head node and a second node on this machine, 2 CPUs each; Ray's own processes, shut down after."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the nodes' workers import this evalsup
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    # every Ray process (and the driver, which inherits it) on 127.0.0.1: Ray otherwise swaps the loopback
    # address for the machine's own
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    tmp = _ray_tmp(monkeypatch)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                      "node_ip_address": "127.0.0.1", "temp_dir": tmp})
    c.add_node(num_cpus=2)
    try:
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def _shard_procs(tasks: Path) -> dict[int, psutil.Process]:
    """{K: the evalsup supervisor of shard K} among the processes running this test's tasks."""
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if str(tasks) in cmd and "--shard" in cmd:
            found[int(cmd[cmd.index("--shard") + 1].split("/")[0])] = p
    return found


def _attempts(out: Path, k: int) -> int:
    return int((out / "ray-logs" / f"shard-{k}" / "attempts").read_text())


def test_four_shards_on_ray_survive_a_killed_shard_and_a_killed_ray_worker(tmp_path: Path, cluster: Any) -> None:
    import subprocess

    tasks = write_tasks(tmp_path / "tasks.jsonl", N_TASKS)
    out = tmp_path / "tasks.run"
    with MockThread(MockConfig(latency_ms=40, jitter_ms=10, seed=3)) as mock:
        proc = subprocess.Popen(
            evalsup_cmd("run", "--ray", cluster.address, "--shards", str(SHARDS), "--base-url", mock.url,
                        "--model", "mock-model", "--concurrency", "16", "--workers", "1", "--log-interval", "1",
                        str(tasks)),
            env=env_for({k: os.environ[k] for k in RAY_ENV}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            # both victims mid-run: some of their results written, most not
            def started(k: int) -> bool:
                f = out / f"shard-{k}-of-{SHARDS}" / "results.jsonl"
                return f.exists() and complete_lines(f) >= 40

            wait_until(lambda: started(1) and started(2), "shards 1 and 2 under way", timeout=120)
            procs = _shard_procs(tasks)
            assert {1, 2} <= set(procs), procs
            procs[1].send_signal(signal.SIGKILL)  # the shard's own evalsup process
            ray_worker = procs[2].parent()
            assert ray_worker is not None and ray_worker.name().startswith("ray::"), ray_worker
            os.kill(ray_worker.pid, signal.SIGKILL)  # the Ray worker running shard 2's task
            stdout, stderr = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, stderr
    assert _attempts(out, 1) >= 2 and _attempts(out, 2) >= 2  # both were retried by Ray...
    assert _attempts(out, 0) == 1 and _attempts(out, 3) == 1
    for k in (1, 2):  # ...and each retry resumed its shard rather than starting it over
        assert "resum" in (out / "ray-logs" / f"shard-{k}" / "stderr").read_text().lower()
    ids = Counter(orjson.loads(line)["custom_id"] for line in (out / "merged.jsonl").read_bytes().splitlines())
    assert set(ids) == {f"t{i}" for i in range(N_TASKS)} and set(ids.values()) == {1}
    summary = orjson.loads((out / "merged.summary.json").read_bytes())
    assert summary["complete"] and summary["total"] == N_TASKS
    assert "merged 4 run directories: 2,000 results" in stdout
    assert "ray: 4/4 shards finished" in stderr


@pytest.fixture
def head(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """One Ray node on this machine, 2 CPUs, its own temp dir and ports (GCS and the rest picked free)."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    tmp = _ray_tmp(monkeypatch)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False,
                                                      "node_ip_address": "127.0.0.1", "temp_dir": tmp})
    try:
        yield c
    finally:
        c.shutdown()


def test_json_stays_one_object_when_a_shard_is_killed_and_the_endpoint_comes_from_the_drivers_env(
        tmp_path: Path, head: Any) -> None:
    """A shard's evalsup process killed (-9) mid-run: Ray retries it (its traceback goes to the run's log, the
    retry is one line on stderr) and `--json` prints one JSON object. The endpoint, a query credential in it, is
    only in the driver's environment: it reaches the shards (the mock refuses requests without it) and no file,
    argv or output shows it."""
    import subprocess

    n, secret = 600, "SECRET123"
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    out = tmp_path / "tasks.run"
    with MockThread(MockConfig(latency_ms=30, require_query=f"api-key={secret}")) as mock:
        env = env_for({**{k: os.environ[k] for k in RAY_ENV}, "OPENAI_BASE_URL": f"{mock.url}?api-key={secret}"})
        proc = subprocess.Popen(evalsup_cmd("run", "--ray", head.address, "--shards", "2", "--model", "mock-model",
                                            "--concurrency", "4", "--workers", "1", "--json", str(tasks)),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            f = out / "shard-1-of-2" / "results.jsonl"
            wait_until(lambda: f.exists() and complete_lines(f) >= 20, "shard 1 under way", timeout=120)
            procs = _shard_procs(tasks)
            assert all(secret not in " ".join(p.cmdline()) for p in procs.values())
            procs[1].send_signal(signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert mock.stats()["statuses"].get("404", 0) == 0  # every request carried the query
    assert proc.returncode == 0, stderr
    summary = orjson.loads(stdout)  # one JSON object, nothing of Ray's
    assert summary["finished"] and summary["total"] == n
    ids = Counter(orjson.loads(line)["custom_id"] for line in (out / "merged.jsonl").read_bytes().splitlines())
    assert set(ids) == {f"t{i}" for i in range(n)} and set(ids.values()) == {1}
    retried = [x for x in stderr.splitlines() if "ended unfinished" in x]
    assert retried == ["evalsup: ray: shard-1-of-2: attempt 1 ended unfinished (killed by signal 9); Ray retries "
                       "it, resuming from its checkpoint"], stderr
    assert "Traceback" not in stderr and secret not in stdout + stderr
    # the last progress line counts each task once, the retried shard's too
    assert f"ray: 2/2 shards finished, 0 running, 1 retried; {n}/{n} done (100.0 %)" in stderr, stderr
    for p in out.rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p
