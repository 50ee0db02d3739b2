"""The supervisor's memory does not grow with the number of tasks (issue 33), under a real cgroup v1 limit.

One shard (1 line in 400) of an 800,000-line task file runs in a 96 MiB memory cgroup. The supervisor checks every
line of the file for duplicate ids, not only its shard's: before issue 33 it kept an in-memory id table sized for
all 800,000 (32 MiB, 48 while it was filled), and in this cgroup its workers were recycled again and again with
nothing done; now duplicates are found on disk and the run completes, each of its tasks exactly once, with no OOM
kill. (Measured under the same limit and settings, by summary.json: supervisor peak RSS 85.7 MB before against
41 MB now.) Needs root and a cgroup v1 memory hierarchy; skipped otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, evalsup_cmd, in_cgroup, summary, v1_memory_cgroup

LINES = 800_000  # past 786,432 lines the old id table doubled to 2**21 slots
SHARDS = 400
LIMIT = 96 << 20
RUN_TIMEOUT_S = 240.0  # a hang guard (before issue 33 the run made no progress at all)


@pytest.fixture
def cgroup() -> Iterator[Path]:
    for cg in v1_memory_cgroup(LIMIT):
        if isinstance(cg, str):
            pytest.skip(cg)
        yield cg


@pytest.mark.slow
def test_a_shard_of_a_large_file_runs_in_a_small_cgroup_exactly_once(tmp_path: Path, mock: MockThread,
                                                                     cgroup: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    with open(tasks, "wb", buffering=1 << 20) as f:
        f.writelines(b'{"id":"t%d","prompt":"q"}\n' % i for i in range(LINES))
    argv = evalsup_cmd("run", "--model", "mock-model", "--base-url", mock.url, "-w", "1", "-c", "64", "--no-check",
                       "--max-worker-rss", "80", "--shard", f"0/{SHARDS}", str(tasks))
    p = Run(tmp_path, argv=in_cgroup(cgroup, argv))
    try:
        rc = p.wait(RUN_TIMEOUT_S)
        if rc is None:
            p.interrupt()
    finally:
        p.cleanup()
    oom = (cgroup / "memory.oom_control").read_text().split()
    assert rc == 0, f"exit {rc}; oom_control {oom}; stderr:\n{p.stderr[-3000:]}"
    assert oom[oom.index("oom_kill") + 1] == "0", oom
    run_dir = tmp_path / "tasks.run" / f"shard-0-of-{SHARDS}"
    s = summary(run_dir)
    assert s["memory"]["source"] == "cgroup1" and s["oom_kills"] == 0, s
    assert_exactly_once(run_dir, {f"t{i}" for i in range(0, LINES, SHARDS)})
    print(f"peak RSS {s['peak_rss_mb']}, cgroup working set peak {s['memory']['peak_mb']} MB")
