"""Memory supervision end to end: worker recycling (RSS with a leak report, task count) and the throttle's
hysteresis against a fake cgroup v2 tree whose figures the test moves. Real supervisor, real workers, real
HTTP against the mock on 127.0.0.1. Parsing of the cgroup files is covered by test_cgroup.py.

Nothing here passes or fails on wall-clock thresholds: "within two intervals" is counted in memory.jsonl
samples, and waits only have generous deadlines against hangs.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from evalsup.config.cgroup import CgroupProbe
from evalsup.mock.server import MockThread
from tests.harness import (
    ROOT,
    Run,
    assert_exactly_once,
    complete_lines,
    memory_samples,
    run_cli,
    summary,
    wait_until,
    write_tasks,
)

MIB = 1 << 20
PLUGINS = ROOT / "tests" / "plugins"
LEAK_PLUGIN = PLUGINS / "leak.py"


# ------------------------------------------------------------------------------------------- helpers


def base_args(mock: MockThread, tasks: Path, *extra: str) -> list[str]:
    return ["run", "--model", "mock-model", "--base-url", mock.url, "--fresh", *extra, str(tasks)]


# ---------------------------------------------------------------------------------------- recycling


def leak_site_line() -> int:
    for no, line in enumerate(LEAK_PLUGIN.read_text().splitlines(), 1):
        if "LEAK-SITE" in line:
            return no
    raise AssertionError(f"no LEAK-SITE marker in {LEAK_PLUGIN}")


@pytest.mark.slow
def test_leaking_worker_is_recycled_before_its_hard_limit_with_leak_report(tmp_path: Path, mock: MockThread) -> None:
    """Each task makes the worker keep 2 MiB more (tests/plugins/leak.py). With --max-worker-rss 150 the
    supervisor drains and replaces workers as they pass 150 MiB, long before the 225 MiB hard limit, and
    with --trace-memory a drained worker names the leaking line in leaks/worker-PID.txt."""
    n = 300
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"delay_s": 0.03}})
    r = run_cli(*base_args(mock, tasks, "-w", "2", "-c", "4", "--max-worker-rss", "150", "--monitor-interval", "0.1",
                           "--trace-memory", "--worker-plugin", f"{LEAK_PLUGIN}:retain"), timeout=120)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tasks.run"
    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    assert all(x["error"] is None for x in recs)
    s = summary(run_dir)
    assert s["total"] == s["succeeded"] == n and s["failed"] == 0
    # 300 tasks x 2 MiB = 600 MiB leaked in all: two workers under 150 MiB each cannot hold that
    assert s["recycles"]["rss"] > 0, s["recycles"]
    assert s["recycles"]["hard_kill"] == 0, (s["recycles"], r.stderr)
    assert s["worker_restarts"] == 0, (s["worker_restarts_by_cause"], r.stderr)
    assert s["peak_rss_mb"]["worker_max"] < 225, s["peak_rss_mb"]  # never reached the hard limit (1.5 x 150)
    pids = Counter(x["metrics"]["worker"] for x in recs)
    assert len(pids) > 2, f"work went to {len(pids)} workers only: {dict(pids)}"
    assert "recycling it" in r.stderr and "past the hard limit" not in r.stderr, r.stderr

    reports = sorted((run_dir / "leaks").glob("worker-*.txt")) if (run_dir / "leaks").is_dir() else []
    assert reports, f"no leaks/worker-PID.txt in {run_dir}; stderr:\n{r.stderr}"
    site = f"{LEAK_PLUGIN.resolve()}:{leak_site_line()}"
    events = [orjson.loads(x) for x in (run_dir / "events.jsonl").read_bytes().splitlines() if x]
    rss_recycled = {e["pid"] for e in events if e.get("event") == "recycle" and e.get("cause") == "rss"}
    for rep in reports:
        pid = int(rep.stem.split("-", 1)[1])
        assert pid in pids, f"{rep.name} is not one of the workers that did tasks: {sorted(pids)}"
        # every recycle is in events.jsonl (stderr says a repeated cause once a minute, with a count)
        assert pid in rss_recycled, f"{rep.name}: worker {pid} was not recycled for RSS: {sorted(rss_recycled)}"
        sites = [x for x in rep.read_text().splitlines()[1:] if x.strip()]
        assert sites, rep.read_text()
        # the top allocation site is the plugin's line that keeps 2 MiB per task
        assert sites[0].split()[0] == site, f"top site of {rep.name} is not {site}:\n{rep.read_text()}"


def test_max_tasks_per_worker_recycles_workers(tmp_path: Path, mock: MockThread) -> None:
    """--max-tasks-per-worker 200, 1000 tasks, 2 workers: workers are drained and replaced as they reach
    200 tasks, so at least 3 recycles and more than 2 worker PIDs, and still every task exactly once."""
    n, limit = 1000, 200
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    r = run_cli(*base_args(mock, tasks, "-w", "2", "--max-tasks-per-worker", str(limit)))
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tasks.run"
    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    assert all(x["error"] is None for x in recs)
    s = summary(run_dir)
    per_pid = Counter(x["metrics"]["worker"] for x in recs)
    detail = f"tasks per worker pid {dict(per_pid)}, recycles {s['recycles']}; stderr:\n{r.stderr}"
    assert s["recycles"]["tasks"] >= 3, detail
    assert len(per_pid) > 2, detail
    assert s["recycles"]["hard_kill"] == 0 and s["worker_restarts"] == 0, detail
    assert "tasks done; recycling it" in r.stderr, r.stderr


# ------------------------------------------------------------------------------- fake cgroup v2 throttle


class FakeCgroupV2:
    """A directory that CgroupProbe takes for a cgroup v2 mount root (see CgroupProbe.detect: a process path
    that does not exist under the root falls back to the root itself). memory.current is rewritten
    atomically (temp + rename) so the probe never reads a half-written number."""

    def __init__(self, root: Path, max_bytes: int, current: int) -> None:
        self.root = root
        root.mkdir()
        files = {
            "cgroup.controllers": "cpuset cpu io memory pids\n",
            "memory.max": f"{max_bytes}\n",
            "memory.high": "max\n",
            "memory.stat": "anon 0\nfile 0\nactive_file 0\ninactive_file 0\n",
            "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
            "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                               "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        }
        for name, text in files.items():
            (root / name).write_text(text)
        self.set_current(current)

    def set_current(self, value: int) -> None:
        tmp = self.root / ".memory.current.tmp"
        tmp.write_text(f"{value}\n")
        os.replace(tmp, self.root / "memory.current")


def has_v2_line() -> bool:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return False
    return any(line.startswith("0::") for line in text.splitlines())


def mock_quiet(mock: MockThread) -> Callable[[], bool]:
    """True once nothing is in flight at the mock and the request count has held still for half a second."""
    last = [-1, 0.0]

    def check() -> bool:
        st = mock.stats()
        now = time.monotonic()
        if st["in_flight"] != 0 or st["requests"] != last[0]:
            last[0], last[1] = (st["requests"] if st["in_flight"] == 0 else -1), now
            return False
        return now - last[1] >= 0.5

    return check


@pytest.mark.slow
def test_fake_cgroup_v2_pause_and_resume_with_hysteresis(tmp_path: Path, mock: MockThread,
                                                        start: Callable[..., Run]) -> None:
    """memory.max 1 GiB: pause above 85% (870.4 MiB), resume only at or below 70% (716.8 MiB). The test moves
    memory.current up past the high mark, down between the marks (still paused, nothing new reaches the
    endpoint), then below the low mark (resumes and finishes)."""
    if not has_v2_line():
        pytest.skip("this host's /proc/self/cgroup has no cgroup v2 line (0::/...), so no v2 root can be detected")
    limit = 1 << 30
    high, low = int(limit * 0.85), int(limit * 0.70)
    fake = FakeCgroupV2(tmp_path / "cgroup", limit, 300 * MIB)
    # what the supervisor will see: the fake root taken as v2, even on a host with a v1 memory line
    probe = CgroupProbe.detect(root=str(fake.root))
    assert (probe.source, probe.path) == ("cgroup2", str(fake.root)), probe
    assert probe.sample().limit_bytes == limit

    n = 200
    interval = 0.1
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"delay_s": 0.2}})
    run_dir = tmp_path / "tasks.run"
    results = run_dir / "results.jsonl"
    p = start(*base_args(mock, tasks, "-w", "2", "-c", "16", "--monitor-interval", str(interval)),
              env={"EVALSUP_CGROUP_ROOT": str(fake.root)})

    wait_until(lambda: complete_lines(results) >= 30, "the first results", 60, p)
    assert not any(x["paused"] for x in memory_samples(run_dir)), "paused before the high mark was crossed"

    # 1. above the high mark: pause
    fake.set_current(900 * MIB)
    wait_until(lambda: any(x["paused"] for x in memory_samples(run_dir)), "a paused sample in memory.jsonl", 30, p)
    wait_until(lambda: "pausing" in p.stderr, "'pausing' on stderr", 10, p)
    # requests already at the endpoint land (0.2 s each); after that nothing new may arrive
    quiet = mock_quiet(mock)
    wait_until(quiet, "the requests in flight to land", 30, p)
    at_pause = mock.stats()["requests"]
    assert at_pause < n, "the run was over before the pause could be tested; give tasks more delay"

    # 2. between the marks: stays paused, dispatch stays stopped
    fake.set_current(780 * MIB)

    def between_samples() -> int:
        return sum(1 for x in memory_samples(run_dir) if x["working_set"] == 780 * MIB)

    wait_until(lambda: between_samples() >= 15, "15 samples between the marks", 60, p)
    assert mock.stats()["requests"] == at_pause, "requests reached the endpoint while dispatch was paused"
    assert "resuming" not in p.stderr, p.stderr

    # 3. below the low mark: resume, and the run finishes
    fake.set_current(400 * MIB)
    rc = p.wait(120)
    if rc is None:
        p.interrupt()
        raise AssertionError(f"the run did not finish after the resume; stderr:\n{p.stderr[-3000:]}")
    assert rc == 0, p.stderr
    err = p.stderr
    assert err.count("pausing") == 1 and err.count("resuming") == 1, err
    assert mock.stats()["requests"] > at_pause
    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    assert all(x["error"] is None for x in recs)

    # the samples: counted in intervals, not seconds
    samples = memory_samples(run_dir)
    ws = [x["working_set"] for x in samples]
    paused = [bool(x["paused"]) for x in samples]
    first_high = next(i for i, v in enumerate(ws) if v >= high)
    assert not any(paused[:first_high]), "paused before any sample crossed the high mark"
    trail = list(zip(ws, paused, strict=True))
    assert any(paused[first_high:first_high + 2]), \
        f"not paused within two samples of crossing the high mark: {trail[first_high:first_high + 5]}"
    first_pause = next(i for i, v in enumerate(paused) if v)
    first_low = next(i for i in range(first_pause, len(ws)) if ws[i] <= low)
    # every sample from the pause until the working set crossed the low mark is paused, including the
    # ones between the marks (780 MiB is below the high mark, but not below the low one)
    assert all(paused[first_pause:first_low]), trail[first_pause:first_low]
    assert any(low < v < high for v in ws[first_pause:first_low])
    # and it resumes within two samples once below the low mark (the sample that decides to resume is
    # recorded with the state it was taken in)
    resumed = [i for i in range(first_low, len(paused)) if not paused[i]]
    assert resumed and resumed[0] <= first_low + 2, trail[first_low:first_low + 5]
    assert not any(paused[resumed[0]:]), "paused again after resuming"

    s = summary(run_dir)
    assert s["throttle"]["episodes"] == 1, s["throttle"]
    assert s["throttle"]["paused_s"] > 0, s["throttle"]
    assert s["memory"]["source"] == "cgroup2", s["memory"]
    assert s["memory"]["limit_mb"] == 1024, s["memory"]
    assert s["oom_kills"] == 0
    assert s["total"] == s["succeeded"] == n
