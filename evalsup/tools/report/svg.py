"""Drawing for the report: an SVG plot area with linear axes, and the time axis that shows gaps as gaps."""

from __future__ import annotations

import bisect
import html
import math
from typing import Any

W, H = 1200, 340
LEFT, RIGHT, TOP, BOTTOM = 72, 20, 16, 40
GAP_SHARE = 0.04  # at most this share of the time axis for one gap between sessions


def nice_step(span: float, ticks: int = 6) -> float:
    raw = max(span, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def decimals(step: float) -> int:
    return 0 if step >= 1 else min(6, -math.floor(math.log10(step)))


def fmt_s(v: float) -> str:
    return f"{v * 1000:,.3g} ms" if v < 1 else f"{v:,.3g} s"


def fmt_span(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class TimeMap:
    """Real time -> position on the time axis: the sessions at their true scale, each gap between them at most
    GAP_SHARE of the running time wide (a night between two sessions does not squash them into slivers)."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        merged: list[tuple[float, float]] = []
        for a, b in sorted((a, max(b, a + 1e-3)) for a, b in spans):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        spans = merged or [(0.0, 1.0)]
        running = sum(b - a for a, b in spans)
        self.t0 = spans[0][0]
        self.pieces: list[tuple[float, float, float, float]] = []  # (real a, real b, axis a, axis b)
        self.gaps: list[tuple[float, float]] = []
        x = 0.0
        prev: float | None = None
        for a, b in spans:
            if prev is not None and a > prev:
                w = min(a - prev, GAP_SHARE * running)
                self.pieces.append((prev, a, x, x + w))
                self.gaps.append((prev, a))
                x += w
            self.pieces.append((a, b, x, x + (b - a)))
            x += b - a
            prev = b
        self.x1 = max(x, 1.0)
        self._starts = [p[0] for p in self.pieces]
        self.spans = spans

    def __call__(self, t: float) -> float:
        i = max(0, bisect.bisect_right(self._starts, t) - 1)
        a, b, xa, xb = self.pieces[i]
        if t <= a:
            return xa
        if t >= b:
            return xb
        return xa + (t - a) / (b - a) * (xb - xa)

    def ticks(self) -> tuple[list[tuple[float, str]], str]:
        """Ticks at round times since the first start, inside the sessions only; and the axis's title."""
        span = self.spans[-1][1] - self.t0
        running = sum(b - a for a, b in self.spans)
        unit, name = (1.0, "s") if span <= 300 else ((60.0, "min") if span <= 4 * 3600 else (3600.0, "h"))
        step = nice_step(running / unit, 8) * unit
        out: list[tuple[float, str]] = []
        for a, b in self.spans:
            v = math.ceil((a - self.t0) / step - 1e-9) * step
            while self.t0 + v <= b * 1.0000001 + 1e-9:
                x = self(self.t0 + v)
                if not out or x - out[-1][0] > 0.04 * self.x1:
                    out.append((x, f"{v / unit:,.{decimals(step / unit)}f}"))
                v += step
        title = f"time since the first start ({name})" + ("; gaps between sessions narrowed" if self.gaps else "")
        return out, title


class Chart:
    """An SVG plot area with linear axes; `x`/`y` map data to pixels."""

    def __init__(self, chart_id: str, x0: float, x1: float, y1: float) -> None:
        self.id, self.x0, self.x1, self.y1 = chart_id, x0, max(x1, x0 + 1e-9), max(y1, 1e-9)
        self.parts: list[str] = []
        self.pct_labels = 0

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
                     f'x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{v:,.{decimals(step)}f}</text>')
            v += step
        for xv, label in xticks:
            x = self.x(xv)
            p.append(f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{H - BOTTOM}" y2="{H - BOTTOM + 5}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 18}" text-anchor="middle">{esc(label)}</text>')
        p.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}"/>'
                 f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{H - BOTTOM}"/>'
                 f'<text class="label" x="{(LEFT + W - RIGHT) / 2}" y="{H - 4}" text-anchor="middle">'
                 f'{esc(xlabel)}</text>'
                 f'<text class="label" x="14" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {(TOP + H - BOTTOM) / 2})">{esc(ylabel)}</text>')
        self.parts[:0] = p

    def band(self, a: float, b: float, cls: str, title: str, label: str | None = None) -> None:
        x0, x1 = self.x(a), self.x(b)
        self.parts.append(f'<rect class="{cls}" x="{x0:.1f}" y="{TOP}" width="{max(x1 - x0, 2):.1f}" '
                          f'height="{H - TOP - BOTTOM}"><title>{esc(title)}</title></rect>')
        if label:
            xm = (x0 + x1) / 2
            self.parts.append(f'<text class="gap-label" x="{xm:.1f}" y="{TOP + 14}" text-anchor="middle">'
                              f'{esc(label)}</text>')

    def vline(self, v: float, cls: str, colour: str, label: str | None, title: str) -> None:
        x = self.x(v)
        self.parts.append(f'<g class="{cls}"><title>{esc(title)}</title><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                          f'y2="{H - BOTTOM}" stroke="{colour}" stroke-dasharray="4 3"/>')
        if label:
            self.parts.append(f'<text x="{x + 3:.1f}" y="{TOP + 4}" fill="{colour}" class="mark" '
                              f'transform="rotate(90 {x + 3:.1f} {TOP + 4})">{esc(label)}</text>')
        self.parts.append("</g>")

    def pct_marker(self, v: float, label: str, title: str) -> None:
        """A percentile: a solid line and a horizontal label in a row of its own (they never overlap)."""
        x = self.x(v)
        y = TOP + 16 + 20 * self.pct_labels
        self.pct_labels += 1
        right = x > W - RIGHT - 160
        self.parts.append(f'<g class="pct"><title>{esc(title)}</title><line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                          f'y2="{H - BOTTOM}" stroke="#222" stroke-width="1.5"/><text class="pct-label" '
                          f'x="{x - 6 if right else x + 6:.1f}" y="{y}" text-anchor="{"end" if right else "start"}">'
                          f"{esc(label)}</text></g>")

    def hline(self, v: float, cls: str, colour: str, label: str) -> None:
        y = self.y(v)
        self.parts.append(f'<g class="{cls}"><line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                          f'stroke="{colour}" stroke-dasharray="8 4"/><text x="{W - RIGHT - 4}" y="{y - 4:.1f}" '
                          f'text-anchor="end" fill="{colour}" class="mark">{esc(label)}</text></g>')

    def line(self, pts: list[tuple[float, float]], cls: str, colour: str, width: float, title: str) -> None:
        if not pts:
            return
        coords = " ".join(f"{self.x(a):.1f},{self.y(b):.1f}" for a, b in pts)
        self.parts.append(f'<polyline class="{cls}" points="{coords}" fill="none" stroke="{colour}" '
                          f'stroke-width="{width}"><title>{esc(title)}</title></polyline>')

    def lines(self, segments: list[list[tuple[float, float]]], cls: str, colour: str, width: float,
              title: str) -> None:
        """One series drawn in pieces: nothing is drawn between the pieces (a gap between sessions)."""
        for seg in segments:
            self.line(seg, cls, colour, width, title)

    def bar(self, a: float, b: float, base: float, n: float, cls: str, colour: str, title: str) -> None:
        x0, x1 = self.x(a), self.x(b)
        y0, y1 = self.y(base + n), self.y(base)
        self.parts.append(f'<rect class="{cls}" x="{x0:.1f}" y="{y0:.1f}" width="{max(x1 - x0 - 1, 1):.1f}" '
                          f'height="{y1 - y0:.1f}" fill="{colour}"><title>{esc(title)}</title></rect>')

    def svg(self, title: str) -> str:
        return (f'<svg id="{self.id}" class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
                f'aria-label="{esc(title)}">' + "".join(self.parts) + "</svg>")
