#!/usr/bin/env python3
"""Benchmark: evalsup (1, 2, 4 workers; and its default, which adds workers while they are CPU-bound) against
three single-process asyncio baselines.

Every contender gets the same task file, the same mock endpoint (`evalsup mock`, in its own process on a
free 127.0.0.1 port, not part of the measured tree) and the same aiohttp settings (one ClientSession,
TCPConnector(limit=in-flight)). For each run it measures, from outside:

* wall time (start of the process to its exit), requests/s and its ratio to Little's law's ideal
  (in-flight / mean latency of the mock);
* CPU seconds of the whole process tree (user + sys, children included): exact from the rusage of the
  waited process (its waited children included), split into the top process (evalsup's supervisor) and
  its children (evalsup's workers) from /proc of the exited, not yet reaped process;
* peak RSS of the whole tree (sum over its processes, sampled every --sample-ms) and of its largest
  process (the kernel's high-water mark, ru_maxrss);
* whether every task's result is in the output exactly once (distinct ids against the task file), and
  how many requests the mock served (a figure above N means retries);
* from the mock's side: time to the first request (start-up), most requests held at once, its own CPU,
  requests per half second (in --json: stalls that a mean hides); and the CPU that unrelated processes
  took on the machine meanwhile, since a busy machine makes every figure noisy.

    scripts/bench --quick                                     # smoke test, < 1 minute
    scripts/bench --n 10000 --kb 100 --latency-ms 200 --inflight 128 --json bench.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
from rich.console import Console
from rich.table import Table

from evalsup.supervisor.rss import shmem_bytes

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / "scripts" / "baselines"
PY = sys.executable
MB = 1 << 20
REFERENCE = "bounded_queue"

DEFAULTS = {"n": 10_000, "kb": 4.0, "latency_ms": 200.0, "jitter_pct": 20.0, "inflight": 128, "repeat": 1}
QUICK = {"n": 2000, "kb": 4.0, "latency_ms": 50.0, "jitter_pct": 20.0, "inflight": 64, "repeat": 1}


@dataclass(frozen=True)
class Contender:
    name: str
    workers: int = 0  # evalsup worker processes; 0 for a baseline script, AUTO for evalsup's default
    script: str = ""

    @property
    def is_evalsup(self) -> bool:
        return self.workers != 0


AUTO = -1  # no --workers: evalsup starts with one and adds workers while each is CPU-bound


CONTENDERS = [
    Contender(REFERENCE, script="bounded_queue.py"),
    Contender("bounded_queue_raw", script="bounded_queue_raw.py"),
    Contender("naive_gather", script="naive_gather.py"),
    Contender("evalsup-1w", workers=1),
    Contender("evalsup-2w", workers=2),
    Contender("evalsup-4w", workers=4),
    Contender("evalsup-auto", workers=AUTO),
]


# ---------------------------------------------------------------------------------------------- options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="scripts/bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="contenders: " + ", ".join(c.name for c in CONTENDERS) + " ('evalsup' selects the evalsup ones)",
    )
    ap.add_argument("--n", type=int, help=f"tasks (default {DEFAULTS['n']})")
    ap.add_argument("--kb", type=float, help=f"response size in KB (default {DEFAULTS['kb']:g})")
    ap.add_argument("--latency-ms", type=float, help=f"mock mean latency (default {DEFAULTS['latency_ms']:g})")
    ap.add_argument("--jitter-pct", type=float, help="uniform +- jitter, percent of the latency (default 20)")
    ap.add_argument("--inflight", type=int, help=f"requests in flight (default {DEFAULTS['inflight']})")
    ap.add_argument("--repeat", type=int, help="runs per contender; figures are medians (default 1)")
    ap.add_argument("--contenders", default="all", help="comma-separated subset (default: all)")
    ap.add_argument("--json", dest="json_out", type=Path, help="write the raw figures of every run here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke config: n=2000, kb=4, latency 50 ms, inflight 64, 1 repeat (explicit options win)")
    ap.add_argument("--sample-ms", type=float, default=50.0, help="process tree sampling interval (default 50)")
    ap.add_argument("--timeout", type=float, default=0.0, help="seconds before a run is killed (default: generous)")
    ap.add_argument("--workdir", type=Path, help="where task files and outputs go (default: a new temp directory)")
    ap.add_argument("--keep", action="store_true", help="keep outputs and the work directory")
    ap.add_argument("--no-warm", dest="warm", action="store_false",
                    help="before each run, do not write and delete a file as large as its output (on a VM, the "
                         "first write into never-touched memory is ~10x dearer; warming evens it out)")
    ap.add_argument("--hold-freed-memory", action="store_true",
                    help="(root, on a VM with free page reporting) keep freed memory in the guest for the "
                         "benchmark (min_free_ms 120 s, restored at the end): see reporting_note()")
    ap.add_argument("--evalsup-src", type=Path,
                    help="run evalsup from this source tree (a folder holding evalsup/) instead of this checkout's")
    args = ap.parse_args(argv)
    if args.evalsup_src is not None:
        args.evalsup_src = args.evalsup_src.resolve()
        if not (args.evalsup_src / "evalsup" / "__init__.py").is_file():
            ap.error(f"--evalsup-src {args.evalsup_src}: no evalsup/__init__.py there")
    base = QUICK if args.quick else DEFAULTS
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.n < 1 or args.inflight < 1 or args.repeat < 1 or args.kb < 0 or args.latency_ms < 0:
        ap.error("--n, --inflight and --repeat must be >= 1; --kb and --latency-ms >= 0")
    if args.contenders == "all":
        args.selected = list(CONTENDERS)
    else:
        wanted = [w.strip() for w in args.contenders.split(",") if w.strip()]
        chosen: list[Contender] = []
        for w in wanted:
            hits = [c for c in CONTENDERS if c.name == w or (w == "evalsup" and c.is_evalsup)]
            if not hits:
                ap.error(f"unknown contender {w!r}; choose from {', '.join(c.name for c in CONTENDERS)}, evalsup")
            chosen += [c for c in hits if c not in chosen]
        args.selected = chosen
    return args


# ---------------------------------------------------------------------------------------------- the mock


class Mock:
    """`python -m evalsup mock` in its own process on a free port (port 0; the URL is read from its output)."""

    def __init__(self, workdir: Path, latency_ms: float, jitter_ms: float, kb: float) -> None:
        self.log = workdir / "mock.log"
        self.cmd = [PY, "-m", "evalsup", "mock", "--host", "127.0.0.1", "--port", "0",
                    "--latency-ms", f"{latency_ms:g}", "--jitter-ms", f"{jitter_ms:g}", "--response-kb", f"{kb:g}"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.admin = ""

    def start(self, timeout: float = 30.0) -> Mock:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("mock endpoint on "):
                    self.url = line.removeprefix("mock endpoint on ").strip()
                    self.admin = self.url.removesuffix("/v1")
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"bench: the mock did not start; its output:\n{self.log.read_text(errors='replace')}")

    def _req(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.admin + path, method=method, data=b"{}" if method == "POST" else None,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return orjson.loads(r.read())

    def reset(self) -> None:
        self._req("POST", "/_mock/reset")

    def stats(self) -> dict[str, Any]:
        return dict(self._req("GET", "/_mock/stats"))

    def warm_up(self, model: str) -> None:
        body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": "warm-up"}]})
        for _ in range(3):
            req = urllib.request.Request(self.url + "/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()

    def cpu_s(self) -> float:
        assert self.proc is not None
        try:
            t = psutil.Process(self.proc.pid).cpu_times()
        except psutil.Error:
            return float("nan")
        return float(t.user + t.system)

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


# ---------------------------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    exit_code: int | None
    timed_out: bool
    wall_s: float
    cpu_s: float  # exact: rusage of the waited process, its waited children included
    cpu_user_s: float
    cpu_sys_s: float
    cpu_main_s: float  # the top process alone (evalsup: the supervisor)
    cpu_children_s: float  # its reaped children (evalsup: the workers)
    cpu_sampled_s: float  # sum of the last sampled CPU of every process seen (a cross-check)
    peak_tree_rss_mb: float  # sampled sum over the tree
    peak_proc_rss_mb: float  # sampled largest process
    maxrss_mb: float  # kernel high-water mark of the largest single process (ru_maxrss)
    processes_seen: int
    leftover_pids: list[int]  # processes of the tree still alive after the top one exited (killed)
    samples: int
    timeline: list[tuple[float, float, int]]  # (t s, tree RSS MB, processes)
    start_epoch: float  # time.time() at the start, to line up the mock's arrival times
    host_busy_s: float  # CPU seconds the whole machine was busy during the run (every process)
    bench_cpu_s: float  # CPU seconds of this script (the sampler) during the run


def _waiter(pid: int, done: threading.Event, box: list[float]) -> None:
    """Block until pid exits, leaving it a zombie (WNOWAIT) so /proc still has its final CPU times."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    box.append(time.perf_counter())
    done.set()


def host_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all CPUs), for the load of unrelated processes."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def measure(cmd: list[str], stdout: Path, stderr: Path, timeout: float, interval: float,
            env: dict[str, str] | None = None, cwd: Path = ROOT) -> Measured:
    cpu_last: dict[int, float] = {}
    procs: dict[int, psutil.Process] = {}
    peak_tree = peak_proc = 0
    timeline: list[tuple[float, float, int]] = []
    timed_out = False
    with open(stdout, "wb") as so, open(stderr, "wb") as se:
        me = psutil.Process()
        host0, me0 = host_busy_s(), sum(me.cpu_times()[:2])
        t0, epoch0 = time.perf_counter(), time.time()
        p = subprocess.Popen(cmd, stdout=so, stderr=se, cwd=cwd, env=env, start_new_session=True)
    done = threading.Event()
    box: list[float] = []
    threading.Thread(target=_waiter, args=(p.pid, done, box), daemon=True).start()
    root = psutil.Process(p.pid)
    procs[p.pid] = root
    samples = 0
    try:
        while not done.is_set():
            now = time.perf_counter()
            if now - t0 > timeout:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)  # its own session: the group is the tree we started
                done.wait(30)
                break
            try:
                kids = root.children(recursive=True)
            except psutil.Error:
                kids = []
            tree = 0
            for pr in [root, *kids]:
                pr = procs.setdefault(pr.pid, pr)
                try:
                    with pr.oneshot():
                        rss = pr.memory_info().rss
                        ct = pr.cpu_times()
                except psutil.Error:
                    continue
                if pr.pid != root.pid:  # a worker's mapping of its results ring: counted in the supervisor's RSS
                    rss -= shmem_bytes(pr.pid) or 0
                tree += rss
                peak_proc = max(peak_proc, rss)
                cpu_last[pr.pid] = ct.user + ct.system
            peak_tree = max(peak_tree, tree)
            samples += 1
            timeline.append((round(now - t0, 3), round(tree / MB, 1), 1 + len(kids)))
            done.wait(interval)
    except BaseException:  # Ctrl-C: take the run's process group down with us, and reap it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p.pid, 0)
        raise
    end = box[0] if box else time.perf_counter()
    host, bench_cpu = host_busy_s() - host0, sum(me.cpu_times()[:2]) - me0
    cpu_main = cpu_children = 0.0
    with contextlib.suppress(psutil.Error):
        ct = root.cpu_times()  # a zombie now: its final figures
        cpu_main = ct.user + ct.system
        cpu_children = ct.children_user + ct.children_system
    leftovers: list[int] = []
    for pid, pr in procs.items():
        if pid == p.pid:
            continue
        with contextlib.suppress(psutil.Error):
            if pr.is_running() and pr.status() != psutil.STATUS_ZOMBIE:
                leftovers.append(pid)
                pr.kill()  # a process of the tree we started, outliving its parent
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return Measured(
        exit_code=None if timed_out else p.returncode, timed_out=timed_out, wall_s=end - t0,
        cpu_s=ru.ru_utime + ru.ru_stime, cpu_user_s=ru.ru_utime, cpu_sys_s=ru.ru_stime,
        cpu_main_s=cpu_main, cpu_children_s=cpu_children, cpu_sampled_s=sum(cpu_last.values()),
        peak_tree_rss_mb=peak_tree / MB, peak_proc_rss_mb=peak_proc / MB, maxrss_mb=ru.ru_maxrss / 1024,
        processes_seen=len(procs), leftover_pids=leftovers, samples=samples, timeline=timeline, start_epoch=epoch0,
        host_busy_s=host, bench_cpu_s=bench_cpu,
    )


def arrival_bins(arrivals: list[float], start: float, wall: float, width: float = 0.5) -> list[int]:
    """Requests the mock received per `width` seconds of the run: shows stalls that a mean hides."""
    bins = [0] * (int(wall / width) + 1)
    for t in arrivals:
        i = int((t - start) / width)
        if 0 <= i < len(bins):
            bins[i] += 1
    return bins


def check_output(path: Path, n: int) -> dict[str, Any]:
    """Every id t0..t{n-1} present exactly once? Plus how many records are successes."""
    counts: collections.Counter[str] = collections.Counter()
    ok = lines = bad_lines = 0
    errors: collections.Counter[str] = collections.Counter()
    if path.exists():
        with open(path, "rb") as f:
            for line in f:
                lines += 1
                try:
                    rec = orjson.loads(line)
                    tid = str(rec.get("custom_id", rec.get("id")))
                except (orjson.JSONDecodeError, AttributeError):
                    bad_lines += 1
                    continue
                counts[tid] += 1
                resp = rec.get("response") or {}
                if rec.get("error") is None and resp.get("status_code") == 200 and resp.get("body") is not None:
                    ok += 1
                else:
                    errors[str((rec.get("error") or {}).get("code"))] += 1
    expected = {f"t{i}" for i in range(n)}
    distinct = len(counts)
    dup = sum(1 for c in counts.values() if c > 1)
    missing = len(expected - counts.keys())
    extra = len(counts.keys() - expected)
    return {
        "lines": lines, "distinct_ids": distinct, "duplicated_ids": dup, "missing_ids": missing,
        "unknown_ids": extra, "unparsable_lines": bad_lines, "ok": ok, "errors": dict(errors),
        "exactly_once": lines == n and distinct == n and dup == 0 and missing == 0 and extra == 0 and not bad_lines,
    }


# ---------------------------------------------------------------------------------------------- runs


def make_tasks(path: Path, n: int) -> None:
    with open(path, "wb", buffering=1 << 20) as f:
        for i in range(n):
            f.write(orjson.dumps({"id": f"t{i}", "messages": [
                {"role": "user", "content": f"Question {i}: what is {i} + {i % 97}? Answer briefly."}]}) + b"\n")


def command(c: Contender, args: argparse.Namespace, url: str, tasks: Path, out: Path) -> list[str]:
    if c.is_evalsup:
        fixed = [] if c.workers == AUTO else ["--workers", str(c.workers)]
        return [PY, "-m", "evalsup", "run", *fixed, "--concurrency", str(args.inflight),
                "--model", "mock-model", "--base-url", url, "--out", str(out), "--quiet", "--json", str(tasks)]
    return [PY, str(BASELINES / c.script), "--base-url", url, "--model", "mock-model",
            "--inflight", str(args.inflight), "--out", str(out), str(tasks)]


def warm_memory(workdir: Path, nbytes: int) -> None:
    """Write and delete a file of ``nbytes``, so that the run after it writes into memory the guest has touched.

    On a VM (this project's machines are Firecracker VMs) the first write into never-touched guest memory costs
    the host a page fault per page: about 2.3 s per GB of page cache here, against 0.2 s per GB for memory that
    was used and freed before. Without this, whichever contender runs first on a fresh machine pays that cost
    for its results file (and naive_gather's gigabytes warm the memory for those after it).
    """
    buf = b"\0" * MB
    path = workdir / "warm.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for off in range(0, nbytes, MB):
            os.pwrite(fd, buf, off)
    finally:
        os.close(fd)
        path.unlink()


REPORTING = Path("/sys/module/page_reporting/parameters/min_free_ms")


def reporting_note() -> str | None:
    """What free page reporting does to these figures, when this VM has it on at once (None: it does not).

    A VM with free page reporting (``page_reporting``, a virtio balloon) hands memory the guest frees back to
    the host; with ``min_free_ms`` 0, at once. Touching that memory again costs a host fault per page, billed
    to the guest as the time of the instruction that touched it: a 1 GB page-cache write cost 2.46 s of CPU
    into returned memory against 0.18 s into memory used and freed just before, and 1.51 s again after a
    3 s pause (``pwrite`` of 1 MiB, this project's 2-core VM). Every run frees its output and buffers and
    writes new ones, so each contender's CPU at 1 MB swings with how much of what it touched had been
    returned; warming (``warm_memory``) does not help once the freed memory is returned before the run."""
    try:
        value = REPORTING.read_text().strip()
    except OSError:
        return None
    if value != "0":
        return None
    return (f"free page reporting returns freed memory to the host at once ({REPORTING} is 0): writes into it "
            "cost up to 10x the CPU, and large-response figures swing with it; --hold-freed-memory (root) holds "
            "freed memory in the guest for the benchmark")


@contextlib.contextmanager
def freed_memory_held(on: bool) -> Any:
    """``--hold-freed-memory``: freed memory stays in the guest for 120 s before it is reported (restored at
    the end); nothing when off or when this VM has no free page reporting."""
    old = None
    if on:
        try:
            old = REPORTING.read_text().strip()
            REPORTING.write_text("120000")
            print(f"bench: {REPORTING} set to 120000 (was {old}; restored at the end, or by hand after a kill -9)",
                  file=sys.stderr)
        except OSError as e:
            raise SystemExit(f"bench: --hold-freed-memory: cannot set {REPORTING} ({e.strerror}): run as root, "
                             "on a VM with free page reporting") from None
    try:
        yield
    finally:
        if old is not None:
            with contextlib.suppress(OSError):
                REPORTING.write_text(old)


def fsync_time(path: Path) -> float | None:
    """Seconds an fsync of ``path`` takes now (None if there is no such file)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        t0 = time.monotonic()
        os.fsync(fd)
        return time.monotonic() - t0
    finally:
        os.close(fd)


def run_one(c: Contender, args: argparse.Namespace, mock: Mock, tasks: Path, rundir: Path) -> dict[str, Any]:
    rundir.mkdir(parents=True)
    out = rundir / ("evalsup.run" if c.is_evalsup else "results.jsonl")
    results = out / "results.jsonl" if c.is_evalsup else out
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    cwd = ROOT
    if c.is_evalsup and args.evalsup_src:
        cwd = args.evalsup_src  # `python -m evalsup` (and its workers) import the package from the cwd first
        env["PYTHONPATH"] = str(args.evalsup_src)
    loadavg = os.getloadavg()[0]
    mock.reset()
    mock_cpu0 = mock.cpu_s()
    m = measure(command(c, args, mock.url, tasks, out), rundir / "stdout", rundir / "stderr", args.run_timeout,
                args.sample_ms / 1000, env, cwd)
    mock_cpu = mock.cpu_s() - mock_cpu0
    sync_s = fsync_time(results)
    ms = mock.stats()
    arrivals = sorted(ms.get("arrivals") or [])
    chat = (ms.get("by_path") or {}).get("/v1/chat/completions", 0)
    # evalsup's connection check (GET /v1/models) comes before any chat request: leave it out of the start-up
    complete = len(arrivals) == ms.get("requests")  # the mock keeps the last 200,000 arrival times only
    first = arrivals[len(arrivals) - chat] if complete and 0 < chat <= len(arrivals) else None
    others = max(0.0, m.host_busy_s - m.cpu_s - mock_cpu - m.bench_cpu_s)
    res = check_output(results, args.n)
    rps = args.n / m.wall_s if m.wall_s > 0 else 0.0
    rec: dict[str, Any] = {
        "contender": c.name, "workers": c.workers or None, **vars(m),
        "requests_per_s": rps,
        # evalsup fsyncs its results before it exits; the baselines leave theirs in the page cache: the time an
        # fsync of the output takes after the exit is what they still owe before their results survive a crash
        "sync_after_exit_s": sync_s,
        "durable_s": m.wall_s + sync_s if sync_s is not None else None,
        # from the launch to the mock's first request, and from its last request to the exit
        "first_request_s": first - m.start_epoch if first is not None else None,
        "first_any_request_s": arrivals[0] - m.start_epoch if arrivals else None,
        "after_last_request_s": m.start_epoch + m.wall_s - arrivals[-1] if arrivals else None,
        "other_cpu_s": others,  # CPU of unrelated processes on the machine during the run (noise)
        "other_cores": others / m.wall_s if m.wall_s > 0 else None,
        "loadavg_1m_before": loadavg,
        "ideal_ratio": rps / args.ideal_rps if args.ideal_rps else None,
        "mock": {"requests": ms.get("requests"), "by_path": ms.get("by_path"),
                 "chat_requests": chat,
                 "statuses": ms.get("statuses"),
                 "max_in_flight": ms.get("max_in_flight"), "bytes_out": ms.get("bytes_out"), "cpu_s": mock_cpu,
                 "busy": mock_cpu / m.wall_s if m.wall_s > 0 else None,
                 "arrivals_per_half_s": arrival_bins(arrivals, m.start_epoch, m.wall_s)},
        "results": res,
    }
    if c.is_evalsup:
        with contextlib.suppress(orjson.JSONDecodeError, OSError):
            rec["evalsup_summary"] = orjson.loads((rundir / "stdout").read_bytes() or b"null")
        if c.workers == AUTO and isinstance(rec.get("evalsup_summary"), dict):
            rec["workers_used"] = rec["evalsup_summary"].get("workers")  # how many its default ended with
    if m.exit_code != 0 or not res["exactly_once"]:
        rec["stderr_tail"] = (rundir / "stderr").read_text(errors="replace")[-3000:]
    if not args.keep:
        shutil.rmtree(rundir, ignore_errors=True)
    return rec


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if isinstance(r.get(key), int | float)]
    return statistics.median(vals) if vals else None


def summarise(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("wall_s", "requests_per_s", "ideal_ratio", "cpu_s", "cpu_main_s", "cpu_children_s", "cpu_sampled_s",
            "peak_tree_rss_mb", "peak_proc_rss_mb", "maxrss_mb", "first_request_s", "after_last_request_s",
            "other_cores", "sync_after_exit_s", "durable_s")
    s: dict[str, Any] = {"contender": name, "runs": len(runs), **{k: median_of(runs, k) for k in keys}}
    s["mock_busy"] = statistics.median([r["mock"]["busy"] or 0.0 for r in runs])
    s["mock_max_in_flight"] = max(r["mock"]["max_in_flight"] or 0 for r in runs)
    s["mock_chat_requests"] = max(r["mock"]["chat_requests"] or 0 for r in runs)
    s["all_ok"] = all(r["exit_code"] == 0 and r["results"]["exactly_once"] for r in runs)
    s["ok_records"] = min(r["results"]["ok"] for r in runs)
    s["distinct_ids"] = min(r["results"]["distinct_ids"] for r in runs)
    s["lines"] = max(r["results"]["lines"] for r in runs)
    used = sorted({r["workers_used"] for r in runs if r.get("workers_used")})
    if used:
        s["workers_used"] = used  # evalsup's default: the worker counts its runs ended with
    return s


# ---------------------------------------------------------------------------------------------- report


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(v: float | None, ref: float | None) -> str:
    return "-" if not v or not ref else f"{v / ref:.2f}x"


def print_table(args: argparse.Namespace, summaries: list[dict[str, Any]], console: Console) -> None:
    ref = next((s for s in summaries if s["contender"] == REFERENCE), None)
    jitter = args.latency_ms * args.jitter_pct / 100
    ideal = f"{args.ideal_rps:,.0f} req/s" if args.ideal_rps else "n/a (latency 0)"
    title = (f"n={args.n:,}  response {args.kb:g} KB  latency {args.latency_ms:g}±{jitter:g} ms  "
             f"in-flight {args.inflight}  repeat {args.repeat} (medians)  Little's-law ideal {ideal}  "
             f"[{os.cpu_count()} CPUs, Python {platform.python_version()}]")
    t = Table(title=title, title_justify="left")
    cols = ["contender", "wall s", "to disk s", "1st req s", "req/s", "of ideal", "CPU s", "sup/wrk CPU", "RSS tree MB",
            "max proc MB", "results", "mock infl", "mock CPU", "others", "x wall", "x CPU", "x RSS"]
    for i, col in enumerate(cols):
        t.add_column(col, justify="left" if col in ("contender", "results") else "right", no_wrap=i == 0)
    for s in summaries:
        split = (f"{s['cpu_main_s']:.1f}/{s['cpu_children_s']:.1f}"
                 if s["contender"].startswith("evalsup") and s["cpu_main_s"] is not None else "-")
        extra = "" if s["mock_chat_requests"] == args.n else f" ({s['mock_chat_requests']:,} req)"
        res = (f"[green]{s['distinct_ids']:,} once[/]" if s["all_ok"]
               else f"[red]{s['distinct_ids']:,} ids, {s['lines']:,} lines, {s['ok_records']:,} ok[/]")
        t.add_row(
            s["contender"] + (f" ({'/'.join(map(str, s['workers_used']))}w)" if s.get("workers_used") else ""),
            _f(s["wall_s"], ".2f"), _f(s["durable_s"], ".2f"), _f(s["first_request_s"], ".2f"),
            _f(s["requests_per_s"], ",.0f"),
            _f(None if s["ideal_ratio"] is None else 100 * s["ideal_ratio"], ".0f") + "%",
            _f(s["cpu_s"], ".2f"), split, _f(s["peak_tree_rss_mb"], ",.0f"), _f(s["maxrss_mb"], ",.0f"),
            res + extra, str(s["mock_max_in_flight"]), _f(100 * s["mock_busy"], ".0f") + "%",
            _f(s["other_cores"], ".2f"),
            _ratio(s["wall_s"], ref and ref["wall_s"]), _ratio(s["cpu_s"], ref and ref["cpu_s"]),
            _ratio(s["peak_tree_rss_mb"], ref and ref["peak_tree_rss_mb"]),
        )
    console.print(t)
    notes = [
        f"x wall, x CPU, x RSS: ratio to {REFERENCE} of this invocation (lower is better); results: distinct ids "
        f"of the {args.n:,} tasks in the output, each exactly once (green), and the mock's request count if not N.",
        "CPU s: user+sys of the whole process tree (rusage of the waited process, its children included); "
        "sup/wrk CPU: evalsup's supervisor alone / its worker processes.",
        f"RSS tree: peak of the sum over the tree's processes, sampled every {args.sample_ms:g} ms; max proc: the "
        "kernel's high-water mark (ru_maxrss) of the largest single process. The mock is not in the tree.",
        "to disk s: wall plus an fsync of the output right after the exit (evalsup fsyncs before it exits; the "
        "baselines leave results in the page cache, where a crash of the machine loses them).",
        "1st req s: from the launch to the mock's first chat request (start-up). others: CPU cores busy with unrelated "
        "processes on the machine during the run (noise; should be near 0 for a fair comparison).",
        "mock infl: most requests the mock held at once; mock CPU: the mock's CPU time / the run's wall time "
        "(near 100% means the endpoint, not the client, set the pace).",
    ]
    if ref is None:
        notes.append(f"{REFERENCE} was not run: no ratios.")
    busy = max((s["other_cores"] or 0.0 for s in summaries), default=0.0)
    if busy > 0.25:
        notes.append(f"[yellow]warning: other processes kept up to {busy:.2f} of {os.cpu_count()} CPUs busy during "
                     "these runs: the figures are noisy (use --repeat, or a quiet machine).[/]")
    for n in notes:
        console.print(f"[dim]{n}[/]")


# ---------------------------------------------------------------------------------------------- main


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # same clean-up as Ctrl-C: the run in progress and the mock are stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
    args.ideal_rps = args.inflight / (args.latency_ms / 1000) if args.latency_ms > 0 else None
    ideal_wall = args.n / args.ideal_rps if args.ideal_rps else args.n / 1000
    args.run_timeout = args.timeout or max(120.0, 20 * ideal_wall + 60)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="evalsup-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    tasks = workdir / "tasks.jsonl"
    make_tasks(tasks, args.n)
    # Warm the page cache, and write the .pyc files of what the contenders import before any timed run.
    # compileall writes them even under PYTHONDONTWRITEBYTECODE (set on the project's machines), which would
    # otherwise have every evalsup process compile its ~40 modules from source (~40 ms each). -q: only errors.
    src = args.evalsup_src or ROOT
    subprocess.run([PY, "-m", "compileall", "-q", str(src / "evalsup"), str(BASELINES)], check=True)
    subprocess.run([PY, "-c", "import aiohttp, orjson, uvloop, psutil, evalsup.worker.main, evalsup.cli"],
                   check=True, cwd=src)
    mock = Mock(workdir, args.latency_ms, args.latency_ms * args.jitter_pct / 100, args.kb)
    raw: list[dict[str, Any]] = []
    held = contextlib.ExitStack()
    try:
        held.enter_context(freed_memory_held(args.hold_freed_memory))
        note = reporting_note()
        if note is not None:
            err.print(f"[yellow]bench: {note}[/]")
        mock.start()
        mock.warm_up("mock-model")
        err.print(f"bench: mock on {mock.url} (pid {mock.proc.pid if mock.proc else '?'}), {args.n:,} tasks in "
                  f"{tasks}; {len(args.selected)} contender(s) x {args.repeat}")
        total = len(args.selected) * args.repeat
        k = 0
        for rep in range(args.repeat):  # round-robin, so that drift hits every contender alike
            for c in args.selected:
                k += 1
                if args.warm:
                    warm_memory(workdir, int(args.n * (args.kb * 1024 + 600) * 1.25) + 64 * MB)
                rec = run_one(c, args, mock, tasks, workdir / f"run-{rep}-{c.name}")
                rec["repeat"] = rep
                raw.append(rec)
                res = rec["results"]
                status = "ok" if rec["exit_code"] == 0 and res["exactly_once"] else (
                    f"[red]exit {rec['exit_code']}{' TIMEOUT' if rec['timed_out'] else ''}, "
                    f"{res['distinct_ids']}/{args.n} ids, {res['lines']} lines[/]")
                err.print(f"  [{k}/{total}] {c.name:<18} {rec['wall_s']:7.2f} s  {rec['requests_per_s']:8,.0f} req/s"
                          f"  CPU {rec['cpu_s']:6.2f} s  RSS {rec['peak_tree_rss_mb']:7,.0f} MB"
                          f"  others {rec['other_cores'] or 0:4.2f} cores  {status}")
                if rec.get("stderr_tail") and rec["exit_code"] != 0:
                    err.print(f"[dim]{rec['stderr_tail'][-1500:]}[/]")
                if rec["leftover_pids"]:
                    err.print(f"[yellow]  {c.name}: processes {rec['leftover_pids']} outlived it (killed)[/]")
    except KeyboardInterrupt:
        err.print("bench: interrupted")
        return 130
    finally:
        mock.stop()
        held.close()
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    summaries = [summarise(c.name, [r for r in raw if r["contender"] == c.name]) for c in args.selected]
    print_table(args, summaries, console)
    if args.json_out:
        cfg = {k: getattr(args, k) for k in ("n", "kb", "latency_ms", "jitter_pct", "inflight", "repeat", "sample_ms",
                                             "ideal_rps")}
        doc = {"config": cfg, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                          "platform": platform.platform(),
                                          "freed_memory_held": args.hold_freed_memory},
               "summary": summaries, "runs": raw}
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
        err.print(f"bench: raw figures in {args.json_out}")
    return 0 if all(s["all_ok"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
