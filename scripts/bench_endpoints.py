#!/usr/bin/env python3
"""Benchmark of many endpoints (issue 21 item 1): three mock endpoints, one killed mid-run and restarted.

Three `evalsup mock --capacity K --latency-ms L` processes (each at most K / L tasks/s), N simple tasks, the
default `evalsup run` (adaptive) with the three as --base-url. Three runs:

* all three up (the baseline);
* endpoint 1 killed (SIGKILL: connections refused) ``--kill-at`` seconds into the run and started again on the
  same port ``--down-for`` seconds later;
* endpoint 1 answering every request 429 with Retry-After 1 s (an overloaded replica in the pool).

Per run: wall time, tasks/s, failed tasks, every task exactly once, results per endpoint, whether the run ever
paused (every endpoint down), and for the outage run when endpoint 1 was ejected and rejoined (events.jsonl)
and how many requests the restarted process served (its own counters: it starts from zero).

    scripts/bench_endpoints.py                    # the issue's figure: 6,000 tasks, killed 3 s in, back 10 s later
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _stats(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/_mock/stats", timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


class Mock:
    def __init__(self, port: int, args: argparse.Namespace) -> None:
        self.extra: list[str] = []  # more `evalsup mock` options (faults)
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.args = args
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        a = self.args
        self.p = subprocess.Popen([PY, "-m", "evalsup", "mock", "--port", str(self.port), "--latency-ms",
                                   str(a.latency_ms), "--jitter-ms", str(a.jitter_ms), "--capacity", str(a.capacity),
                                   "--queue", str(a.capacity), *self.extra], env=_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                _stats(self.base)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill(self) -> None:
        if self.p is not None and self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(10)


def run_one(mocks: list[Mock], tasks: Path, n: int, out: Path, outage: tuple[float, float] | None,
            name: str) -> dict[str, Any]:
    cmd = [PY, "-m", "evalsup", "run", str(tasks), "--model", "mock-model", "--out", str(out), "--fresh", "--quiet",
           *[a for m in mocks for a in ("--base-url", m.base + "/v1")]]
    t0 = time.time()
    timers = []
    if outage is not None:
        kill_at, down_for = outage
        timers = [threading.Timer(kill_at, mocks[1].kill), threading.Timer(kill_at + down_for, mocks[1].start)]
        for t in timers:
            t.start()
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    wall = time.time() - t0
    for t in timers:
        t.join()
    ids = collections.Counter()
    by_ep: collections.Counter[int] = collections.Counter()
    failed = 0
    with open(out / "results.jsonl", "rb") as f:
        for line in f:
            r = json.loads(line)
            ids[r["custom_id"]] += 1
            by_ep[r["metrics"]["endpoint"]["index"]] += 1
            failed += r["error"] is not None
    summary = json.loads((out / "summary.json").read_text())
    events = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines() if x]
    row: dict[str, Any] = {
        "name": name, "exit": p.returncode, "retries": summary.get("retries"), "wall_s": round(wall, 2),
        "tasks_per_s": round(n / wall, 1), "failed": failed, "exactly_once": len(ids) == n and max(ids.values()) == 1,
        "by_endpoint": [by_ep.get(i, 0) for i in range(len(mocks))], "paused": summary["breaker"]["opened"],
        "endpoints": summary["endpoints"],
    }
    if outage is not None:
        start = t0  # seconds from the launch of `evalsup run`, as the kill is timed
        for kind in ("endpoint_out", "endpoint_back"):
            t = next((e["t"] for e in events if e.get("event") == kind and e.get("endpoint") == 1), None)
            row[kind + "_at_s"] = round(t - start, 1) if t is not None else None
        row["served_after_restart"] = sum(int(v) for k, v in _stats(mocks[1].base)["statuses"].items()
                                          if k.startswith("2"))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--capacity", type=int, default=16)
    ap.add_argument("--latency-ms", type=float, default=200.0)
    ap.add_argument("--jitter-ms", type=float, default=20.0)
    ap.add_argument("--kill-at", type=float, default=3.0)
    ap.add_argument("--down-for", type=float, default=10.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalsup-bench-endpoints-"))
    tasks = work / "tasks.jsonl"
    with open(tasks, "w") as f:
        for i in range(args.n):
            f.write(json.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    mocks = [Mock(_free_port(), args) for _ in range(3)]
    rows = []
    try:
        for m in mocks:
            m.start()
        rows.append(run_one(mocks, tasks, args.n, work / "all-up.run", None, "all up"))
        print(json.dumps(rows[-1]), flush=True)
        mocks[1].kill()
        mocks[1].start()  # fresh counters
        rows.append(run_one(mocks, tasks, args.n, work / "one-killed.run", (args.kill_at, args.down_for),
                            "one killed"))
        print(json.dumps(rows[-1]), flush=True)
        mocks[1].kill()
        mocks[1].extra = ["--fail-429", "1.0", "--retry-after", "1"]
        mocks[1].start()
        rows.append(run_one(mocks, tasks, args.n, work / "one-429.run", None, "one answers only 429"))
        print(json.dumps(rows[-1]), flush=True)
    finally:
        for m in mocks:
            m.kill()
    print(f"\n3 mocks x (K={args.capacity}, {args.latency_ms:.0f} ms): at most "
          f"{3 * args.capacity / args.latency_ms * 1000:.0f} tasks/s; {args.n:,} tasks\n")
    print("| run | exit | tasks/s | failed | exactly once | results by endpoint | retries | run paused "
          "| endpoint 1 out / back at |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        when = (f"{r['endpoint_out_at_s']} s / {r['endpoint_back_at_s']} s, then {r['served_after_restart']} served"
                if "endpoint_out_at_s" in r else "-")
        print(f"| {r['name']} | {r['exit']} | {r['tasks_per_s']:.0f} | {r['failed']} | {r['exactly_once']} | "
              f"{' / '.join(f'{x:,}' for x in r['by_endpoint'])} | {r['retries']} | {r['paused']} | {when} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                        indent=2))


if __name__ == "__main__":
    main()
