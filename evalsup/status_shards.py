"""`evalsup status` on the parent of shard run directories (`--shard`: TASKS.run/shard-K-of-N/).

One row a shard (state, done, failed, rate, age of its last checkpoint), a total, and the shards that are
missing (no directory yet) for every K in 0..N-1. Directories moved aside by --fresh (`shard-K-of-N.old-*`)
do not match the name and are ignored.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from evalsup.status import run_status

SHARD_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$")


def find_shards(parent: Path) -> dict[int, dict[int, Path]]:
    """{N: {K: directory}} of the shard directories in `parent`."""
    out: dict[int, dict[int, Path]] = {}
    try:
        entries = list(parent.iterdir())
    except OSError:
        return out
    for p in entries:
        m = SHARD_DIR.match(p.name)
        if m is not None and p.is_dir():
            k, n = int(m.group(1)), int(m.group(2))
            if 0 <= k < n:
                out.setdefault(n, {})[k] = p
    return out


def shards_status(parent: Path) -> dict[str, Any]:
    """{"parent", "groups": [{"shards": N, "rows": [...], "total": {...}, "missing": [...]}]}: one group per
    shard count found (normally one)."""
    groups = []
    for n, found in sorted(find_shards(parent).items()):
        rows = []
        for k in sorted(found):
            st = run_status(found[k]).as_dict()
            st["shard"] = f"shard-{k}-of-{n}"
            rows.append(st)
        running = [r for r in rows if r["state"] == "running"]
        total: dict[str, Any] = {
            "done": sum(r["done"] for r in rows), "ok": sum(r["ok"] for r in rows),
            "failed": sum(r["failed"] for r in rows), "invalid": sum(r["invalid"] for r in rows),
            "outstanding": sum(r["outstanding"] for r in rows),
            "rate": round(sum(r["rate"] or 0.0 for r in running), 2) if running else None,
            "finished": sum(r["state"] == "finished" for r in rows), "running": len(running),
        }
        known = [r["total"] for r in rows]
        if len(rows) == n and all(t is not None for t in known):
            total["total"] = sum(known)
            total["total_estimated"] = any(r["total_estimated"] for r in rows)
        groups.append({"shards": n, "rows": rows, "total": total,
                       "missing": [f"shard-{k}-of-{n}" for k in range(n) if k not in found]})
    return {"parent": str(parent), "groups": groups}


def format_shards(s: dict[str, Any]) -> str:
    lines = []
    for g in s["groups"]:
        n = g["shards"]
        t = g["total"]
        state = "finished" if t["finished"] == n else f"{t['finished']} of {n} shards finished, {t['running']} running"
        lines.append(f"{s['parent']}: {n} shards, {state}")
        lines.append(f"  {'shard':<16} {'state':<12} {'done':>10} {'failed':>8} {'req/s':>8} {'checkpoint':>11}  why")
        for r in g["rows"]:
            rate = "-" if r["rate"] is None else f"{r['rate']:,.1f}"
            age = "-" if r["checkpoint_age_s"] is None else f"{r['checkpoint_age_s']:,.0f}s ago"
            lines.append(f"  {r['shard']:<16} {r['state']:<12} {r['done']:>10,} {r['failed']:>8,} {rate:>8} "
                         f"{age:>11}  {r['why'] or ''}".rstrip())
        rate = "-" if t["rate"] is None else f"{t['rate']:,.1f}"
        tot = f" of {'~' if t.get('total_estimated') else ''}{t['total']:,}" if t.get("total") is not None else ""
        lines.append(f"  {'total':<16} {'':<12} {t['done']:>10,} {t['failed']:>8,} {rate:>8}"
                     f"   {t['ok']:,} ok, {t['invalid']:,} invalid, {t['outstanding']:,} outstanding{tot}")
        if g["missing"]:
            lines.append(f"  missing     {len(g['missing'])} of {n}: {', '.join(g['missing'])} (not started)")
    if len(s["groups"]) > 1:
        lines.append("  note: shard directories for more than one shard count N are here")
    return "\n".join(lines)
