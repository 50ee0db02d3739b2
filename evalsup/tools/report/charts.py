"""The report's charts, as inline SVG: memory, request rate, tokens/s and errors by code over time (the
sessions on one time axis, the gaps between them shown as gaps), and log-binned distributions."""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import attrgetter

from evalsup.tools.report.data import Progress, RunData, Sample
from evalsup.tools.report.scan import LogHist
from evalsup.tools.report.svg import Chart, TimeMap, esc, fmt_s, fmt_span

MIB = 1 << 20
PALETTE = ("#8da0cb", "#66c2a5", "#a6d854", "#e78ac3", "#ffd92f", "#e5c494", "#b3b3b3", "#fc8d62")
ERROR_PALETTE = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
LIMIT_COLOUR = "#ff7f0e"
TOTAL_COLOUR, WS_COLOUR, RATE_COLOUR, OK_COLOUR, FAIL_COLOUR = "#1f4e9c", "#d62728", "#1f4e9c", "#4c78a8", "#e45756"
PROMPT_COLOUR, COMPLETION_COLOUR = "#9ecae1", "#1f4e9c"
MARKED = {"recycle": "#9467bd", "restart": "#d62728", "start": "#7f7f7f"}


def _session_of(d: RunData) -> Callable[[float], int]:
    spans = d.spans()

    def which(t: float) -> int:
        for i, (a, b) in enumerate(spans):
            if a <= t <= b:
                return i
        near = min(range(len(spans)), key=lambda i: min(abs(t - spans[i][0]), abs(t - spans[i][1])))
        a, b = spans[near]
        return near if a - 0.5 <= t <= b + 0.5 else -1 - near  # just outside: still its session; else none
    return which


def _by_session(d: RunData, tm: TimeMap, value: Callable[[Sample], float | None]) -> list[list[tuple[float, float]]]:
    """``value`` of each memory sample (None: not drawn), one line a session: none drawn across a gap."""
    session = _session_of(d)
    segs: dict[int, list[tuple[float, float]]] = {}
    for s in d.samples:
        if (v := value(s)) is not None:
            segs.setdefault(session(s.t), []).append((tm(s.t), v))
    return list(segs.values())


def _endpoint_limit(url: str) -> Callable[[Sample], float | None]:
    return lambda s: float(s.eps.get(url, 0)) if s.eps else None


def _time_chart(chart_id: str, d: RunData, tm: TimeMap, top: float) -> Chart:
    """A chart over time with what all of them share: gaps between sessions, throttled and endpoint-down
    periods, recycles and restarts."""
    c = Chart(chart_id, 0.0, tm.x1, top)
    for a, b in tm.gaps:
        c.band(tm(a), tm(b), "gap", f"not running for {fmt_span(b - a)} (between sessions)",
               f"stopped {fmt_span(b - a)}")
    for a, b in d.throttled:
        c.band(tm(a), tm(b), "throttle", f"throttled (dispatch paused for memory) {b - a:,.1f}s")
    for a, b in d.down:
        c.band(tm(a), tm(b), "down", f"endpoint down (circuit breaker open) {b - a:,.1f}s")
    labels = len(d.markers) <= 24
    for t, kind, label in d.markers:
        c.vline(tm(t), f"event {kind}", MARKED[kind], label if labels else None, f"{label} at {t - d.t0:,.1f}s")
    return c


def _finish(c: Chart, tm: TimeMap, yscale: float, ylabel: str, title: str) -> str:
    ticks, xlabel = tm.ticks()
    c.axes(ticks, xlabel, yscale, ylabel)
    return c.svg(title)


def memory_chart(d: RunData, tm: TimeMap) -> str:
    top = max([s.total for s in d.samples] + [s.working_set for s in d.samples] + [d.limit or 0, d.high or 0, 1])
    c = _time_chart("memory-chart", d, tm, top * 1.08)
    per_worker: dict[str, list[tuple[float, float]]] = {}
    for s in d.samples:
        for pid, rss in s.workers.items():
            per_worker.setdefault(pid, []).append((tm(s.t), rss))
    for i, (pid, pts) in enumerate(per_worker.items()):
        c.line(pts, "series worker", PALETTE[i % len(PALETTE)], 1.2, f"worker {pid} RSS")
    for name, cls, colour, attr in (("total RSS (supervisor + workers)", "series total", TOTAL_COLOUR, "total"),
                                    ("cgroup working set", "series working-set", WS_COLOUR, "working_set")):
        c.lines(_by_session(d, tm, attrgetter(attr)), cls, colour, 2, name)
    for value, cls, colour, label in ((d.limit, "limit", "#000000", "limit"), (d.high, "high", "#ff7f0e", "high mark"),
                                      (d.low, "low", "#2ca02c", "low mark")):
        if value:
            c.hline(value, cls, colour, f"{label} {value / MIB:,.0f} MiB")
    return _finish(c, tm, MIB, "MiB", "memory over time")


def rate_segments(d: RunData, tm: TimeMap) -> list[list[tuple[float, float]]]:
    """Results a second between two memory samples of one session; none across a gap."""
    session = _session_of(d)
    segs: dict[int, list[tuple[float, float]]] = {}
    for a, b in zip(d.samples, d.samples[1:], strict=False):
        sa, sb = session(a.t), session(b.t)
        if b.t > a.t and sa == sb:
            segs.setdefault(sa, []).append((tm(b.t), max(0, b.done - a.done) / (b.t - a.t)))
    return list(segs.values())


def rate_chart(d: RunData, tm: TimeMap) -> str:
    segs = rate_segments(d, tm)
    c = _time_chart("rate-chart", d, tm, max([r for s in segs for _, r in s] + [1.0]) * 1.1)
    c.lines(segs, "series rate", RATE_COLOUR, 2, "results per second")
    return _finish(c, tm, 1.0, "results / s", "request rate over time")


def concurrency_chart(d: RunData, tm: TimeMap) -> str:
    """The concurrency limit (adaptive, summed over the workers) and the requests on the wire, per session; with
    several endpoints, each one's limit too (thin, 0 while it is ejected)."""
    top = max([float(max(s.limit, s.wire)) for s in d.samples] + [1.0]) * 1.1
    c = _time_chart("concurrency-chart", d, tm, top)
    for attr, cls, colour, name in (("limit", "series limit", LIMIT_COLOUR, "concurrency limit"),
                                    ("wire", "series wire", RATE_COLOUR, "requests in flight")):
        c.lines(_by_session(d, tm, attrgetter(attr)), cls, colour, 2, name)
    for i, url in enumerate(d.endpoints):  # (samples of a session with one endpoint have no eps: not drawn)
        c.lines(_by_session(d, tm, _endpoint_limit(url)),
                "series endpoint-limit", PALETTE[i % len(PALETTE)], 1.2, f"limit of {url}")
    return _finish(c, tm, 1.0, "requests", "concurrency over time")


def _pairs(d: RunData) -> list[tuple[Progress, Progress]]:
    return [(a, b) for a, b in zip(d.progress, d.progress[1:], strict=False) if a.session == b.session and b.t > a.t]


def tokens_chart(d: RunData, tm: TimeMap) -> str:
    prompt: dict[int, list[tuple[float, float]]] = {}
    completion: dict[int, list[tuple[float, float]]] = {}
    for a, b in _pairs(d):
        dt = b.t - a.t
        completion.setdefault(a.session, []).append((tm(b.t), max(0, b.completion_tokens - a.completion_tokens) / dt))
        prompt.setdefault(a.session, []).append((tm(b.t), max(0, (b.tokens - b.completion_tokens)
                                                               - (a.tokens - a.completion_tokens)) / dt))
    top = max([v for s in (*prompt.values(), *completion.values()) for _, v in s] + [1.0])
    c = _time_chart("tokens-chart", d, tm, top * 1.1)
    c.lines(list(prompt.values()), "series prompt-tokens", PROMPT_COLOUR, 2, "prompt tokens / s")
    c.lines(list(completion.values()), "series completion-tokens", COMPLETION_COLOUR, 2, "completion tokens / s")
    return _finish(c, tm, 1.0, "tokens / s", "tokens per second over time")


def error_codes(d: RunData) -> list[str]:
    codes: dict[str, int] = {}
    for p in d.progress:
        for k, v in p.errors.items():
            codes[k] = max(codes.get(k, 0), v)
    return sorted(codes, key=lambda k: -codes[k])[:len(ERROR_PALETTE)]


def errors_chart(d: RunData, tm: TimeMap) -> str:
    """Failed records a minute, by error code (the last attempt's), between two checkpoints."""
    codes = error_codes(d)
    series: dict[str, dict[int, list[tuple[float, float]]]] = {k: {} for k in codes}
    for a, b in _pairs(d):
        for k in codes:
            n = max(0, b.errors.get(k, 0) - a.errors.get(k, 0))
            series[k].setdefault(a.session, []).append((tm(b.t), 60 * n / (b.t - a.t)))
    top = max([v for s in series.values() for seg in s.values() for _, v in seg] + [1.0])
    c = _time_chart("errors-chart", d, tm, top * 1.1)
    for i, k in enumerate(codes):
        c.lines(list(series[k].values()), f"series error err-{i}", ERROR_PALETTE[i], 2, f"{k} a minute")
    return _finish(c, tm, 1.0, "failed tasks / min", "errors by code over time")


def hist_chart(chart_id: str, parts: list[tuple[LogHist, str, str]], xlabel: str, fmt: Callable[[float], str],
               ylabel: str, markers: dict[str, float | None]) -> str:
    """Stacked log-binned histograms (all with the same bins), with percentile markers labelled in rows."""
    first = parts[0][0]
    counts = [sum(h.counts[i] for h, _, _ in parts) for i in range(len(first.counts))]
    used = [i for i, n in enumerate(counts) if n]
    lo, hi = (used[0], used[-1] + 1) if used else (0, first.per_decade)
    lo, hi = max(0, lo - 1), min(len(counts), hi + 1)
    c = Chart(chart_id, first.edge(lo), first.edge(hi), max([*counts, 1]) * 1.12)
    for i in range(lo, hi):
        base = 0
        for h, cls, colour in parts:
            n = h.counts[i]
            if n:
                c.bar(first.edge(i), first.edge(i + 1), base, n, cls, colour,
                      f"{n:,} {cls.split()[-1]} in {fmt(10 ** first.edge(i))} - {fmt(10 ** first.edge(i + 1))}")
                base += n
    for name, v in markers.items():
        if v is not None and v > 0 and first.edge(lo) <= math.log10(v) <= first.edge(hi):
            c.pct_marker(math.log10(v), f"{name} {fmt(v)}", f"{name}: {fmt(v)}")
    mults = (1, 2, 5) if first.edge(hi) - first.edge(lo) > 1.3 else (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)
    ticks = [(e + math.log10(m), fmt(m * 10**e)) for e in range(first.lo, first.hi + 1) for m in mults
             if first.edge(lo) <= e + math.log10(m) <= first.edge(hi)]
    c.axes(ticks, xlabel, 1.0, ylabel)
    return c.svg(chart_id.replace("-", " "))


def latency_chart(d: RunData, markers: dict[str, float | None]) -> str:
    r = d.results
    return hist_chart("latency-chart", [(r.lat_ok, "bar ok", OK_COLOUR), (r.lat_failed, "bar failed", FAIL_COLOUR)],
                      "latency, first attempt to last byte (log scale)", fmt_s, "tasks", markers)


def fmt_tokens(v: float) -> str:
    return f"{v:,.0f}" if v >= 1 else f"{v:.2g}"


def timing_chart(chart_id: str, h: LogHist, xlabel: str) -> str:
    return hist_chart(chart_id, [(h, "bar ok", OK_COLOUR)], xlabel, fmt_s, "tasks", h.percentiles())


def tokens_hist_chart(d: RunData) -> str:
    h = d.results.out_tokens
    return hist_chart("output-length-chart", [(h, "bar ok", COMPLETION_COLOUR)],
                      "completion tokens per answer (log scale)", fmt_tokens, "answers", h.percentiles())


SCORE_ROW = 18  # pixels a group in the score chart
SCORE_LEFT, SCORE_W = 260, 960


def score_chart(chart_id: str, rows: list[tuple[str, float, float, float, int]], title: str) -> str:
    """Accuracy per group: a bar each (label, accuracy, the 95 % interval's ends, n), its interval as a
    whisker, the value at its end; 0 to 1 across."""
    top, bottom = 24, 44
    h = top + bottom + SCORE_ROW * len(rows)
    span = SCORE_W - SCORE_LEFT - 70

    def x(v: float) -> float:
        return SCORE_LEFT + v * span

    p: list[str] = []
    for i in range(5):
        v = i / 4
        p.append(f'<line class="grid" x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{top}" y2="{h - bottom}"/>'
                 f'<text class="tick" x="{x(v):.1f}" y="{h - bottom + 16}" text-anchor="middle">{v:.2f}</text>')
    for j, (label, acc, lo, hi, n) in enumerate(rows):
        y = top + j * SCORE_ROW
        mid = y + SCORE_ROW / 2
        shown = label if len(label) <= 36 else label[:35] + "…"
        p.append(f'<g class="score-row"><title>{esc(label)}: {acc:.3f} (95% CI {lo:.3f}-{hi:.3f}), n={n:,}</title>'
                 f'<text class="tick" x="{SCORE_LEFT - 8}" y="{mid + 4:.1f}" text-anchor="end">{esc(shown)}</text>'
                 f'<rect x="{x(0):.1f}" y="{y + 3}" width="{max(acc * span, 1):.1f}" height="{SCORE_ROW - 6}" '
                 f'fill="{OK_COLOUR}"/>'
                 f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{mid:.1f}" y2="{mid:.1f}" stroke="#222"/>'
                 f'<line x1="{x(lo):.1f}" x2="{x(lo):.1f}" y1="{mid - 4:.1f}" y2="{mid + 4:.1f}" stroke="#222"/>'
                 f'<line x1="{x(hi):.1f}" x2="{x(hi):.1f}" y1="{mid - 4:.1f}" y2="{mid + 4:.1f}" stroke="#222"/>'
                 f'<text class="tick" x="{x(hi) + 6:.1f}" y="{mid + 4:.1f}">{acc:.3f}</text></g>')
    p.append(f'<text class="label" x="{x(0.5):.1f}" y="{h - 4}" text-anchor="middle">accuracy (bars), 95% Wilson '
             "interval (whiskers)</text>")
    return (f'<svg id="{chart_id}" class="chart" viewBox="0 0 {SCORE_W} {h}" width="{SCORE_W}" height="{h}" '
            f'role="img" aria-label="{esc(title)}">' + "".join(p) + "</svg>")
