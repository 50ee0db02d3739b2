"""Turn `scripts/bench --json` files into the tables and SVG charts of docs/benchmarks.md.

    .venv/bin/python scripts/bench_report.py a.json b.json ... --out docs/
prints a markdown table per file and writes docs/bench-rss-vs-n.svg and docs/bench-throughput-vs-inflight.svg.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

COLORS = {"naive_gather": "#d62728", "bounded_queue": "#1f77b4", "bounded_queue_raw": "#17becf",
          "evalsup-1w": "#98df8a", "evalsup-2w": "#2ca02c", "evalsup-4w": "#006400", "evalsup-auto": "#9467bd"}


def user_cpu(doc: dict[str, Any], contender: str) -> float | None:
    """The median user CPU of a contender's runs (system time swings on a VM; user time does not)."""
    vals = [r["cpu_user_s"] for r in doc.get("runs", []) if r["contender"] == contender and r.get("cpu_user_s")]
    return statistics.median(vals) if vals else None


def table(doc: dict[str, Any]) -> str:
    c = doc["config"]
    ref = next((s for s in doc["summary"] if s["contender"] == "bounded_queue_raw"), None)
    ref_user = user_cpu(doc, "bounded_queue_raw")
    head = (f"**n={c['n']:,}, {c['kb']:g} KB responses, latency {c['latency_ms']:g} ms ±{c['jitter_pct']:g}%, "
            f"{c['inflight']} in flight** (Little's-law ideal {c['ideal_rps']:,.0f} req/s, {c['repeat']} run(s), "
            "medians; ratios against the raw-bytes bounded queue)\n\n")
    cols = ["contender", "wall s", "to disk s", "req/s", "of ideal", "CPU s (tree)", "supervisor/workers CPU s",
            "peak RSS tree MB", "largest process MB", "exactly once", "x CPU", "x user CPU", "x RSS"]
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in doc["summary"]:
        split = (f"{s['cpu_main_s']:.1f} / {s['cpu_children_s']:.1f}"
                 if s["contender"].startswith("evalsup") and s.get("cpu_main_s") is not None else "-")
        xcpu = f"{s['cpu_s'] / ref['cpu_s']:.2f}" if ref and ref.get("cpu_s") else "-"
        xrss = f"{s['peak_tree_rss_mb'] / ref['peak_tree_rss_mb']:.2f}" if ref and ref.get("peak_tree_rss_mb") else "-"
        user = user_cpu(doc, s["contender"])
        xuser = f"{user / ref_user:.2f}" if user and ref_user else "-"
        durable = f"{s['durable_s']:.1f}" if s.get("durable_s") is not None else "-"
        name = s["contender"] + (f" (ended with {'/'.join(map(str, s['workers_used']))} w)"
                                 if s.get("workers_used") else "")
        rows.append(f"| {name} | {s['wall_s']:.1f} | {durable} | {s['requests_per_s']:,.0f} "
                    f"| {s['ideal_ratio']:.0%} "
                    f"| {s['cpu_s']:.1f} | {split} | {s['peak_tree_rss_mb']:,.0f} | {s['peak_proc_rss_mb']:,.0f} "
                    f"| {'yes' if s['all_ok'] else 'NO'} | {xcpu} | {xuser} | {xrss} |")
    return head + "\n".join(rows) + "\n"


def bars(title: str, groups: list[tuple[str, dict[str, float]]], unit: str, log: bool = False) -> str:
    """Grouped bar chart as a self-contained SVG."""
    import math

    names = sorted({n for _, g in groups for n in g}, key=list(COLORS).index)
    top = max((v for _, g in groups for v in g.values()), default=1.0)
    w, h, left, bottom = 760, 340, 60, 60
    gw = (w - left - 20) / max(1, len(groups))
    bw = gw * 0.8 / max(1, len(names))

    def y(v: float) -> float:
        frac = (math.log10(max(v, 1)) / math.log10(max(top, 10))) if log else v / top
        return h - bottom - frac * (h - bottom - 30)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="#333"/>',
           f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">{unit}</text>']
    for gi, (label, g) in enumerate(groups):
        x0 = left + gi * gw + gw * 0.1
        for ni, n in enumerate(names):
            if n not in g:
                continue
            v = g[n]
            x = x0 + ni * bw
            out.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bw - 2:.1f}" height="{h - bottom - y(v):.1f}" '
                       f'fill="{COLORS.get(n, "#999")}"><title>{n}: {v:,.0f} {unit}</title></rect>')
            out.append(f'<text x="{x + bw / 2:.1f}" y="{y(v) - 3:.1f}" text-anchor="middle" '
                       f'font-size="9">{v:,.0f}</text>')
        out.append(f'<text x="{left + gi * gw + gw / 2:.1f}" y="{h - bottom + 16}" text-anchor="middle">{label}</text>')
    for ni, n in enumerate(names):
        out.append(f'<rect x="{left + ni * 118}" y="{h - 22}" width="10" height="10" fill="{COLORS.get(n, "#999")}"/>'
                   f'<text x="{left + ni * 118 + 14}" y="{h - 13}">{n}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("docs"))
    args = ap.parse_args()
    docs = [json.loads(f.read_text()) for f in args.files]
    for d in docs:
        print(table(d))
    by_cfg = {(d["config"]["n"], d["config"]["kb"], d["config"]["inflight"]): d for d in docs}

    def metric(d: dict[str, Any], key: str) -> dict[str, float]:
        return {s["contender"]: s[key] for s in d["summary"] if s.get(key) is not None}

    rss_groups = [(f"n={n:,}, {kb:g} KB", metric(d, "peak_tree_rss_mb"))
                  for (n, kb, infl), d in sorted(by_cfg.items()) if infl == 128]
    if rss_groups:
        (args.out / "bench-rss-vs-n.svg").write_text(
            bars("peak RSS of the process tree (MB, log scale)", rss_groups, "MB", log=True))
    thr_groups = [(f"{infl} in flight, {kb:g} KB", metric(d, "requests_per_s"))
                  for (n, kb, infl), d in sorted(by_cfg.items(), key=lambda kv: (kv[0][1], kv[0][2])) if n == 10000]
    if thr_groups:
        (args.out / "bench-throughput-vs-inflight.svg").write_text(
            bars("requests per second", thr_groups, "req/s"))


if __name__ == "__main__":
    main()
