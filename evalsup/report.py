"""`evalsup report`: one self-contained HTML page of a run directory, its charts drawn here as inline SVG.

The page has the summary.json figures, the memory curve (memory.jsonl: per-worker RSS, total RSS, the
container's working set, limit and watermarks, throttled periods shaded, recycles and restarts from
events.jsonl marked), the request rate (the ``done`` count of the memory samples over time) and the latency
distribution (``metrics.latency_s`` of results.jsonl). Every file is streamed: memory samples are thinned to
at most MAX_POINTS, latencies go into fixed log-spaced bins, so the cost does not grow with the run. No
script and no external resource: the file opens offline and can be mailed around.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.journal import write_atomic

MAX_POINTS = 2000
MAX_MARKERS = 500
MIB = 1 << 20
W, H = 1200, 340
LEFT, RIGHT, TOP, BOTTOM = 72, 20, 16, 40
LAT_BINS_PER_DECADE = 10
LAT_MIN_EXP, LAT_MAX_EXP = -3, 4  # latency bins from 1 ms to 10,000 s
PALETTE = ("#8da0cb", "#66c2a5", "#a6d854", "#e78ac3", "#ffd92f", "#e5c494", "#b3b3b3", "#fc8d62")
TOTAL_COLOUR, WS_COLOUR, RATE_COLOUR, OK_COLOUR, FAIL_COLOUR = "#1f4e9c", "#d62728", "#1f4e9c", "#4c78a8", "#e45756"
MARKED = {"recycle": "#9467bd", "restart": "#d62728", "start": "#7f7f7f"}


class ReportError(Exception):
    pass


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a JSONL file, one line at a time; a torn or bad line (a run still writing) is skipped."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:
        return
    with f:
        for line in f:
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def _checked_records(path: Path) -> Iterator[dict[str, Any]]:
    """results.jsonl's records, checked: a damaged line is a one-line error naming results.jsonl:LINE."""
    from evalsup.checkpoint import RunDirDamaged
    from evalsup.results_file import records

    if not path.exists():
        return
    try:
        yield from records(path)
    except RunDirDamaged as e:
        raise ReportError(str(e)) from None


class Thinner:
    """Keeps every stride-th item, doubling the stride when full: at most `cap` items evenly spread, plus the last."""

    def __init__(self, cap: int) -> None:
        self.cap, self.stride, self.n = cap, 1, 0
        self.items: list[Any] = []
        self.last: Any = None

    def add(self, item: Any) -> None:
        if self.n % self.stride == 0:
            self.items.append(item)
            if len(self.items) > self.cap:
                self.items = self.items[::2]
                self.stride *= 2
        self.n += 1
        self.last = item

    def result(self) -> list[Any]:
        if self.last is not None and (not self.items or self.items[-1] is not self.last):
            return [*self.items, self.last]
        return list(self.items)


@dataclass
class Sample:
    t: float
    total: int  # supervisor + workers RSS
    working_set: int
    done: int
    workers: dict[str, int]  # pid -> RSS


@dataclass
class RunData:
    summary: dict[str, Any] | None = None
    samples: list[Sample] = field(default_factory=list)
    n_samples: int = 0
    limit: int | None = None
    high: int | None = None
    low: int | None = None
    throttled: list[tuple[float, float]] = field(default_factory=list)
    down: list[tuple[float, float]] = field(default_factory=list)  # circuit breaker open
    markers: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, label)
    lat_ok: list[int] = field(default_factory=list)
    lat_failed: list[int] = field(default_factory=list)
    t0: float = 0.0
    t1: float = 1.0


def _intervals(flags: Iterator[tuple[float, bool]], end: float) -> list[tuple[float, float]]:
    """(start, end) of the stretches where the flag is set, from (time, flag) pairs in time order."""
    out: list[tuple[float, float]] = []
    since: float | None = None
    for t, on in flags:
        if on and since is None:
            since = t
        elif not on and since is not None:
            out.append((since, t))
            since = None
    if since is not None:
        out.append((since, end))
    return out


def load(run_dir: Path) -> RunData:
    d = RunData()
    if (run_dir / "summary.json").exists():
        try:
            d.summary = orjson.loads((run_dir / "summary.json").read_bytes())
        except orjson.JSONDecodeError:
            d.summary = None
    thin = Thinner(MAX_POINTS - 1)
    paused: list[tuple[float, bool]] = []
    was_paused = False
    for rec in _jsonl(run_dir / "memory.jsonl"):
        t = float(rec.get("t", 0.0))
        workers = {k: int(v) for k, v in (rec.get("workers_rss") or {}).items()}
        total = int(rec.get("supervisor_rss") or 0) + sum(workers.values())
        thin.add(Sample(t, total, int(rec.get("working_set") or 0), int(rec.get("done") or 0), workers))
        d.n_samples += 1
        for name in ("limit", "high", "low"):
            if rec.get(name):
                setattr(d, name, int(rec[name]))
        if bool(rec.get("paused")) != was_paused:
            was_paused = not was_paused
            paused.append((t, was_paused))
    d.samples = thin.result()
    marks = Thinner(MAX_MARKERS)
    breaker: list[tuple[float, bool]] = []
    times = [s.t for s in d.samples[:1] + d.samples[-1:]]
    for ev in _jsonl(run_dir / "events.jsonl"):
        t, kind = float(ev.get("t", 0.0)), str(ev.get("event"))
        times.append(t)
        if kind == "recycle":
            marks.add((t, kind, f"recycle ({ev.get('cause')}) worker {ev.get('pid')}"))
        elif kind == "restart":
            marks.add((t, kind, f"restart ({ev.get('cause')}) worker {ev.get('pid')}"))
        elif kind == "start" and ev.get("resumed"):
            marks.add((t, kind, "resumed"))
        elif kind in ("breaker_open", "breaker_close"):
            breaker.append((t, kind == "breaker_open"))
    d.markers = marks.result()
    if times:
        d.t0, d.t1 = min(times), max(times)
        d.t1 = max(d.t1, d.t0 + 1.0)
    d.throttled = _intervals(iter(paused), d.t1)
    d.down = _intervals(iter(breaker), d.t1)
    n_bins = (LAT_MAX_EXP - LAT_MIN_EXP) * LAT_BINS_PER_DECADE
    d.lat_ok, d.lat_failed = [0] * n_bins, [0] * n_bins
    for rec in _checked_records(run_dir / "results.jsonl"):
        lat = (rec.get("metrics") or {}).get("latency_s")
        if not isinstance(lat, int | float):
            continue
        i = int((math.log10(lat) - LAT_MIN_EXP) * LAT_BINS_PER_DECADE) if lat > 0 else 0
        (d.lat_ok if rec.get("error") is None else d.lat_failed)[min(max(i, 0), n_bins - 1)] += 1
    return d


# --------------------------------------------------------------------------------------------- drawing


def nice_step(span: float, ticks: int = 6) -> float:
    raw = max(span, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


class Chart:
    """An SVG plot area with linear axes; `x`/`y` map data to pixels."""

    def __init__(self, chart_id: str, x0: float, x1: float, y1: float) -> None:
        self.id, self.x0, self.x1, self.y1 = chart_id, x0, max(x1, x0 + 1e-9), max(y1, 1e-9)
        self.parts: list[str] = []

    def x(self, v: float) -> float:
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (W - LEFT - RIGHT)

    def y(self, v: float) -> float:
        return H - BOTTOM - v / self.y1 * (H - TOP - BOTTOM)

    def axes(self, xticks: list[tuple[float, str]], xlabel: str, yscale: float, ylabel: str) -> None:
        p: list[str] = []  # drawn first, behind the data
        step = nice_step(self.y1 / yscale, 5)
        v = 0.0
        while v * yscale <= self.y1 * 1.0001:
            y = self.y(v * yscale)
            p.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/><text class="tick" '
                     f'x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{v:,.{_decimals(step)}f}</text>')
            v += step
        for xv, label in xticks:
            x = self.x(xv)
            p.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{H - BOTTOM}" y2="{H - BOTTOM + 5}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{_esc(label)}</text>')
        p.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}"/>'
                 f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{H - BOTTOM}"/>'
                 f'<text class="label" x="{(LEFT + W - RIGHT) / 2}" y="{H - 4}" text-anchor="middle">'
                 f'{_esc(xlabel)}</text>'
                 f'<text class="label" x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{_esc(ylabel)}</text>')
        self.parts[:0] = p

    def band(self, a: float, b: float, cls: str, title: str) -> None:
        x0, x1 = self.x(a), self.x(b)
        self.parts.append(f'<rect class="{cls}" x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 2):.1f}" '
                          f'height="{H - TOP - BOTTOM}"><title>{_esc(title)}</title></rect>')

    def vline(self, v: float, cls: str, colour: str, label: str | None, title: str) -> None:
        x = self.x(v)
        self.parts.append(f'<g class="{cls}"><title>{_esc(title)}</title><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                          f'y2="{H - BOTTOM}" stroke="{colour}" stroke-dasharray="4 3"/>')
        if label:
            self.parts.append(f'<text x="{x + 3:.1f}" y="{TOP + 4}" fill="{colour}" class="mark" '
                              f'transform="rotate(90 {x + 3:.1f} {TOP + 4})">{_esc(label)}</text>')
        self.parts.append("</g>")

    def hline(self, v: float, cls: str, colour: str, label: str) -> None:
        y = self.y(v)
        self.parts.append(f'<g class="{cls}"><line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                          f'stroke="{colour}" stroke-dasharray="8 4"/><text x="{W - RIGHT - 4}" y="{y - 4:.1f}" '
                          f'text-anchor="end" fill="{colour}" class="mark">{_esc(label)}</text></g>')

    def line(self, pts: list[tuple[float, float]], cls: str, colour: str, width: float, title: str) -> None:
        if not pts:
            return
        coords = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in pts)
        self.parts.append(f'<polyline class="{cls}" points="{coords}" fill="none" stroke="{colour}" '
                          f'stroke-width="{width}"><title>{_esc(title)}</title></polyline>')

    def svg(self, title: str) -> str:
        return (f'<svg id="{self.id}" class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
                f'aria-label="{_esc(title)}">' + "".join(self.parts) + "</svg>")


def _decimals(step: float) -> int:
    return 0 if step >= 1 else min(6, -math.floor(math.log10(step)))


def _time_axis(d: RunData) -> tuple[list[tuple[float, str]], str]:
    span = d.t1 - d.t0
    unit, name = (1.0, "s") if span <= 300 else ((60.0, "min") if span <= 4 * 3600 else (3600.0, "h"))
    step = nice_step(span / unit) * unit
    ticks, v = [], 0.0
    while v <= span * 1.0001:
        ticks.append((d.t0 + v, f"{v / unit:,.{_decimals(step / unit)}f}"))
        v += step
    return ticks, f"time since start ({name})"


def _timeline(c: Chart, d: RunData) -> None:
    """What the time charts share: throttled and endpoint-down periods, recycles and restarts."""
    for a, b in d.throttled:
        c.band(a, b, "throttle", f"throttled (dispatch paused for memory) {b - a:,.1f}s")
    for a, b in d.down:
        c.band(a, b, "down", f"endpoint down (circuit breaker open) {b - a:,.1f}s")
    labels = len(d.markers) <= 24
    for t, kind, label in d.markers:
        c.vline(t, f"event {kind}", MARKED[kind], label if labels else None, f"{label} at {t - d.t0:,.1f}s")


def memory_chart(d: RunData) -> str:
    top = max([s.total for s in d.samples] + [s.working_set for s in d.samples] + [d.limit or 0, d.high or 0, 1])
    c = Chart("memory-chart", d.t0, d.t1, top * 1.08)
    _timeline(c, d)
    per_worker: dict[str, list[tuple[float, float]]] = {}
    for s in d.samples:
        for pid, rss in s.workers.items():
            per_worker.setdefault(pid, []).append((s.t, rss))
    for i, (pid, pts) in enumerate(per_worker.items()):
        c.line(pts, "series worker", PALETTE[i % len(PALETTE)], 1.2, f"worker {pid} RSS")
    c.line([(s.t, s.total) for s in d.samples], "series total", TOTAL_COLOUR, 2, "total RSS (supervisor + workers)")
    c.line([(s.t, s.working_set) for s in d.samples], "series working-set", WS_COLOUR, 2, "cgroup working set")
    for value, cls, colour, name in ((d.limit, "limit", "#000000", "limit"), (d.high, "high", "#ff7f0e", "high mark"),
                                     (d.low, "low", "#2ca02c", "low mark")):
        if value:
            c.hline(value, cls, colour, f"{name} {value / MIB:,.0f} MiB")
    ticks, xlabel = _time_axis(d)
    c.axes(ticks, xlabel, MIB, "MiB")
    return c.svg("memory over time")


def rate_chart(d: RunData) -> str:
    pts: list[tuple[float, float]] = []
    for a, b in zip(d.samples, d.samples[1:], strict=False):
        if b.t > a.t:
            pts.append((b.t, max(0, b.done - a.done) / (b.t - a.t)))
    c = Chart("rate-chart", d.t0, d.t1, max([r for _, r in pts] + [1.0]) * 1.1)
    _timeline(c, d)
    c.line(pts, "series rate", RATE_COLOUR, 2, "requests per second")
    ticks, xlabel = _time_axis(d)
    c.axes(ticks, xlabel, 1.0, "requests / s")
    return c.svg("request rate over time")


def latency_chart(d: RunData, percentiles: dict[str, Any]) -> str:
    counts = [a + b for a, b in zip(d.lat_ok, d.lat_failed, strict=True)]
    used = [i for i, n in enumerate(counts) if n]
    lo, hi = (used[0], used[-1] + 1) if used else (0, LAT_BINS_PER_DECADE)
    lo, hi = max(0, lo - 1), min(len(counts), hi + 1)

    def edge(i: float) -> float:  # bin edge -> log10 seconds
        return LAT_MIN_EXP + i / LAT_BINS_PER_DECADE

    c = Chart("latency-chart", edge(lo), edge(hi), max([*counts, 1]) * 1.1)
    for i in range(lo, hi):
        base = 0
        for n, cls, colour in ((d.lat_ok[i], "bar ok", OK_COLOUR), (d.lat_failed[i], "bar failed", FAIL_COLOUR)):
            if not n:
                continue
            x0, x1 = c.x(edge(i)), c.x(edge(i + 1))
            y0, y1 = c.y(base + n), c.y(base)
            c.parts.append(f'<rect class="{cls}" x="{x0:.1f}" y="{y0:.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
                           f'height="{y1 - y0:.1f}" fill="{colour}"><title>{n:,} {cls.split()[1]} in '
                           f'{_fmt_s(10 ** edge(i))} - {_fmt_s(10 ** edge(i + 1))}</title></rect>')
            base += n
    for name, v in percentiles.items():
        if isinstance(v, int | float) and v > 0 and edge(lo) <= math.log10(v) <= edge(hi):
            c.vline(math.log10(v), "pct", "#333333", f"{name} {_fmt_s(v)}", f"{name} latency {_fmt_s(v)}")
    ticks = [(e + math.log10(m), _fmt_s(m * 10**e)) for e in range(LAT_MIN_EXP, LAT_MAX_EXP + 1) for m in (1, 2, 5)
             if edge(lo) <= e + math.log10(m) <= edge(hi)]
    c.axes(ticks, "latency (log scale)", 1.0, "tasks")
    return c.svg("latency distribution")


def _fmt_s(v: float) -> str:
    return f"{v * 1000:,.3g} ms" if v < 1 else f"{v:,.3g} s"


# --------------------------------------------------------------------------------------------- the page

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; max-width: 1260px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 6px; }
.figures { display: grid; grid-template-columns: repeat(4, 1fr); gap: 8px 16px; margin: 14px 0; }
.figures div { background: #f4f6f9; border-radius: 6px; padding: 8px 10px; }
.figures b { display: block; font-size: 12px; color: #666; font-weight: normal; }
.legend span { margin-right: 16px; white-space: nowrap; } .legend i { display: inline-block; width: 18px;
  height: 4px; vertical-align: middle; margin-right: 5px; }
svg.chart { background: #fff; border: 1px solid #ddd; max-width: 100%; height: auto; }
.grid { stroke: #eee; } .axis { stroke: #888; } .tick, .mark { font-size: 11px; fill: #555; }
.label { font-size: 12px; fill: #333; } .throttle { fill: #ff9f1c; fill-opacity: .18; }
.down { fill: #d62728; fill-opacity: .12; } .series.worker { stroke-opacity: .8; }
.muted { color: #777; } pre { background: #f4f6f9; padding: 10px; overflow-x: auto; font-size: 12px; }
"""


def _legend(items: list[tuple[str, str]]) -> str:
    return '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{_esc(n)}</span>'
                                          for n, c in items) + "</p>"


def _figures(s: dict[str, Any] | None) -> str:
    if s is None:
        return '<p class="muted">No summary.json: the run is still going, or its process was killed.</p>'
    lat = s.get("latency_s") or {}
    mem = s.get("memory") or {}
    thr = s.get("throttle") or {}
    rows = [
        ("state", "finished" if s.get("finished") else f"stopped: {s.get('stopped') or 'unfinished'}"),
        ("tasks", f"{s.get('total', 0):,} ({s.get('succeeded', 0):,} ok, {s.get('failed', 0):,} failed)"),
        ("invalid lines", f"{s.get('invalid', 0):,}"),
        ("this session", f"{s.get('this_session', 0):,} in {s.get('wall_s', 0):,.1f}s"),
        ("throughput", f"{s.get('requests_per_s') or 0:,.1f} req/s"),
        ("latency", "  ".join(f"{k} {_fmt_s(v)}" for k, v in lat.items() if isinstance(v, int | float)) or "-"),
        ("workers", f"{s.get('workers')} x concurrency {s.get('concurrency')} total"),
        ("retries", f"{s.get('retries', 0):,}"),
        ("worker restarts", f"{s.get('worker_restarts', 0):,}"),
        ("recycles", ", ".join(f"{k} {v}" for k, v in (s.get("recycles") or {}).items() if v) or "0"),
        ("throttled", f"{thr.get('episodes', 0)} time(s), {thr.get('paused_s', 0):,.1f}s"),
        ("memory", f"peak {mem.get('peak_mb', 0):,.0f} MiB, limit "
                   + (f"{mem['limit_mb']:,.0f} MiB" if mem.get("limit_mb") else "none") + f" ({mem.get('source')})"),
        ("OOM kills", f"{s.get('oom_kills', 0)}"),
        ("endpoint down", f"{(s.get('breaker') or {}).get('opened', 0)} time(s)"),
        ("tokens", f"{(s.get('tokens') or {}).get('per_s') or 0:,.0f} tokens/s"),
        ("errors", ", ".join(f"{k} {v}" for k, v in (s.get("errors") or {}).items()) or "none"),
    ]
    return '<div class="figures">' + "".join(f"<div><b>{_esc(k)}</b>{_esc(v)}</div>" for k, v in rows) + "</div>"


def render(run_dir: Path, d: RunData) -> str:
    s = d.summary
    n_lat = sum(d.lat_ok) + sum(d.lat_failed)
    thinned = f", {len(d.samples):,} drawn" if len(d.samples) < d.n_samples else ""
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>evalsup report: {_esc(run_dir.name)}'
        f"</title><style>{CSS}</style></head><body>",
        f"<h1>evalsup report</h1><p class=\"muted\">{_esc(run_dir.resolve())}</p>",
        _figures(s),
        f'<h2>Memory</h2><p class="muted">{d.n_samples:,} samples{thinned}; shaded: throttled (orange), endpoint '
        "down (red); dashed verticals: recycles, restarts.</p>",
        _legend([("workers' RSS (one line a process)", PALETTE[0]), ("total RSS", TOTAL_COLOUR),
                 ("cgroup working set", WS_COLOUR)]),
        memory_chart(d) if d.samples else '<p id="memory-chart" class="muted">No memory samples.</p>',
        "<h2>Request rate</h2>",
        rate_chart(d) if len(d.samples) > 1 else '<p id="rate-chart" class="muted">Too few samples.</p>',
        f'<h2>Latency</h2><p class="muted">{n_lat:,} results, first attempt to last byte.</p>',
        _legend([("succeeded", OK_COLOUR), ("failed", FAIL_COLOUR)]),
        latency_chart(d, (s or {}).get("latency_s") or {}) if n_lat else '<p id="latency-chart">No results.</p>',
    ]
    if s is not None:
        parts.append("<h2>summary.json</h2><details><summary>show</summary><pre>"
                     + _esc(orjson.dumps(s, option=orjson.OPT_INDENT_2).decode()) + "</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(run_dir: Path, output: Path | None = None) -> Path:
    """Write the report of `run_dir` (default RUN_DIR/report.html); returns its path."""
    names = ("summary.json", "memory.jsonl", "results.jsonl", "events.jsonl")
    if not any((run_dir / n).exists() for n in names):
        raise ReportError(f"{run_dir}: not a run directory (none of {', '.join(names)})")
    out = output or run_dir / "report.html"
    try:
        write_atomic(out, render(run_dir, load(run_dir)).encode())
    except OSError as e:
        raise ReportError(f"cannot write {out}: {e.strerror}") from None
    return out
