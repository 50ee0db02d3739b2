"""deploy/slurm/evalsup.sbatch submitted to a real Slurm (one node: slurmctld + slurmd + munge on this machine).
Skipped where no Slurm answers; the code paths never depend on it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from evalsup.mock.server import MockThread
from tests.harness import ROOT, assert_exactly_once, run_cli, write_tasks


def _slurm_up() -> bool:
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%a %t"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and any(x.split()[:1] == ["up"] and ("idle" in x or "mix" in x)
                                     for x in r.stdout.splitlines())


@pytest.mark.slow
@pytest.mark.skipif(not _slurm_up(), reason="no Slurm cluster answers here (sinfo)")
def test_sbatch_array_runs_every_shard_and_merges_exactly(tmp_path: Path, mock: MockThread) -> None:
    n = 400
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    wrapper = tmp_path / "evalsup"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m evalsup \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_", "SLURM_"))}
    env.update(OPENAI_BASE_URL=mock.url, TASKS=str(tasks), EVALSUP=str(wrapper), EVALSUP_SHARDS="2")
    r = subprocess.run(["sbatch", "--wait", "--array=0-1", "--cpus-per-task=1", "--mem=300M", "--time=2",
                        f"--output={tmp_path}/slurm-%A_%a.out", f"--chdir={tmp_path}",
                        str(ROOT / "deploy" / "slurm" / "evalsup.sbatch"), "-w", "1", "--model", "mock-model"],
                       capture_output=True, text=True, env=env, timeout=110)
    logs = "\n".join(p.read_text() for p in sorted(tmp_path.glob("slurm-*.out")))
    assert r.returncode == 0, r.stderr + logs
    for k in (0, 1):
        assert_exactly_once(tmp_path / "tasks.run" / f"shard-{k}-of-2", {f"t{i}" for i in range(k, n, 2)})
    m = run_cli("merge", str(tmp_path / "tasks.run"), "--tasks", str(tasks), "-o", str(tmp_path / "merged.jsonl"))
    assert m.returncode == 0, m.stderr
    assert mock.stats()["by_path"].get("/v1/chat/completions", 0) == n
