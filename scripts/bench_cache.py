#!/usr/bin/env python3
"""Benchmark of the answer cache (issue 30 item 3) against the mock endpoint on 127.0.0.1.

N chat tasks, three runs in one invocation (each a fresh run directory, `evalsup run -q`):

* no cache;
* --cache DIR, empty (every request sent, every answer kept after its checkpoint): the cache's cost on a run;
* --cache DIR again (every answer from the cache, nothing sent): what a rerun costs.

Per run: wall time of `evalsup run` (start-up included), requests the mock saw, results/s, and the ratio to the
run without a cache. With ``--repeat R`` the sequence runs R times (the medians are printed).

    scripts/bench_cache.py                       # N=5000, 1 KiB answers, 2 workers, -c 64
    scripts/bench_cache.py --n 20000 --response-kb 8 --repeat 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalsup.mock.server import MockConfig, MockThread  # noqa: E402


def run(mock: MockThread, tasks: Path, out: Path, *extra: str) -> tuple[float, int]:
    before = int(mock.stats()["by_path"].get("/v1/chat/completions", 0))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "evalsup", "run", "--model", "mock-model", "--base-url", mock.url,
                        "-w", "2", "-c", "64", "-q", "--out", str(out), *extra, str(tasks)],
                       capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"run failed ({r.returncode}): {r.stderr[-2000:]}")
    return wall, int(mock.stats()["by_path"].get("/v1/chat/completions", 0)) - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--response-kb", type=float, default=1.0)
    ap.add_argument("--latency-ms", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    where = Path(tempfile.mkdtemp(prefix="evalsup-bench-cache-"))
    tasks = where / "tasks.jsonl"
    with open(tasks, "wb") as f:
        for i in range(a.n):
            f.write(orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + b"\n")
    times: dict[str, list[float]] = {"no cache": [], "cache, empty (all kept)": [], "cache, full (all hits)": []}
    sent: dict[str, int] = {}
    try:
        with MockThread(MockConfig(latency_ms=a.latency_ms, jitter_ms=a.latency_ms / 4,
                                   response_kb=a.response_kb)) as mock:
            for rep in range(a.repeat):
                cache = where / f"cache{rep}"
                for name, extra in zip(times, ((), ("--cache", str(cache)), ("--cache", str(cache))), strict=True):
                    wall, n = run(mock, tasks, where / f"run-{rep}-{len(times[name])}-{name[:8]}", *extra)
                    times[name].append(wall)
                    sent[name] = n
                size = sum(p.stat().st_size for p in cache.iterdir())
        base = statistics.median(times["no cache"])
        print(f"{a.n:,} tasks, {a.response_kb:g} KiB answers, mock latency {a.latency_ms:g} ms, -w 2 -c 64, "
              f"median of {a.repeat}; cache files {size / (1 << 20):.1f} MiB")
        print(f"{'run':28} {'wall s':>8} {'sent':>7} {'results/s':>10} {'vs no cache':>12}")
        for name, ts in times.items():
            w = statistics.median(ts)
            print(f"{name:28} {w:8.2f} {sent[name]:7,} {a.n / w:10,.0f} {w / base:11.2f}x")
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
