"""`evalsup status`: progress of a run directory from its checkpoint and results, read-only."""

from __future__ import annotations

import time
from pathlib import Path

import orjson

from evalsup.journal import JournalError, load_checkpoint


def _alive(pid: int) -> bool:
    """Is the supervisor that wrote the checkpoint still running (and still evalsup)?"""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"evalsup" in f.read()
    except OSError:
        return False


def status_text(run_dir: Path) -> str:
    try:
        cp = load_checkpoint(run_dir)
    except JournalError as e:
        return f"{run_dir}: {e}"
    results = run_dir / "results.jsonl"
    size = results.stat().st_size if results.exists() else 0
    lines = []
    if cp is None:
        done = 0
        if size:
            with open(results, "rb") as f:
                done = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        return f"{run_dir}: no checkpoint yet; {done:,} done in results.jsonl"
    # records written after the checkpoint: count complete lines past results_len (bounded by ~2 s of work)
    after = 0
    if size > cp.results_len:
        with open(results, "rb") as f:
            f.seek(cp.results_len)
            after = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    done = cp.succeeded + cp.failed + after
    age = time.time() - cp.time
    state = "finished" if cp.finished else ("running" if _alive(cp.pid) else "stopped (rerun to resume)")
    lines.append(f"{run_dir}: {state}")
    lines.append(f"  done        {done:,} ({cp.succeeded:,} ok, {cp.failed:,} failed as of the checkpoint)")
    lines.append(f"  outstanding {len(cp.outstanding):,}   input read to line {cp.line_no:,}")
    lines.append(f"  checkpoint  {age:,.1f}s ago")
    restarts = cp.counters.get("restarts", {})
    if any(restarts.values()):
        lines.append("  restarts    " + ", ".join(f"{k} {v}" for k, v in restarts.items()))
    summary = run_dir / "summary.json"
    if summary.exists() and cp.finished:
        s = orjson.loads(summary.read_bytes())
        lines.append(f"  rate        {s.get('requests_per_s')} req/s over {s.get('wall_s')}s")
    return "\n".join(lines)
