"""A real cgroup v1 memory limit: the supervisor and its workers run inside a 512 MiB memory cgroup that the
test creates, with a workload that would need several GiB at full concurrency (1 MiB responses, 256 in
flight). evalsup must finish every task exactly once without the kernel OOM-killing anything, by capping
requests in flight and/or pausing dispatch.

Needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory;
skipped otherwise. The cgroup is made inside the test process's own memory cgroup (so everything stays
within whatever contains the test run) and removed at teardown. The mock endpoint runs in the test
process, outside the limited cgroup.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsup.config.cgroup import own_v1_memory_cgroup, parse_keyed
from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, evalsup_cmd, memory_samples, summary, write_tasks

MIB = 1 << 20
LIMIT = 512 * MIB
RUN_TIMEOUT_S = 90.0  # a hang guard: a healthy run takes a fraction of it


def v1_memory_mount() -> Path:
    # the real hierarchy, always: the run's environment drops EVALSUP_* (env_for), so evalsup reads this one too
    return Path("/sys/fs/cgroup/memory")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        return f"<{e.strerror}>"


def _move_out(cg: Path, parent: Path) -> None:
    """Move every process still in ``cg`` to ``parent`` (only the test's own processes can be there)."""
    for _ in range(5):
        pids = [x for x in _read(cg / "cgroup.procs").split() if x.isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(pid)
        time.sleep(0.1)


@pytest.fixture
def v1_cgroup() -> Iterator[Path]:
    """A fresh v1 memory cgroup limited to 512 MiB, removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a cgroup v1 memory cgroup")
    mount = v1_memory_mount()
    if not (mount / "memory.limit_in_bytes").is_file() or not (mount / "cgroup.procs").is_file():
        pytest.skip(f"no cgroup v1 memory hierarchy at {mount}")
    parent = own_v1_memory_cgroup(mount)
    cg = parent / f"evalsup-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        cg.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup under {parent}: {e.strerror}")
    try:
        try:
            (cg / "memory.limit_in_bytes").write_text(str(LIMIT))
        except OSError as e:
            pytest.skip(f"cannot set memory.limit_in_bytes in {cg}: {e.strerror}")
        assert int(_read(cg / "memory.limit_in_bytes")) == LIMIT
        yield cg
    finally:
        _move_out(cg, parent)
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"could not remove the test's cgroup {cg}; procs: {_read(cg / 'cgroup.procs')}")


def excerpt(text: str, head: int = 2000, tail: int = 2500) -> str:
    return text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"


def cgroup_report(cg: Path) -> str:
    stat = parse_keyed(_read(cg / "memory.stat"))
    keys = ("total_rss", "total_cache", "total_active_file", "total_inactive_file", "total_dirty", "total_writeback")
    parts = [f"{name} {_read(cg / ('memory.' + name)).strip()}" for name in ("usage_in_bytes", "max_usage_in_bytes",
                                                                            "failcnt")]
    parts.append(f"oom_control {_read(cg / 'memory.oom_control').split()}")
    parts += [f"{k} {stat.get(k)}" for k in keys]
    return ", ".join(parts)


@pytest.mark.slow
def test_run_in_a_512_mib_v1_cgroup_completes_without_oom(tmp_path: Path, mock: MockThread,
                                                          v1_cgroup: Path) -> None:
    n = 800  # 800 MB of results through a 512 MiB cgroup
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"delay_s": 0.3, "kb": 1024}})
    run_dir = tmp_path / "tasks.run"
    argv = evalsup_cmd("run", "--model", "mock-model", "--base-url", mock.url, "-w", "4", "-c", "256",
                       str(tasks))
    # the child joins the cgroup before it execs evalsup, so the supervisor and every worker it starts is in it
    wrapper = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(v1_cgroup / "cgroup.procs"), *argv]
    p = Run(tmp_path, argv=wrapper)
    try:
        rc = p.wait(RUN_TIMEOUT_S)
        members = _read(v1_cgroup / "tasks").split()
        if rc is None:
            samples = memory_samples(run_dir)
            done = (run_dir / "results.jsonl").read_bytes().count(b"\n") if (run_dir / "results.jsonl").exists() else 0
            p.interrupt()
            raise AssertionError(
                f"the run did not finish within {RUN_TIMEOUT_S:g}s ({done} of {n} results flushed); "
                f"cgroup: {cgroup_report(v1_cgroup)}; last memory sample: {samples[-1] if samples else None}; "
                f"stderr:\n{excerpt(p.stderr)}")
    finally:
        p.cleanup()
    report = cgroup_report(v1_cgroup)
    err = p.stderr
    assert rc == 0, f"exit {rc}; cgroup: {report}; stderr:\n{excerpt(err)}"
    assert not members, f"processes left in the cgroup after the run: {members}"

    oom = parse_keyed(_read(v1_cgroup / "memory.oom_control"))
    failcnt = int(_read(v1_cgroup / "memory.failcnt"))
    s = summary(run_dir)
    # the limit really was the supervisor's: it read it from the cgroup it ran in
    assert s["memory"]["source"] == "cgroup1" and s["memory"]["limit_mb"] == 512, s["memory"]
    # no OOM kill: not by the kernel's count, not by evalsup's
    assert oom.get("oom_kill", 0) == 0, f"the kernel OOM-killed in the cgroup; {report}; stderr:\n{excerpt(err)}"
    assert oom.get("under_oom", 0) == 0, report
    assert s["oom_kills"] == 0, s
    assert s["worker_restarts_by_cause"].get("crashed", 0) == 0, (s["worker_restarts_by_cause"], excerpt(err))
    assert s["recycles"].get("hard_kill", 0) == 0, (s["recycles"], excerpt(err))
    # memory.failcnt counts every time the cgroup's usage hit the limit, page-cache reclaim included (800 MB
    # of results go through a 512 MiB cgroup), so it is reported rather than required to be 0
    print(f"cgroup at the end: {report} (failcnt {failcnt})")

    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    bad = [x for x in recs if x["error"] is not None]
    assert not bad, f"{len(bad)} failed records, e.g. {bad[0]['error']}"
    assert s["total"] == s["succeeded"] == n and s["failed"] == 0
    # it held back: capped the requests in flight or paused dispatch
    assert "capping requests in flight" in err or s["throttle"]["episodes"] > 0, (s["throttle"], excerpt(err))
