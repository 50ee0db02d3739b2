#!/usr/bin/env python3
"""Benchmark of the adaptive concurrency limit (issue 21) against a REAL engine.

Hugging Face ``transformers serve --continuous-batching`` on 127.0.0.1, CPU, with the tiny local model of
``scripts/engine/build_tiny_model.py`` (built offline, nothing from a hub). The engine runs from its own venv
(``scripts/engine-venv`` builds it in ``.engine/``; or set ``EVALSUP_ENGINE_PYTHON`` / ``EVALSUP_ENGINE_MODEL``).
evalsup runs from this interpreter.

N chat tasks, each run:

* a fixed ``--concurrency`` sweep (1, 2, 4, 8, 16, 32, 64 by default);
* the default run (adaptive: no --concurrency).

Per run: throughput (succeeded tasks / wall time of ``evalsup run``, start-up included), its ratio to the best
fixed run, failed tasks and retried attempts, p50 / p99 of the server's latency (summary.json), the limit the
default run settled at (median of memory.jsonl's ``concurrency_limit`` while the run is busy, and its range), and
the CPU the server used per task (its process group's utime + stime, from /proc). With ``--repeat R`` the whole
sequence runs R times, in alternating order (forward, then backward) so that drift does not favour one end.

    scripts/bench_engine.py                             # N=1000, max_tokens 16
    scripts/bench_engine.py --n 500 --sweep 4,16,64 --repeat 2 --json out.json
    scripts/bench_engine.py --table a.json b.json       # one table of several benches' runs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("evalsup_engine_server", ROOT / "scripts" / "engine" / "server.py")
assert _spec is not None and _spec.loader is not None
engine = importlib.util.module_from_spec(_spec)  # scripts/engine/server.py
sys.modules[_spec.name] = engine
_spec.loader.exec_module(engine)

PY = sys.executable


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _cpu_s(pid: int) -> float:
    """utime + stime (s) of pid and its threads (the engine is one process; its children are counted too)."""
    total = 0.0
    tck = os.sysconf("SC_CLK_TCK")
    try:
        pids = [pid] + [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pids = [pid]
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / tck
        except (OSError, IndexError, ValueError):
            pass
    return total


def _limits(run_dir: Path, n: int) -> list[int]:
    out = []
    with open(run_dir / "memory.jsonl", "rb") as f:
        for line in f:
            r = json.loads(line)
            if r.get("concurrency_limit") is not None and int(r.get("done") or 0) < 0.9 * n:
                out.append(int(r["concurrency_limit"]))
    return out


def run_one(srv: engine.EngineServer, tasks: Path, n: int, work: Path, name: str, extra: list[str],
            max_tokens: int, stream: bool) -> dict[str, Any]:
    out = work / f"{name}.run"
    cmd = [PY, "-m", "evalsup", "run", str(tasks), "--base-url", srv.url, "--model", srv.model_id,
           "--max-tokens", str(max_tokens), "--out", str(out), "--fresh", "--quiet", "--monitor-interval", "0.5",
           *(["--stream"] if stream else []), *extra]
    assert srv.proc is not None
    cpu0 = _cpu_s(srv.proc.pid)
    load = os.getloadavg()[0]
    t0 = time.time()
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    wall = time.time() - t0
    cpu = _cpu_s(srv.proc.pid) - cpu0
    if p.returncode != 0:
        raise SystemExit(f"{name}: evalsup exited {p.returncode}: {p.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    failed = int(s.get("failed") or 0)
    lim = _limits(out, n)
    return {
        "name": name, "wall_s": round(wall, 2), "ok_per_s": round((n - failed) / wall, 1), "failed": failed,
        "errors": s.get("errors") or {}, "retries": int(s.get("retries") or 0),
        "latency_p50_s": s["latency_s"].get("p50"), "latency_p99_s": s["latency_s"].get("p99"),
        "completion_tokens": (s.get("tokens") or {}).get("completion"),
        "limit_median": statistics.median(lim) if lim else None, "limit_min": min(lim, default=None),
        "limit_max": max(lim, default=None), "server_cpu_s": round(cpu, 1),
        "server_cpu_ms_per_task": round(1000 * cpu / n, 2), "server_cpu_share": round(cpu / wall, 2),
        "load_before": round(load, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--sweep", default="1,2,4,8,16,32,64")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--stream", action="store_true", help="Run every evalsup run with --stream.")
    ap.add_argument("--server-flag", action="append", default=[],
                    help="Extra flag for transformers serve (repeatable), e.g. --server-flag=--cb-max-batch-tokens=256")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--log", type=Path, default=None, help="Write the server's output here.")
    ap.add_argument("--table", type=Path, nargs="+", default=None, metavar="JSON",
                    help="Print the table of earlier --json outputs (their runs pooled) and exit.")
    args = ap.parse_args()
    if args.table:
        loaded = [json.loads(p.read_text()) for p in args.table]  # one bench, or {"benches": [...]}
        table([b for x in loaded for b in x.get("benches", [x])])
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the server is stopped on the way out
    found = engine.find_engine()
    if isinstance(found, str):
        raise SystemExit(f"bench_engine: {found}")
    py, model = found
    work = Path(tempfile.mkdtemp(prefix="evalsup-bench-engine-"))
    tasks = work / "tasks.jsonl"
    with open(tasks, "w") as f:
        for i in range(args.n):
            q = f"Question {i}: what is {i} plus {i * 7 % 13}? Answer in one short sentence."
            f.write(json.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": q}]}) + "\n")
    plan = [(f"fixed-{c}", ["--concurrency", str(c)]) for c in (int(x) for x in args.sweep.split(",") if x)]
    plan.append(("default", []))
    rows: list[dict[str, Any]] = []
    log = open(args.log, "wb") if args.log else None  # noqa: SIM115
    t_all = time.monotonic()
    srv = engine.EngineServer(py, model, log=log, extra=tuple(args.server_flag))
    with srv:
        print(f"server up in {srv.startup_s:.1f} s, first generation (warm-up) {srv.warmup_s:.1f} s: "
              f"{' '.join(srv.cmd())}", flush=True)
        for rep in range(args.repeat):
            for name, extra in (plan if rep % 2 == 0 else plan[::-1]):
                rows.append(run_one(srv, tasks, args.n, work, name, extra, args.max_tokens, args.stream))
                rows[-1]["repeat"] = rep
                print(json.dumps(rows[-1]), flush=True)
    total_s = time.monotonic() - t_all
    stamp = json.loads((model / "evalsup_tiny_model.json").read_text())
    meta = {"args": {k: str(v) for k, v in vars(args).items()}, "server": srv.cmd(), "startup_s": srv.startup_s,
            "warmup_s": srv.warmup_s, "model": stamp, "total_s": total_s, "host": _host(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(meta, indent=2))
    if log:
        log.close()
    print()
    table([meta])


def _host() -> str:
    return f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}, load {os.getloadavg()[0]:.1f}"


def table(benches: list[dict[str, Any]]) -> None:
    """The markdown table of one or more benches (their runs pooled: medians over every repeat)."""
    rows = [dict(r, bench=i) for i, b in enumerate(benches) for r in b["rows"]]
    names = list(dict.fromkeys(r["name"] for r in rows))
    agg = {nm: [r for r in rows if r["name"] == nm] for nm in names}
    med = {nm: statistics.median(r["ok_per_s"] for r in rs) for nm, rs in agg.items()}
    best_name = max((nm for nm in names if nm.startswith("fixed")), key=lambda nm: med[nm])
    best = med[best_name]
    # paired: each repeat's default against that repeat's own best fixed run (the machine's load drifts)
    paired = []
    for key in sorted({(r["bench"], r["repeat"]) for r in rows}):
        rep = [r for r in rows if (r["bench"], r["repeat"]) == key]
        fixed = [r["ok_per_s"] for r in rep if r["name"].startswith("fixed")]
        paired += [r["ok_per_s"] / max(fixed) for r in rep if r["name"] == "default" and fixed]
    for b in benches:
        a = b["args"]
        print(f"{b.get('host', '?')}; model {b['model']['parameters']:,} parameters; {a['n']} tasks, max_tokens "
              f"{a['max_tokens']}{', streamed' if a.get('stream') == 'True' else ''}; {a['repeat']} repeat(s) in "
              f"{b['total_s']:.0f} s; server: {' '.join(b['server'][1:])}")
    print("\n| run | ok tasks/s: median (each run) | of best fixed | failed | retries | p50 / p99 latency s | "
          "limit: median (min-max) | server CPU ms/task (cores) |")
    print("|---|---|---|---|---|---|---|---|")
    for nm in names:
        rs = agg[nm]
        runs = " / ".join(f"{r['ok_per_s']:.0f}" for r in rs)
        lims = [r for r in rs if r.get("limit_median") is not None]
        lim = (f"{statistics.median(r['limit_median'] for r in lims):.0f} "
               f"({min(r['limit_min'] for r in lims)}-{max(r['limit_max'] for r in lims)})"
               if nm == "default" and lims else "fixed")
        print(f"| {nm}{' (best fixed)' if nm == best_name else ''} | {med[nm]:.0f} ({runs}) | {med[nm] / best:.2f} | "
              f"{sum(r['failed'] for r in rs)} | {sum(r['retries'] for r in rs)} | "
              f"{statistics.median(r['latency_p50_s'] for r in rs):.3f} / "
              f"{statistics.median(r['latency_p99_s'] for r in rs):.3f} | {lim} | "
              f"{statistics.median(r['server_cpu_ms_per_task'] for r in rs):.1f} "
              f"({statistics.median(r['server_cpu_share'] for r in rs):.2f}) |")
    if paired:
        print(f"\nthe default against the best fixed run of the same repeat: median {statistics.median(paired):.2f} "
              f"(each: {' / '.join(f'{x:.2f}' for x in paired)})")

if __name__ == "__main__":
    main()
