#!/usr/bin/env python3
"""Benchmark: memory against the number of tasks (issue 33). evalsup runs inside a real cgroup v1 memory cgroup
(512 MiB by default) against the mock (`evalsup mock`, 20 ms, 1 KB answers, outside the cgroup) with
``-c 512``, once per size given, with ~1 KB task lines. For each size it reports, from outside:

* requests/s (tasks over the wall time of the run, pre-scan included) and wall time;
* supervisor peak RSS (its kernel high-water mark, VmHWM, read until it exits) and total peak RSS (the sum over
  the tree, sampled every 200 ms), with the most workers seen;
* the cgroup's working set peak (usage less inactive file pages, sampled; active page cache counts), its anonymous
  memory peak (memory.stat total_rss: the processes' own) and its max_usage; OOM kills
  (memory.oom_control's oom_kill, and failcnt);
* exactly once: every id t0..tN-1 once in results.jsonl, nothing else (a bitmap, streamed);
* disk beside the results: the run directory less results.jsonl, plus the supervisor's unlinked temporary files
  (the id index), its peak (sampled) and at the end, as a share of the input's size.

With ``--trace DIR`` the supervisor runs under tracemalloc: every 2 s, when traced memory reaches a new high, its
top allocation sites (by line) are written to DIR/trace-N.txt, to compare two sizes (docs/benchmarks.md).

Needs root (it creates the cgroup under this process's own memory cgroup, removed afterwards).

    sudo scripts/bench_scale.py --sizes 10000 1000000
    scripts/bench_scale.py --sizes 100000 1000000 --trace /tmp/trace     # the N-dependent structures
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MB = 1 << 20

TRACER = r"""
import os, runpy, sys, threading, time, tracemalloc
out = os.environ["BENCH_TRACE"]
tracemalloc.start(1)
def watch():
    best = 0
    while True:
        time.sleep(2)
        cur = tracemalloc.get_traced_memory()[0]
        if cur > best * 1.02:
            best = cur
            snap = tracemalloc.take_snapshot()
            stats = snap.statistics("lineno")
            with open(out + ".tmp", "w") as f:
                f.write(f"traced {cur} bytes\n")
                for s in stats[:40]:
                    f.write(f"{s.size:>12} {s.count:>9} {s.traceback}\n")
            os.replace(out + ".tmp", out)
threading.Thread(target=watch, daemon=True).start()
sys.argv = ["evalsup"] + sys.argv[1:]
runpy.run_module("evalsup", run_name="__main__")
"""


def task_file(path: Path, n: int, kb: float) -> Path:
    """N ~kb-KB simple-form lines with ids t0..tN-1 (kept and reused while its size matches)."""
    if path.exists() and path.with_suffix(".ok").exists():
        return path
    pad = "x" * max(0, int(kb * 1024) - 80)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb", buffering=8 << 20) as f:
        for i in range(n):
            f.write(b'{"id":"t%d","messages":[{"role":"user","content":"q%d %s"}]}\n' % (i, i, pad.encode()))
    tmp.rename(path)
    path.with_suffix(".ok").write_text(str(n))
    return path


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cgroup:
    """A fresh v1 memory cgroup under this process's own, limited to ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        from evalsup.config.cgroup import own_v1_memory_cgroup

        parent = own_v1_memory_cgroup()
        self.parent = parent
        self.path = parent / f"evalsup-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def read(self, name: str) -> str:
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""

    def keyed(self, name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for line in self.read(name).splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
        return out

    def working_set(self) -> int:
        usage = int(self.read("memory.usage_in_bytes") or 0)
        return usage - self.keyed("memory.stat").get("total_inactive_file", 0)

    def remove(self) -> None:
        for _ in range(20):
            pids = [p for p in self.read("cgroup.procs").split() if p.isdigit()]
            for p in pids:
                with contextlib.suppress(OSError):
                    (self.parent / "cgroup.procs").write_text(p)
            with contextlib.suppress(OSError):
                self.path.rmdir()
                return
            time.sleep(0.2)


def exactly_once(results: Path, n: int) -> tuple[bool, int, int, int]:
    """(ok, records, duplicates, missing) over ids t0..tN-1."""
    seen = bytearray(n)
    recs = dups = other = 0
    with open(results, "rb") as f:
        for line in f:
            recs += 1
            cid = orjson.loads(line)["custom_id"]
            i = int(cid[1:]) if cid.startswith("t") and cid[1:].isdigit() else -1
            if not 0 <= i < n:
                other += 1
            elif seen[i]:
                dups += 1
            else:
                seen[i] = 1
    missing = n - sum(seen)
    return dups == 0 and missing == 0 and other == 0, recs, dups, missing


def dir_bytes(d: Path, skip: str) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for e in os.scandir(d):
            if e.name != skip and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    total += e.stat().st_blocks * 512
    return total


def unlinked_bytes(pid: int, beside: Path) -> int:
    """Disk held by the process's unlinked temporary files in ``beside`` (the pre-scan's id index, tasks.idindex;
    an O_TMPFILE file's link reads ``DIR/#INODE (deleted)``)."""
    total = 0
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in os.listdir(fds):
            with contextlib.suppress(OSError):
                target = os.readlink(fds / fd)
                if target.endswith(" (deleted)") and target.startswith(f"{beside}/"):
                    total += os.stat(fds / fd).st_blocks * 512
    return total


def vm_hwm(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_one(n: int, args: argparse.Namespace, work: Path, mock_url: str) -> dict[str, Any]:
    tasks = task_file(work / f"tasks-{n}-{args.kb:g}k.jsonl", n, args.kb)
    run_dir = work / f"run-{n}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cg = Cgroup(args.limit_mb * MB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [PY, "-m", "evalsup"]
    if args.trace:
        Path(args.trace).mkdir(parents=True, exist_ok=True)
        env["BENCH_TRACE"] = str(Path(args.trace) / f"trace-{n}.txt")
        cmd = [PY, "-c", TRACER]
    cmd += ["run", "--model", "mock-model", "--base-url", mock_url, "-c", str(args.concurrency), "--out",
            str(run_dir), "--no-check", "--log-interval", "30", *args.extra, str(tasks)]
    peak = {"sup_hwm": 0, "total": 0, "ws": 0, "anon": 0, "disk": 0, "workers": 0}
    done = threading.Event()
    t0 = time.monotonic()
    proc = subprocess.Popen(["sh", "-c", f'echo $$ > {cg.path}/cgroup.procs && exec "$@"', "sh", *cmd], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def sample() -> None:
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(proc.pid)
                kids = p.children(recursive=True)
                rss = p.memory_info().rss + sum(k.memory_info().rss for k in kids if k.is_running())
                peak["total"] = max(peak["total"], rss)
                peak["workers"] = max(peak["workers"], len(kids))
                peak["sup_hwm"] = max(peak["sup_hwm"], vm_hwm(proc.pid))
            peak["ws"] = max(peak["ws"], cg.working_set())
            peak["anon"] = max(peak["anon"], cg.keyed("memory.stat").get("total_rss", 0))
            peak["disk"] = max(peak["disk"], dir_bytes(run_dir, "results.jsonl")
                               + unlinked_bytes(proc.pid, run_dir.parent))
            done.wait(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    wall = time.monotonic() - t0
    done.set()
    th.join()
    oom = cg.keyed("memory.oom_control").get("oom_kill", 0)
    failcnt = int(cg.read("memory.failcnt") or 0)
    max_usage = int(cg.read("memory.max_usage_in_bytes") or 0)
    cg.remove()
    ok, recs, dups, missing = exactly_once(run_dir / "results.jsonl", n) if (run_dir / "results.jsonl").exists() \
        else (False, 0, 0, n)
    size = tasks.stat().st_size
    disk_end = dir_bytes(run_dir, "results.jsonl")
    row = {
        "tasks": n, "rc": proc.returncode, "wall_s": round(wall, 1), "req_s": round(n / wall),
        "sup_peak_rss_mb": round(peak["sup_hwm"] / 1e6, 1), "total_peak_rss_mb": round(peak["total"] / 1e6, 1),
        "workers": max(0, peak["workers"]), "ws_peak_mb": round(peak["ws"] / 1e6, 1),
        "anon_peak_mb": round(peak["anon"] / 1e6, 1),
        "cg_max_usage_mb": round(max_usage / 1e6, 1), "oom_kills": oom, "failcnt": failcnt,
        "exactly_once": ok, "records": recs, "duplicates": dups, "missing": missing,
        "input_mb": round(size / 1e6, 1), "disk_peak_mb": round(peak["disk"] / 1e6, 2),
        "disk_peak_pct": round(100 * peak["disk"] / size, 2), "disk_end_mb": round(disk_end / 1e6, 2),
    }
    if proc.returncode != 0:
        row["stderr"] = err.decode(errors="replace")[-800:]
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--kb", type=float, default=1.0, help="task line size in KB")
    ap.add_argument("--limit-mb", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--response-kb", type=float, default=1.0)
    ap.add_argument("--work", type=Path, default=None, help="where task files (kept) and run dirs go")
    ap.add_argument("--trace", default=None, help="directory for the supervisor's tracemalloc top sites")
    ap.add_argument("--timeout", type=float, default=4 * 3600)
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("extra", nargs="*", help="more evalsup run options (after --)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.gettempdir()) / "evalsup-bench-scale"
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mock = subprocess.Popen([PY, "-m", "evalsup", "mock", "--port", str(port), "--latency-ms", str(args.latency_ms),
                             "--response-kb", str(args.response_kb)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        url = f"http://127.0.0.1:{port}/v1"
        for _ in range(100):
            with contextlib.suppress(OSError):
                import urllib.request

                urllib.request.urlopen(url + "/models", timeout=1).read()
                break
            time.sleep(0.1)
        for n in args.sizes:
            row = run_one(n, args, work, url)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        mock.terminate()
        mock.wait()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print("| tasks | req/s | supervisor peak RSS | total peak RSS | working set peak | OOM kills | exactly once "
          "| disk beside results (peak) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['tasks']:,} | {r['req_s']:,} | {r['sup_peak_rss_mb']} MB | {r['total_peak_rss_mb']} MB "
              f"({r['workers']} workers) | {r['ws_peak_mb']} MB | {r['oom_kills']} | "
              f"{'yes' if r['exactly_once'] else 'NO'} | {r['disk_peak_mb']} MB ({r['disk_peak_pct']} %) |")


if __name__ == "__main__":
    main()
