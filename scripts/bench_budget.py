"""What a cap costs a run (issue 30): the supervisor's work per task with a budget (the task's figures, its
price, would_exceed, reserve, settle), measured in-process, and whole runs against the mock with and without
--max-cost, alternated in one invocation (ratios, not absolute times: the machine is shared).

    .venv/bin/python scripts/bench_budget.py --n 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from evalsup.config.caps import Caps
from evalsup.config.prices import load_prices
from evalsup.mock.server import MockConfig, MockThread
from evalsup.supervisor.budget import Budget, TaskCosts
from evalsup.tasks.requests import RequestDefaults


def per_task_us(lines: list[bytes]) -> float:
    """Microseconds of supervisor work a task costs with a cap (the line is parsed by the reader already): all it
    may cost (issue 40: with a judge, re-asks and a hedge's copy), the decision, the settling of its meta."""
    prices = load_prices(self_hosted=False)
    defaults = RequestDefaults(model="gpt-4o-mini", max_tokens=256)
    b = Budget(Caps(cost=1e12), judge_price=prices.lookup("gpt-4o-mini"))
    costs = TaskCosts(defaults, prices.lookup, hedge=True, max_reasks=2, run_schema=True, judge=True,
                      judge_price=prices.lookup("gpt-4o-mini"), judge_max_tokens=64)
    objs = [orjson.loads(x) for x in lines]
    t = time.perf_counter()
    for k, obj in enumerate(objs):
        b.afford(k, *costs.worst(obj))
        b.settle_result(k, {"pt": 20, "ct": 30, "rpt": 10, "rct": 5, "jpt": 40, "jct": 3})
    return (time.perf_counter() - t) / len(objs) * 1e6


def run_once(mock: MockThread, tasks: Path, out: Path, prices: Path, capped: bool) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "evalsup", "run", "--base-url", mock.url, "--model", "mock-model", "-w", "1",
           "-c", "64", "--max-tokens", "64", "-q", "--fresh", "--out", str(out), str(tasks)]
    if capped:
        cmd += ["--max-cost", "1000000", "--prices", str(prices)]
    subprocess.run(cmd, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - t, (after.ru_utime - before.ru_utime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    lines = [orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"Question {i}? " * 5}]})
             for i in range(a.n)]
    us = per_task_us(lines)
    with tempfile.TemporaryDirectory() as tmp, MockThread(MockConfig(latency_ms=2)) as mock:
        d = Path(tmp)
        tasks = d / "t.jsonl"
        tasks.write_bytes(b"\n".join(lines) + b"\n")
        prices = d / "p.json"
        prices.write_text(json.dumps({"mock-model": {"input": 1, "output": 1}}))
        res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(a.repeat):
            for capped in (False, True):
                res[capped].append(run_once(mock, tasks, d / "r", prices, capped))
    wall = {k: statistics.median(x[0] for x in v) for k, v in res.items()}
    cpu = {k: statistics.median(x[1] for x in v) for k, v in res.items()}
    print(json.dumps({"n": a.n, "per_task_us": round(us, 2), "wall_s": wall, "user_cpu_s": cpu,
                      "wall_ratio": round(wall[True] / wall[False], 3),
                      "cpu_ratio": round(cpu[True] / cpu[False], 3)}, default=str))


if __name__ == "__main__":
    main()
