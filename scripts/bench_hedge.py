#!/usr/bin/env python3
"""Benchmark of tail hedging (issue 28, ``--hedge``): two replicas, one holding a small share of its requests
(a stuck slot), the same run with and without ``--hedge``, alternated, in one invocation.

Two mock endpoints (``--latency-ms`` each, jitter a fifth of it); the first holds ``--slow`` of its requests
for ``--slow-ms`` (exactly that share, evenly spaced). N simple tasks, ``-w 1 -c C``. Per run: wall time,
tasks/s, every task exactly once, the hedges sent and won (summary.json), and the requests the replicas saw
beyond one a task (the duplicates a hedge costs; the held requests are counted once, when they arrive).

    scripts/bench_hedge.py                   # 2,000 tasks, 100 ms replicas, 2 % held for 20 s on the first
    scripts/bench_hedge.py --n 500 --rounds 1
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalsup.mock.server import MockConfig, MockThread  # noqa: E402


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _requests(m: MockThread) -> int:
    return int(m.stats()["by_path"].get("/v1/chat/completions", 0))


def one_run(tmp: Path, name: str, n: int, args: argparse.Namespace, hedge: bool) -> dict[str, Any]:
    lat = args.latency_ms
    with MockThread(MockConfig(latency_ms=lat, jitter_ms=lat / 5, slow=args.slow, slow_ms=args.slow_ms,
                               seed=0)) as stuck, \
            MockThread(MockConfig(latency_ms=lat, jitter_ms=lat / 5, seed=1)) as fine:
        tasks = tmp / f"{name}.jsonl"
        tasks.write_bytes(b"".join(orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}]})
                                   + b"\n" for i in range(n)))
        cmd = [sys.executable, "-m", "evalsup", "run", "-q", "-w", "1", "-c", str(args.concurrency), "--model",
               "mock-model", "--base-url", stuck.url, "--base-url", fine.url, *(["--hedge"] if hedge else []),
               str(tasks)]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"run failed ({r.returncode}): {r.stderr[-2000:]}")
        run_dir = tmp / f"{name}.run"
        ids = collections.Counter(orjson.loads(x)["custom_id"] for x in (run_dir / "results.jsonl").read_bytes()
                                  .splitlines())
        s = orjson.loads((run_dir / "summary.json").read_bytes())
        return {"hedge": hedge, "wall_s": wall, "per_s": n / wall, "once": len(ids) == n and max(ids.values()) == 1,
                "hedges": s["hedges"], "extra_requests": _requests(stuck) + _requests(fine) - n,
                "held": stuck.stats()["faults"].get("slow", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--slow", type=float, default=0.02)
    ap.add_argument("--slow-ms", type=float, default=20_000.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.rounds):
            for hedge in (False, True):
                rows.append(one_run(Path(d), f"r{i}{'h' if hedge else ''}", args.n, args, hedge))
                print(rows[-1], flush=True)
    print(f"\n{args.n} tasks, -w 1 -c {args.concurrency}, two replicas at {args.latency_ms:g} ms, the first holding "
          f"{args.slow:.0%} of its requests for {args.slow_ms / 1000:g} s\n")
    print("| --hedge | wall s | tasks/s | held | hedges sent / won | requests beyond one a task | exactly once |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['hedge'] else 'off'} | {r['wall_s']:.1f} | {r['per_s']:.0f} | {r['held']} | "
              f"{r['hedges']['sent']} / {r['hedges']['won']} | {r['extra_requests']} | {r['once']} |")
    off = [r["wall_s"] for r in rows if not r["hedge"]]
    on = [r["wall_s"] for r in rows if r["hedge"]]
    print(f"\nwall with --hedge / without: {min(on) / min(off):.2f} (best of {args.rounds} each)")


if __name__ == "__main__":
    main()
