#!/usr/bin/env python3
"""Benchmark of the adaptive concurrency limit (issue 21) against a server with a knee.

One `evalsup mock --capacity K --queue Q --latency-ms L` in its own process (K served at once, Q more wait, the
rest get 429 + Retry-After; throughput peaks at K / L). Against it, N tasks each with:

* a fixed --concurrency sweep (16, 32, 64, 128, 256 by default);
* the default (adaptive) run, with the server's /metrics (found at the server root) and without it
  (``--server-metrics off``: latency and errors alone);
* the default run while the capacity halves mid-run (``POST /_mock/config {"capacity": K/2}``).

Per run: throughput (tasks / wall time of `evalsup run`, start-up included), its ratio to the best fixed run,
the share of requests answered 429 (the mock's own counters), the settle time (from the start until the summed
limit in memory.jsonl stays within +-25 % of its median over the rest of the busy run) and, for the halving,
the time from the change until the limit has followed (stays within +-25 % of its new median).

A second scenario (``--mix-n``, issue 28): refusals that do not depend on the load. A mock with no capacity
limit that answers 30 % 429 (Retry-After 1 s), 10 % 500 and 20 % cut streams whatever is sent; streamed tasks;
a fixed sweep (``--mix-sweep``, 1, 4, 16, 64) against the default. With ``--mix-refusals fast`` (the default)
the 429s and 500s come back at once, before the latency (``evalsup mock --fast-refusals``), as llmock's and a
gateway's do: the case where the rule before issue 28 sat at limit 1. Per run: ok tasks/s, its ratio to the
best fixed, the median summed limit, the breaker's openings (summary.json). A run still going after
``--cap-s`` seconds is stopped (SIGTERM: resumable) and counted by what it finished by then.

A third (``--replica-n``, issue 28): a surviving replica. Two mocks, each ``--capacity K`` with a long queue
(``--replica-k``, no 429s: past K in flight the latency rises with the queue, a knee), one stopped
(terminated: its connections refused) ``--replica-stop-at`` seconds into the run. Per run: the survivor's
p50 / p90 latency over the records finished from 3 s after the stop until 90 % done, against its own p50 at
its knee (one mock alone at ``--concurrency K``), and the ratio.

A fourth (``--llmock-n``, issue 41): a server nobody here wrote. llmock (PyPI, ``--llmock`` names its executable,
installed into a venv of the benchmark's own, never evalsup's: ``python -m venv /tmp/llmock-venv &&
/tmp/llmock-venv/bin/pip install llmock==0.2.2``) started with the issue's fault mix (``--llmock-args``: 30 % 429
with ``retry-after: 1``, 10 % 500, streams cut, truncated or malformed 10 / 5 / 5 %); streamed tasks with
``--max-tokens 32``; a fixed sweep (``--llmock-sweep``, 1, 4, 16, 64) against the default. Per run: ok tasks/s,
its ratio to the best fixed, the limit (median), the seconds spent at a limit under 4.

A fifth (``--recovery-n``, issue 41): a slow spell. The capacity model (K, Q, latency as the first scenario)
whose latency rises ``--spell-factor`` (5) x at ``--spell-at`` s for ``--spell-s`` (12) s and then returns
(``POST /_mock/config {"latency_ms": ...}``). Per run: the rate before the spell (results a second, from
memory.jsonl's ``done`` every 0.5 s), and the seconds from the spell's end until the rate over 1 s is back at
0.8 x that (the target: within 5 s); the default with and without the server's metrics.

``--before DIR``: also run each default from another checkout (the code before a change), in the same
invocation, so that the ratios compare on one machine's load.

    scripts/bench_adaptive.py                      # the issue's figures: K=64, Q=64, 200 ms, 10,000 tasks
    scripts/bench_adaptive.py --n 3000 --sweep 32,64,128 --json out.json
    scripts/bench_adaptive.py --n 0 --halve-at 0 --mix-n 500 --before /work/before   # the mix alone
    scripts/bench_adaptive.py --n 3000 --sweep 64,128 --mix-n 500 --replica-n 6000    # issue 28's three
    scripts/bench_adaptive.py --n 0 --halve-at 0 --llmock /tmp/llmock-venv/bin/llmock --llmock-n 500 \
        --recovery-n 8000                                                            # issue 41's two
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
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


def _admin(base: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _env(code: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(code)
    return env


def _start_mock(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    mock = subprocess.Popen([PY, "-m", "evalsup", "mock", "--port", str(port), *args], env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            _admin(base, "/_mock/stats")
            return mock, base
        except OSError:
            if time.monotonic() > deadline:
                mock.terminate()
                raise
            time.sleep(0.2)


def _limits(run_dir: Path) -> list[tuple[float, int, int]]:
    """(t, summed limit, done) from memory.jsonl."""
    out = []
    with open(run_dir / "memory.jsonl", "rb") as f:
        for line in f:
            r = json.loads(line)
            if r.get("concurrency_limit") is not None:
                out.append((float(r["t"]), int(r["concurrency_limit"]), int(r.get("done") or 0)))
    return out


def settle_time(samples: list[tuple[float, int, int]], t0: float, n: int) -> float | None:
    """Seconds from t0 until the limit stays within +-25 % of its median over the rest of the busy run (until
    90 % of the tasks are done: the tail is application-limited)."""
    busy = [(t, lim) for t, lim, done in samples if t >= t0 and done < 0.9 * n]
    if len(busy) < 4:
        return None
    for i, (t, _) in enumerate(busy):
        rest = [lim for _, lim in busy[i:]]
        med = statistics.median(rest)
        if all(0.75 * med <= x <= 1.25 * med for x in rest):
            return round(t - t0, 1)
    return None


def _evalsup(cmd: list[str], code: Path, cap_s: float | None) -> tuple[int, str, bool]:
    """Run ``evalsup run``; stopped (SIGTERM: it stops resumably) after ``cap_s`` seconds. (exit code, stderr,
    whether it was stopped)."""
    # (in that tree: `python -m` puts the working directory first on sys.path, before PYTHONPATH, so a run
    # started from another checkout would import that one's evalsup)
    p = subprocess.Popen(cmd, env=_env(code), cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    try:
        _, err = p.communicate(timeout=cap_s)
        return p.returncode, err, False
    except subprocess.TimeoutExpired:
        p.terminate()
        _, err = p.communicate(timeout=60)
        return p.returncode, err, True


def _records(run_dir: Path) -> list[dict[str, Any]]:
    with open(run_dir / "results.jsonl", "rb") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_one(base: str, tasks: Path, n: int, work: Path, name: str, extra: list[str],
            halve_at: float | None = None, capacity: int = 64, code: Path = ROOT,
            cap_s: float | None = None) -> dict[str, Any]:
    _admin(base, "/_mock/config", {"capacity": capacity})
    _admin(base, "/_mock/reset", {})
    out = work / f"{name}.run"
    cmd = [PY, "-m", "evalsup", "run", str(tasks), "--base-url", base + "/v1", "--model", "mock-model",
           "--out", str(out), "--fresh", "--quiet", "--monitor-interval", "0.5", *extra]
    t0 = time.time()
    timer = None
    if halve_at is not None:
        timer = threading.Timer(halve_at, lambda: _admin(base, "/_mock/config", {"capacity": capacity // 2}))
        timer.start()
    rc, err, stopped = _evalsup(cmd, code, cap_s)
    wall = time.time() - t0
    if timer is not None:
        timer.cancel()
    if rc != 0 and not stopped:
        raise SystemExit(f"{name}: evalsup exited {rc}: {err[-2000:]}")
    st = _admin(base, "/_mock/stats")
    summary = json.loads((out / "summary.json").read_text())
    served = sum(int(v) for v in st["statuses"].values())
    n429 = int(st["statuses"].get("429", 0))
    samples = _limits(out)
    done = int(summary.get("succeeded") or 0) + int(summary.get("failed") or 0) if stopped else n
    row: dict[str, Any] = {
        "name": name, "wall_s": round(wall, 2), "tasks_per_s": round(done / wall, 1),
        "stopped_at_cap": stopped, "done": done,
        # succeeded tasks: a run whose tasks fail fast (5 attempts of 429) must not look faster for it
        "ok_per_s": round((done - int(summary.get("failed") or 0)) / wall, 1), "requests": served,
        "share_429": round(n429 / served, 4) if served else 0.0, "failed": summary.get("failed"),
        "latency_p50_s": summary["latency_s"].get("p50"), "latency_p99_s": summary["latency_s"].get("p99"),
        "limit_median": statistics.median([lim for _, lim, d in samples if d < 0.9 * n] or [0]),
        "settle_s": settle_time(samples, t0, n),
        "breaker_opened": (summary.get("breaker") or {}).get("opened"),
    }
    if halve_at is not None:
        tc = t0 + halve_at
        after = [(t, lim, d) for t, lim, d in samples if t >= tc]
        row["follow_s"] = settle_time(after, tc, n)
        row["limit_before"] = statistics.median([lim for t, lim, _ in samples if tc - 5 <= t < tc] or [0])
        row["limit_after"] = statistics.median([lim for _, lim, d in after if d < 0.9 * n] or [0])
    return row


def _table(rows: list[dict[str, Any]], halve_at: float) -> None:
    best = max((r["ok_per_s"] for r in rows if r["name"].startswith("fixed")), default=0.0)
    print("| run | ok tasks/s | of best fixed | 429 share | failed | breaker opened | limit (median) | settle s | "
          "p50 / p99 s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["ok_per_s"] / best if best else 0.0
        extra = (f" (halved at {halve_at:.0f} s: {r['limit_before']:.0f} -> {r['limit_after']:.0f}, "
                 f"followed in {r['follow_s']} s)" if "follow_s" in r else "")
        print(f"| {r['name']} | {r['ok_per_s']:.1f} | {ratio:.2f} | {r['share_429']:.2%} | {r['failed']} | "
              f"{r['breaker_opened']} | {r['limit_median']:.0f}{extra} | {r['settle_s']} | "
              f"{r['latency_p50_s']} / {r['latency_p99_s']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000, help="Tasks of the capacity scenario (0: skip it).")
    ap.add_argument("--capacity", type=int, default=64)
    ap.add_argument("--queue", type=int, default=64)
    ap.add_argument("--latency-ms", type=float, default=200.0)
    ap.add_argument("--jitter-ms", type=float, default=20.0)
    ap.add_argument("--sweep", default="16,32,64,128,256")
    ap.add_argument("--halve-at", type=float, default=10.0, help="Seconds into the halving run (0: no such run).")
    ap.add_argument("--mix-n", type=int, default=0, help="Tasks of the load-independent mix scenario (0: skip).")
    ap.add_argument("--mix-sweep", default="1,4,16,64")
    ap.add_argument("--mix", default="0.3,0.1,0.2", help="The mix's 429, 500 and cut-stream shares.")
    ap.add_argument("--mix-refusals", choices=("fast", "slow"), default="fast",
                    help="fast: the mix's 429s and 500s come back at once (llmock's way); slow: after the latency.")
    ap.add_argument("--mix-latency-ms", type=float, default=50.0)
    ap.add_argument("--cap-s", type=float, default=90.0, help="A mix run still going after this is stopped.")
    ap.add_argument("--replica-n", type=int, default=0, help="Tasks of the surviving-replica scenario (0: skip).")
    ap.add_argument("--replica-k", type=int, default=32, help="Each replica's capacity (its knee).")
    ap.add_argument("--replica-latency-ms", type=float, default=100.0)
    ap.add_argument("--replica-stop-at", type=float, default=4.0)
    ap.add_argument("--llmock", type=Path, default=None, help="llmock's executable (in a venv of its own).")
    ap.add_argument("--llmock-n", type=int, default=0, help="Tasks of the llmock scenario (0: skip it).")
    ap.add_argument("--llmock-sweep", default="1,4,16,64")
    ap.add_argument("--llmock-args", default="--error-rate 429=0.3 --error-rate 500=0.1 --stream-fault "
                    "disconnect=0.1 --stream-fault truncate=0.05 --stream-fault malformed=0.05")
    ap.add_argument("--recovery-n", type=int, default=0, help="Tasks of the slow-spell scenario (0: skip it).")
    ap.add_argument("--spell-at", type=float, default=8.0)
    ap.add_argument("--spell-s", type=float, default=12.0)
    ap.add_argument("--spell-factor", type=float, default=5.0)
    ap.add_argument("--before", type=Path, default=None, help="Also run each default from this checkout.")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evalsup-bench-adaptive-"))
    defaults: list[tuple[str, Path]] = [("default", ROOT)]
    if args.before is not None:
        defaults.append(("default (before)", args.before.resolve()))
    rows: list[dict[str, Any]] = []
    mix_rows: list[dict[str, Any]] = []
    if args.n > 0:
        tasks = work / "tasks.jsonl"
        with open(tasks, "w") as f:
            for i in range(args.n):
                f.write(json.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
        mock, base = _start_mock(["--latency-ms", str(args.latency_ms), "--jitter-ms", str(args.jitter_ms),
                                  "--capacity", str(args.capacity), "--queue", str(args.queue)])
        try:
            for c in [int(x) for x in args.sweep.split(",") if x]:
                rows.append(run_one(base, tasks, args.n, work, f"fixed-{c}", ["--concurrency", str(c)],
                                    capacity=args.capacity))
                print(json.dumps(rows[-1]), flush=True)
            for dname, code in defaults:
                for name, extra in ((dname, []), (f"{dname}, no server metrics", ["--server-metrics", "off"])):
                    rows.append(run_one(base, tasks, args.n, work, _slug(name), extra, capacity=args.capacity,
                                        code=code))
                    rows[-1]["name"] = name
                    print(json.dumps(rows[-1]), flush=True)
                if args.halve_at > 0:
                    for name, extra in ((f"{dname}, capacity halved", []),
                                        (f"{dname}, no server metrics, capacity halved", ["--server-metrics", "off"])):
                        rows.append(run_one(base, tasks, args.n, work, _slug(name), extra, halve_at=args.halve_at,
                                            capacity=args.capacity, code=code))
                        rows[-1]["name"] = name
                        print(json.dumps(rows[-1]), flush=True)
        finally:
            mock.terminate()
            mock.wait(10)
    if args.mix_n > 0:
        p429, p500, pcut = (float(x) for x in args.mix.split(","))
        tasks = work / "mix.jsonl"
        with open(tasks, "w") as f:
            for i in range(args.mix_n):
                f.write(json.dumps({"id": f"m{i}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
        fast = ["--fast-refusals"] if args.mix_refusals == "fast" else []
        mock, base = _start_mock(["--latency-ms", str(args.mix_latency_ms), "--jitter-ms",
                                  str(args.mix_latency_ms / 10), "--fail-429", str(p429), "--fail-500", str(p500),
                                  "--cut-stream", str(pcut), "--retry-after", "1", *fast])
        try:
            runs = [(f"fixed-{c}", ["--concurrency", c], ROOT) for c in args.mix_sweep.split(",") if c]
            runs += [(dname, [], code) for dname, code in defaults]
            for name, extra, code in runs:
                mix_rows.append(run_one(base, tasks, args.mix_n, work, "mix_" + _slug(name), ["--stream", *extra],
                                        capacity=0, code=code, cap_s=args.cap_s))
                mix_rows[-1]["name"] = name
                print(json.dumps(mix_rows[-1]), flush=True)
        finally:
            mock.terminate()
            mock.wait(10)
    replica_rows: list[dict[str, Any]] = []
    if args.replica_n > 0:
        replica_rows = replicas(args, work, defaults)
    llmock_rows = llmock(args, work, defaults) if args.llmock_n > 0 and args.llmock is not None else []
    recovery_rows = recovery(args, work, defaults) if args.recovery_n > 0 else []
    if rows:
        print(f"\nK={args.capacity} Q={args.queue} {args.latency_ms:.0f} ms (+-{args.jitter_ms:.0f}), "
              f"{args.n:,} tasks; ideal {args.capacity / args.latency_ms * 1000:.0f} tasks/s\n")
        _table(rows, args.halve_at)
    if mix_rows:
        print(f"\nLoad-independent mix: {args.mix} (429 with Retry-After 1 s, 500, cut stream; refusals "
              f"{args.mix_refusals}), no capacity limit, {args.mix_latency_ms:.0f} ms, {args.mix_n:,} streamed "
              f"tasks; runs past {args.cap_s:.0f} s stopped\n")
        _table(mix_rows, 0)
    if replica_rows:
        print(f"\nSurviving replica: two mocks K={args.replica_k} (a long queue, no 429), "
              f"{args.replica_latency_ms:.0f} ms, {args.replica_n:,} tasks, one stopped at {args.replica_stop_at} s\n")
        knee = replica_rows[0]["p50_s"]
        print("| run | survivor p50 / p90 s | of its p50 at its knee | limit on it (median after) | tasks/s | failed |")
        print("|---|---|---|---|---|---|")
        for r in replica_rows:
            print(f"| {r['name']} | {r['p50_s']} / {r['p90_s']} | {r['p50_s'] / knee:.2f} "
                  f"| {r.get('limit_after', '-')} "
                  f"| {r['tasks_per_s']} | {r['failed']} |")
    if llmock_rows:
        print(f"\nllmock 0.2.2 ({args.llmock_args}), {args.llmock_n:,} streamed tasks, --max-tokens 32\n")
        best = max((r["ok_per_s"] for r in llmock_rows if r["name"].startswith("fixed")), default=0.0)
        t98 = min((r["t98_s"] for r in llmock_rows if r["name"].startswith("fixed") and r["t98_s"]), default=0.0)
        print("| run | wall s | ok tasks/s | of best fixed | s to 98 % | of best fixed | failed | limit (median) | "
              "s at a limit under 4 |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in llmock_rows:
            r98 = f"{t98 / r['t98_s']:.2f}" if r["t98_s"] and t98 else "-"
            print(f"| {r['name']} | {r['wall_s']} | {r['ok_per_s']} | {r['ok_per_s'] / best if best else 0:.2f} | "
                  f"{r['t98_s']} | {r98} | {r['failed']} | {r['limit_median']} | {r['low_s']} |")
    if recovery_rows:
        print(f"\nSlow spell: K={args.capacity} Q={args.queue} {args.latency_ms:.0f} ms, "
              f"latency x{args.spell_factor:g} "
              f"from {args.spell_at:g} s for {args.spell_s:g} s, {args.recovery_n:,} tasks\n")
        print("| run | rate before | rate in the spell | back at 0.8x within s | limit before / in / 5 s after | "
              "tasks/s | failed |")
        print("|---|---|---|---|---|---|---|")
        for r in recovery_rows:
            print(f"| {r['name']} | {r['rate_before']} | {r['rate_spell']} | {r['back_s']} | {r['limit_before']} / "
                  f"{r['limit_spell']} / {r['limit_after5']} | {r['ok_per_s']} | {r['failed']} |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                         "mix_rows": mix_rows, "replica_rows": replica_rows,
                                         "llmock_rows": llmock_rows, "recovery_rows": recovery_rows}, indent=2))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else 0.0


def replicas(args: argparse.Namespace, work: Path, defaults: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """The surviving-replica scenario: the knee's p50 (one mock alone at --concurrency K), then each default
    against two, one of them stopped mid-run."""
    n, k = args.replica_n, args.replica_k
    tasks = work / "replica.jsonl"
    with open(tasks, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    knob = ["--latency-ms", str(args.replica_latency_ms), "--jitter-ms", str(args.replica_latency_ms / 10),
            "--capacity", str(k), "--queue", "100000"]
    rows: list[dict[str, Any]] = []
    mock, base = _start_mock(knob)
    try:
        out = work / "replica_knee.run"
        rc, err, _ = _evalsup([PY, "-m", "evalsup", "run", str(tasks), "--base-url", base + "/v1", "--model",
                               "mock-model", "--out", str(out), "--fresh", "--quiet", "--concurrency", str(k)],
                              ROOT, None)
        if rc != 0:
            raise SystemExit(f"replica knee: evalsup exited {rc}: {err[-2000:]}")
        lat = [r["metrics"]["latency_s"] for r in _records(out)[: int(0.9 * n)] if r["error"] is None]
        rows.append({"name": f"one replica alone, --concurrency {k} (its knee)", "p50_s": _pct(lat, 0.5),
                     "p90_s": _pct(lat, 0.9), "tasks_per_s": None, "failed": 0})
    finally:
        mock.terminate()
        mock.wait(10)
    for dname, code in defaults:
        for name, extra in ((dname, []), (f"{dname}, --server-metrics off", ["--server-metrics", "off"])):
            a, base_a = _start_mock(knob)
            b, base_b = _start_mock(knob)
            out = work / f"replica_{_slug(name)}.run"
            cmd = [PY, "-m", "evalsup", "run", str(tasks), "--base-url", base_a + "/v1", "--base-url",
                   base_b + "/v1", "--model", "mock-model", "--out", str(out), "--fresh", "--quiet",
                   "--monitor-interval", "0.5", *extra]
            marks: dict[str, int] = {}

            def stop(b: subprocess.Popen[bytes] = b, out: Path = out, marks: dict[str, int] = marks) -> None:
                b.terminate()
                b.wait(10)
                marks["stop"] = _count_lines(out / "results.jsonl")

            def settled(out: Path = out, marks: dict[str, int] = marks) -> None:
                marks["settled"] = _count_lines(out / "results.jsonl")

            timers = [threading.Timer(args.replica_stop_at, stop),
                      threading.Timer(args.replica_stop_at + 3, settled)]
            t0 = time.time()
            for t in timers:
                t.start()
            try:
                rc, err, _ = _evalsup(cmd, code, None)
            finally:
                for t in timers:
                    t.cancel()
                for m in (a, b):
                    if m.poll() is None:
                        m.terminate()
                        m.wait(10)
            wall = time.time() - t0
            if rc != 0:
                raise SystemExit(f"{name}: evalsup exited {rc}: {err[-2000:]}")
            recs = _records(out)
            after = [r["metrics"]["latency_s"] for r in recs[marks.get("settled", len(recs)): int(0.9 * n)]
                     if r["error"] is None and r["metrics"]["endpoint"]["index"] == 0]
            summary = json.loads((out / "summary.json").read_text())
            lims = [lim for t, lim, d in _limits(out) if t >= t0 + args.replica_stop_at + 3 and d < 0.9 * n]
            rows.append({"name": name, "p50_s": _pct(after, 0.5), "p90_s": _pct(after, 0.9),
                         "tasks_per_s": round(n / wall, 1), "failed": summary.get("failed"),
                         "limit_after": statistics.median(lims) if lims else None, "measured": len(after),
                         "stopped_after": marks.get("stop")})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _write_tasks(path: Path, n: int, prefix: str) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            line = {"id": f"{prefix}{i}", "messages": [{"role": "user", "content": f"question {i}"}]}
            f.write(json.dumps(line) + "\n")
    return path


def _samples(run_dir: Path) -> list[tuple[float, int, int]]:
    """(t, summed limit, done) of every memory.jsonl sample."""
    out = []
    with open(run_dir / "memory.jsonl", "rb") as f:
        for line in f:
            r = json.loads(line)
            out.append((float(r["t"]), int(r.get("concurrency_limit") or 0), int(r.get("done") or 0)))
    return out


def _rate(smp: list[tuple[float, int, int]], a: float, b: float) -> float:
    """Results a second between ``a`` and ``b`` (memory.jsonl's ``done``)."""
    inside = [(t, d) for t, _, d in smp if a <= t <= b]
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else 0.0


def _lim(smp: list[tuple[float, int, int]], a: float, b: float) -> float | None:
    """The summed limit's median between ``a`` and ``b``."""
    xs = [x for t, x, _ in smp if a <= t < b and x]
    return statistics.median(xs) if xs else None


def llmock(args: argparse.Namespace, work: Path, defaults: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """llmock with a load-independent fault mix: the fixed sweep and each default, one llmock process."""
    tasks = _write_tasks(work / "llmock.jsonl", args.llmock_n, "l")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    srv = subprocess.Popen([str(args.llmock), "serve", "--host", "127.0.0.1", "--port", str(port), "--log-level",
                            "warning", *args.llmock_args.split()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/v1/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        runs = [(f"fixed-{c}", ["--concurrency", c], ROOT) for c in args.llmock_sweep.split(",") if c]
        runs += [(dname, [], code) for dname, code in defaults]
        for name, extra, code in runs:
            out = work / f"llmock_{_slug(name)}.run"
            cmd = [PY, "-m", "evalsup", "run", str(tasks), "--base-url", base + "/v1", "--model", "gpt-4o-mini",
                   "--out", str(out), "--fresh", "--quiet", "--monitor-interval", "0.5", "--stream",
                   "--max-tokens", "32", *extra]
            t0 = time.time()
            rc, err, stopped = _evalsup(cmd, code, args.cap_s)
            wall = time.time() - t0
            if rc != 0 and not stopped:
                raise SystemExit(f"llmock {name}: evalsup exited {rc}: {err[-2000:]}")
            summary = json.loads((out / "summary.json").read_text())
            ok, failed = int(summary.get("succeeded") or 0), int(summary.get("failed") or 0)
            samples = _samples(out)
            busy = [lim for _, lim, d in samples if lim and d < 0.9 * args.llmock_n]
            low = sum(1 for _, lim, d in samples if 0 < lim < 4 and d < 0.9 * args.llmock_n) * 0.5
            # the last few tasks' retries (8 attempts, back-offs doubling to 32 s) are a lottery that no setting
            # changes: the time to 98 % done beside the wall time
            t98 = next((round(t - t0, 1) for t, _, d in samples if d >= 0.98 * args.llmock_n), None)
            rows.append({"name": name, "wall_s": round(wall, 1), "ok_per_s": round(ok / wall, 1), "failed": failed,
                         "stopped_at_cap": stopped, "limit_median": statistics.median(busy) if busy else None,
                         "low_s": low, "t98_s": t98})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        srv.terminate()
        srv.wait(10)
    return rows


def recovery(args: argparse.Namespace, work: Path, defaults: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """The capacity model slowed ``--spell-factor`` x for ``--spell-s`` s: how soon the rate is back after it."""
    n = args.recovery_n
    tasks = _write_tasks(work / "recovery.jsonl", n, "s")
    rows: list[dict[str, Any]] = []
    mock, base = _start_mock(["--latency-ms", str(args.latency_ms), "--jitter-ms", str(args.jitter_ms),
                              "--capacity", str(args.capacity), "--queue", str(args.queue)])
    slow = args.latency_ms * args.spell_factor
    try:
        runs = [(dname, [], code) for dname, code in defaults]
        runs += [(f"{dname}, --server-metrics off", ["--server-metrics", "off"], code) for dname, code in defaults]
        for name, extra, code in runs:
            _admin(base, "/_mock/config", {"latency_ms": args.latency_ms})
            _admin(base, "/_mock/reset", {})
            out = work / f"recovery_{_slug(name)}.run"
            cmd = [PY, "-m", "evalsup", "run", str(tasks), "--base-url", base + "/v1", "--model", "mock-model",
                   "--out", str(out), "--fresh", "--quiet", "--monitor-interval", "0.5", *extra]
            marks: dict[str, float] = {}

            def slow_down(marks: dict[str, float] = marks) -> None:
                _admin(base, "/_mock/config", {"latency_ms": slow})
                marks["from"] = time.time()

            def speed_up(marks: dict[str, float] = marks) -> None:
                _admin(base, "/_mock/config", {"latency_ms": args.latency_ms})
                marks["until"] = time.time()

            timers = [threading.Timer(args.spell_at, slow_down),
                      threading.Timer(args.spell_at + args.spell_s, speed_up)]
            t0 = time.time()
            for t in timers:
                t.start()
            try:
                rc, err, _ = _evalsup(cmd, code, None)
            finally:
                for t in timers:
                    t.cancel()
            wall = time.time() - t0
            if rc != 0:
                raise SystemExit(f"recovery {name}: evalsup exited {rc}: {err[-2000:]}")
            summary = json.loads((out / "summary.json").read_text())
            smp = _samples(out)
            t_from = marks.get("from", t0 + args.spell_at)
            t_until = marks.get("until", t0 + args.spell_at + args.spell_s)
            before = _rate(smp, t_from - 5, t_from)
            back = None
            for t, _, d in smp:
                if t >= t_until and d < 0.95 * n and _rate(smp, t - 1.0, t) >= 0.8 * before:
                    back = round(t - t_until, 1)
                    break
            rows.append({"name": name, "rate_before": round(before, 1),
                         "rate_spell": round(_rate(smp, t_from, t_until), 1), "back_s": back,
                         "limit_before": _lim(smp, t_from - 5, t_from), "limit_spell": _lim(smp, t_from, t_until),
                         "limit_after5": _lim(smp, t_until + 5, t_until + 8), "ok_per_s": round(n / wall, 1),
                         "failed": summary.get("failed")})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        mock.terminate()
        mock.wait(10)
    return rows


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _slug(name: str) -> str:
    return name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")


if __name__ == "__main__":
    main()
