#!/usr/bin/env python3
"""Benchmark of --batch-api (issue 31): N tasks through the mock's Batch API, then the same tasks online; the
records compared by custom_id and body (less the answer's own id and time), and the wall times of both.

The mock answers every batch line through its own /v1 handler, so the batch path's time is the mock's work
plus polling, uploads and downloads; it says nothing of a real provider's queue (hours). Run on this machine
only against the mock, offline.

    scripts/bench_batch.py                 # the issue's figure: 20,000 tasks, chunks of 5,000
    scripts/bench_batch.py -n 2000 --chunk 500
"""

from __future__ import annotations

import argparse
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


def run(args: list[str]) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env |= {"PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "sk-bench"}
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "evalsup", *args], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr)
    return time.monotonic() - t, p.returncode


def records(run_dir: Path) -> dict[str, Any]:
    with open(run_dir / "results.jsonl", "rb") as f:
        return {r["custom_id"]: r for r in map(orjson.loads, f)}


def body(rec: dict[str, Any]) -> Any:
    b = dict(rec["response"]["body"])
    b.pop("id", None), b.pop("created", None)
    return b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20_000)
    ap.add_argument("--chunk", type=int, default=5_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, MockThread(MockConfig(seed=7, batch_step_ms=20)) as m:
        tasks = Path(d) / "t.jsonl"
        with open(tasks, "wb") as f:
            for i in range(a.n):
                f.write(orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + b"\n")
        common = ["run", "--model", "mock-model", "--base-url", m.url, "-q", str(tasks)]
        tb, rb = run([*common, "--out", f"{d}/b", "--batch-api", "--batch-max-requests", str(a.chunk),
                      "--batch-poll-interval", "0.1", "--batch-poll-max", "0.5"])
        to, ro = run([*common, "--out", f"{d}/o", "-c", "64"])
        b, o = records(Path(d) / "b"), records(Path(d) / "o")
        same = sum(1 for i in o if i in b and body(b[i]) == body(o[i]))
        lines = (Path(d) / "b" / "results.jsonl").read_bytes().count(b"\n")
        print(f"{a.n:,} tasks, chunks of {a.chunk:,}: batch {tb:.1f}s (exit {rb}, {lines:,} records), "
              f"online -c 64 {to:.1f}s (exit {ro}); batch/online {tb / to:.2f}; "
              f"records matching by custom_id and body: {same:,} of {len(o):,}")


if __name__ == "__main__":
    main()
