"""The report's page: the figures, the settings, throughput whole and per session, the charts, and the
tables (finish reasons, failed tasks, slowest tasks). No script and no external resource."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from evalsup.cache.text import cache_text
from evalsup.config.caps import budget_text
from evalsup.tools.report import charts
from evalsup.tools.report.data import RunData
from evalsup.tools.report.scan import MAX_FAILED_ROWS
from evalsup.tools.report.svg import TimeMap, esc, fmt_s, fmt_span
from evalsup.tools.status import SECRET_KEYS

SHOW_ROWS = 20  # failed tasks shown at once; the others under "more"

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; max-width: 1260px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 6px; }
h3 { font-size: 15px; margin: 18px 0 4px; }
.figures { display: grid; grid-template-columns: repeat(4, 1fr); gap: 8px 16px; margin: 14px 0; }
.figures div { background: #f4f6f9; border-radius: 6px; padding: 8px 10px; }
.figures b { display: block; font-size: 12px; color: #666; font-weight: normal; }
.legend span { margin-right: 16px; white-space: nowrap; } .legend i { display: inline-block; width: 18px;
  height: 4px; vertical-align: middle; margin-right: 5px; }
svg.chart { background: #fff; border: 1px solid #ddd; max-width: 100%; height: auto; }
.grid { stroke: #eee; } .axis { stroke: #888; } .tick, .mark { font-size: 12px; fill: #555; }
.label { font-size: 13px; fill: #333; } .throttle { fill: #ff9f1c; fill-opacity: .18; }
.down { fill: #d62728; fill-opacity: .12; } .series.worker { stroke-opacity: .8; }
.gap { fill: #888; fill-opacity: .18; } .gap-label { font-size: 12px; fill: #444; }
.pct-label { font-size: 14px; font-weight: 600; fill: #111; paint-order: stroke; stroke: #fff; stroke-width: 4px; }
.muted { color: #777; } pre { background: #f4f6f9; padding: 10px; overflow-x: auto; font-size: 12px; }
table.t { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
table.t th, table.t td { border-bottom: 1px solid #e4e4e4; padding: 3px 10px; text-align: left; vertical-align: top; }
table.t td.n { text-align: right; font-variant-numeric: tabular-nums; } table.t th { background: #f4f6f9; }
.barcell { display: inline-block; height: 10px; background: #4c78a8; vertical-align: middle; }
.warn { color: #b25000; font-weight: 600; } td.msg { max-width: 640px; word-break: break-word; }
"""


def _legend(items: list[tuple[str, str]]) -> str:
    return '<p class="legend">' + "".join(f'<span><i style="background:{c}"></i>{esc(n)}</span>'
                                          for n, c in items) + "</p>"


def _table(table_id: str, head: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    h = "".join(f"<th>{esc(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(
        f'<td class="{"n" if i in numeric else ("msg" if head[i] == "message" else "")}">'
        f'{v if isinstance(v, Raw) else esc("" if v is None else v)}</td>' for i, v in enumerate(r)) + "</tr>"
        for r in rows)
    return f'<table class="t" id="{table_id}"><tr>{h}</tr>{body}</table>'


class Raw(str):
    """HTML made here (a bar), not to be escaped."""


def _whole_rate(d: RunData) -> tuple[int, float] | None:
    """(tasks done in all sessions, seconds running) from the sessions' counts."""
    if not d.sessions or all(s.first_done is None for s in d.sessions):
        return None
    return sum(s.tasks for s in d.sessions), sum(max(0.0, s.stop - s.start) for s in d.sessions)


def _figures(d: RunData) -> str:
    s = d.summary
    if s is None:
        return '<p class="muted">No summary.json: the run is still going, or its process was killed.</p>'
    lat = s.get("latency_s") or {}
    mem = s.get("memory") or {}
    thr = s.get("throttle") or {}
    whole = _whole_rate(d)
    state = "finished" if s.get("finished") else f"stopped: {s.get('stop_reason') or s.get('stopped') or 'unfinished'}"
    if isinstance(s.get("exit_code"), int):
        state += f" (exit {s['exit_code']})"
    rows = [
        ("state", state),
        ("tasks", f"{s.get('total', 0):,} ({s.get('succeeded', 0):,} ok, {s.get('failed', 0):,} failed)"),
        ("invalid lines", f"{s.get('invalid', 0):,}"),
        ("throughput, whole run", f"{whole[0] / whole[1]:,.1f} req/s ({whole[0]:,} in {fmt_span(whole[1])} "
                                  f"running, {len(d.sessions)} session(s))" if whole and whole[1] > 0 else "-"),
        ("throughput, last session", f"{s.get('requests_per_s') or 0:,.1f} req/s ({s.get('this_session', 0):,} in "
                                     f"{s.get('wall_s', 0):,.1f}s)"),
        ("latency", "  ".join(f"{k} {fmt_s(v)}" for k, v in lat.items() if isinstance(v, int | float)) or "-"),
        ("workers", f"{s.get('workers')} x concurrency {s.get('concurrency')} total"),
        ("retries", f"{s.get('retries', 0):,}"),
        ("worker restarts", f"{s.get('worker_restarts', 0):,}"),
        ("recycles", ", ".join(f"{k} {v}" for k, v in (s.get("recycles") or {}).items() if v) or "0"),
        ("throttled", f"{thr.get('episodes', 0)} time(s), {thr.get('paused_s', 0):,.1f}s"),
        ("memory", f"peak {mem.get('peak_mb', 0):,.0f} MiB, limit "
                   + (f"{mem['limit_mb']:,.0f} MiB" if mem.get("limit_mb") else "none") + f" ({mem.get('source')})"),
        ("OOM kills", f"{s.get('oom_kills', 0)}"),
        ("endpoint down", f"{(s.get('breaker') or {}).get('opened', 0)} time(s)"),
        ("tokens, last session", f"{(s.get('tokens') or {}).get('per_s') or 0:,.0f} tokens/s"),
        *([("budget", budget_text(s["budget"]))] if isinstance(s.get("budget"), dict) else []),  # issue 30
        *([("cache", cache_text(s["cache"]))] if isinstance(s.get("cache"), dict) else []),  # --cache (issue 30)
        ("failed tasks by code", ", ".join(f"{k} {v:,}" for k, v in sorted(d.results.errors.items(),
                                                                            key=lambda kv: -kv[1])) or "none"),
    ]
    return '<div class="figures">' + "".join(f"<div><b>{esc(k)}</b>{esc(v)}</div>" for k, v in rows) + "</div>"


def _settings(d: RunData) -> str:
    if not d.settings:
        return ('<p id="settings" class="muted">No run.json in the run directory (a run of an older evalsup): '
                "the settings are not recorded.</p>")
    rows = [[k, "[hidden]" if SECRET_KEYS.match(str(k)) and v else
             (orjson.dumps(v).decode() if isinstance(v, dict | list) else v)] for k, v in d.settings.items()]
    return _table("settings", ["setting", "value"], rows)


def _sessions(d: RunData) -> str:
    if not d.sessions:
        return '<p id="sessions" class="muted">No session recorded in events.jsonl.</p>'
    rows = []
    for i, s in enumerate(d.sessions):
        dur = max(0.0, s.stop - s.start)
        how = ("finished" if s.finished else (s.stopped or "stopped")) if s.end is not None \
            else "no end recorded (killed?)"
        rows.append([i + 1, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.start)), fmt_span(dur),
                     f"{s.tasks:,}" if s.first_done is not None else "-",
                     f"{s.tasks / dur:,.1f}" if dur > 0 and s.first_done is not None else "-", how])
    return _table("sessions", ["session", "started", "ran", "tasks", "req/s", "how it ended"], rows, {0, 3, 4})


def _finish_reasons(d: RunData) -> str:
    f = d.results.finish
    n = sum(f.values())
    if not n:
        return '<p id="finish-reasons" class="muted">No finish_reason in the answers (not chat or completions).</p>'
    rows = []
    for k, v in sorted(f.items(), key=lambda kv: -kv[1]):
        note = " (cut at max_tokens)" if k == "length" else ""
        bar = Raw(f'<span class="barcell" style="width:{max(1, 300 * v / n):.0f}px"></span>')
        rows.append([k + note, f"{v:,}", f"{100 * v / n:.1f}%", bar])
    cut = f.get("length", 0)
    warn = (f'<p class="warn">{cut:,} answer(s) of {n:,} ({100 * cut / n:.1f}%) were cut at max_tokens.</p>'
            if cut else "")
    return warn + _table("finish-reasons", ["finish_reason", "answers", "share", ""], rows, {1, 2})


def _failed(d: RunData) -> str:
    r = d.results
    if not r.failed:
        return '<p id="failed-tasks" class="muted">No failed task.</p>'
    by = ", ".join(f"{k} {v:,}" for k, v in sorted(r.errors.items(), key=lambda kv: -kv[1]))
    more = (f"; the first {MAX_FAILED_ROWS} in the file shown" if r.failed > MAX_FAILED_ROWS else "")
    rows = [[x["id"], x["code"], x["status"], x["attempts"], x["message"]] for x in r.failed_rows]
    head = ["id", "code", "HTTP", "attempts", "message"]
    rest = ""
    if len(rows) > SHOW_ROWS:
        rest = (f"<details><summary>{len(rows) - SHOW_ROWS} more</summary>"
                + _table("failed-tasks-more", head, rows[SHOW_ROWS:], {2, 3}) + "</details>")
    return (f"<p>{r.failed:,} failed: {esc(by)}{more}.</p>"
            + _table("failed-tasks", head, rows[:SHOW_ROWS], {2, 3}) + rest)


def _slowest(d: RunData) -> str:
    rows = [[x["id"], fmt_s(x["latency_s"]), x["attempts"], fmt_s(x["ttft_s"]) if x["ttft_s"] is not None else "",
             x["completion_tokens"], x["outcome"]] for x in d.results.slowest()]
    if not rows:
        return '<p id="slowest-tasks" class="muted">No results.</p>'
    return _table("slowest-tasks", ["id", "latency", "attempts", "TTFT", "completion tokens", "outcome"], rows,
                  {1, 2, 3, 4})


SHOW_GROUPS = 50  # groups in the score charts and the visible rows of the group table; the rest under "more"
CHART_SCORERS = 4  # 0/1 scorers drawn by group


def _score_cells(sc: dict[str, Any]) -> list[Any]:
    if sc.get("accuracy") is not None:
        lo, hi = sc["ci95"]
        return [f"{sc['count']:,}", f"{sc['accuracy']:.3f}", f"{lo:.3f} - {hi:.3f}", f"{sc['unscored']:,}",
                f"{sc['errors']:,}"]
    mean = "-" if sc.get("mean") is None else f"{sc['mean']:.4f}"
    return [f"{sc['count']:,}", mean, "", f"{sc['unscored']:,}", f"{sc['errors']:,}"]


def _scores(d: RunData) -> str:
    """Every set of scores the run has, side by side (issue 43): the run's own (results.jsonl) and `evalsup
    score`'s (results.scored.jsonl), per scorer n, accuracy (0/1 scores) or mean, the 95 % Wilson interval,
    unscored, errors; by group too (a chart per 0/1 scorer, the largest groups; a table of every group)."""
    sets = [("the run", "results.jsonl", d.results)]
    if d.rescored is not None and d.rescored.scores:
        sets.append((d.rescored_by or "evalsup score", "results.scored.jsonl", d.rescored))
    overall = [(label, src, r, r.scores.summary()) for label, src, r in sets]
    if not any(o for _, _, _, o in overall):
        return ('<p id="scores" class="muted">No scores in the records (run with --scorer, or score a finished '
                "run with evalsup score).</p>")
    head = ["scored by", "scorer", "n", "accuracy / mean", "95% CI (Wilson)", "unscored", "errors"]
    rows = [[label if i == 0 else "", k, *_score_cells(v)] for label, _, _, o in overall
            for i, (k, v) in enumerate(o.items())]
    out = [_table("scores", head, rows, {2, 3, 4, 5, 6}),
           '<p class="muted">Accuracy and its 95% Wilson score interval for scores that are all 0 or 1; the mean '
           "otherwise. n counts the tasks scored; unscored tasks (without what the scorer needs) and scorer errors "
           "are apart, in no n. From every record of "
           + " and of ".join(f"{src} ({esc(label)})" for label, src, _, o in overall if o) + ".</p>"]
    for n, (label, _, r, o) in enumerate(overall):
        if r.groups is not None and o:
            out.append(_groups(r, o, "" if n == 0 else f" ({esc(label)})", "" if n == 0 else f"-{n}"))
    return "".join(out)


def _groups(r: Any, overall: dict[str, Any], title: str, suffix: str) -> str:
    """One set's scores by group: a chart per 0/1 scorer (the largest groups), a table of every group."""
    g = r.groups
    out = []
    groups = g.summary()["groups"]
    largest = sorted(groups, key=lambda k: -int(groups[k]["tasks"]))
    out.append(f"<h3>By {esc(g.by)}{title}</h3><p>{len(groups):,} group(s)"
               + (f"; more than {g.max_groups:,}: {g.overflowed:,} task(s) counted in (other)" if g.overflowed else "")
               + "</p>")
    binary = [k for k, v in overall.items() if v.get("accuracy") is not None][:CHART_SCORERS]
    for name in binary:
        rows = [(k, sc["accuracy"], sc["ci95"][0], sc["ci95"][1], sc["count"]) for k in largest[:SHOW_GROUPS]
                if (sc := groups[k]["scores"].get(name)) is not None and sc.get("accuracy") is not None]
        rows.sort(key=lambda t: -t[1])
        if rows:
            more = f" (the {SHOW_GROUPS} largest groups)" if len(groups) > SHOW_GROUPS else ""
            out.append(f'<p class="muted">{esc(name)} by {esc(g.by)}{more}, best first.</p>')
            out.append(charts.score_chart(f"score-chart{suffix}-{binary.index(name)}", rows, f"{name} by {g.by}"))
    head = ["group", "tasks", "failed", "scorer", "n", "accuracy / mean", "95% CI (Wilson)", "unscored", "errors"]
    table_rows: list[list[Any]] = []
    for k in sorted(largest[:SHOW_GROUPS]) + sorted(largest[SHOW_GROUPS:]):
        grp = groups[k]
        for i, (name, sc) in enumerate(grp["scores"].items() or [("-", None)]):
            first = [k, f"{grp['tasks']:,}", f"{grp['failed']:,}"] if i == 0 else ["", "", ""]
            table_rows.append([*first, name, *(_score_cells(sc) if sc else ["0", "-", "", "0", "0"])])
    shown = sum(max(1, len(groups[k]["scores"])) for k in largest[:SHOW_GROUPS])
    numeric = {1, 2, 4, 5, 6, 7, 8}
    out.append(_table(f"scores-by-group{suffix}", head, table_rows[:shown], numeric))
    if len(table_rows) > shown:
        out.append(f"<details><summary>{len(groups) - SHOW_GROUPS:,} smaller group(s)</summary>"
                   + _table(f"scores-by-group-more{suffix}", head, table_rows[shown:], numeric) + "</details>")
    return "".join(out)


def render(run_dir: Path, d: RunData) -> str:
    r = d.results
    tm = TimeMap(d.spans())
    n_lat = r.lat_ok.n + r.lat_failed.n
    thinned = f", {len(d.samples):,} drawn" if len(d.samples) < d.n_samples else ""
    lat_markers = (d.summary or {}).get("latency_s") or {}
    if not lat_markers:
        lat_markers = {k: v for k, v in r.lat_ok.percentiles().items()}
    no = '<p id="{}" class="muted">{}</p>'.format
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>evalsup report: {esc(run_dir.name)}'
        f"</title><style>{CSS}</style></head><body>",
        f"<h1>evalsup report</h1><p class=\"muted\">{esc(run_dir.resolve())}</p>",
        _figures(d),
        "<h2>Settings</h2>", _settings(d),
        "<h2>Sessions</h2>", _sessions(d),
        "<h2>Scores</h2>", _scores(d),
        "<h2>Why answers ended (finish_reason)</h2>", _finish_reasons(d),
        '<h2>Request rate</h2><p class="muted">Results a second; grey: the run was not running (between sessions, '
        "narrowed), orange: throttled, red: endpoint down; dashed verticals: recycles, restarts.</p>",
        charts.rate_chart(d, tm) if len(d.samples) > 1 else no("rate-chart", "Too few memory samples."),
        "<h2>Concurrency</h2>",
        _legend([("concurrency limit, all workers (adaptive, or --concurrency)", charts.LIMIT_COLOUR),
                 ("requests in flight", charts.RATE_COLOUR)]
                + [(f"limit of {u}", charts.PALETTE[i % len(charts.PALETTE)]) for i, u in enumerate(d.endpoints)]),
        charts.concurrency_chart(d, tm) if any(s.limit for s in d.samples)
        else no("concurrency-chart", "No concurrency limit recorded (a run of an older evalsup)."),
        "<h2>Tokens over time</h2>",
        _legend([("prompt tokens / s", charts.PROMPT_COLOUR), ("completion tokens / s", charts.COMPLETION_COLOUR)]),
        charts.tokens_chart(d, tm) if len(d.progress) > 1 else no("tokens-chart", "No progress events recorded."),
        "<h2>Errors over time, by code</h2>",
    ]
    codes = charts.error_codes(d)
    if codes:
        parts += [_legend([(k, charts.ERROR_PALETTE[i]) for i, k in enumerate(codes)]), charts.errors_chart(d, tm)]
    else:
        parts.append(no("errors-chart", "No failed task recorded over time."))
    parts += [
        f'<h2>Latency</h2><p class="muted">{n_lat:,} results, first attempt to last byte.</p>',
        _legend([("succeeded", charts.OK_COLOUR), ("failed", charts.FAIL_COLOUR)]),
        charts.latency_chart(d, lat_markers) if n_lat else no("latency-chart", "No results."),
    ]
    if r.ttft.n:
        parts += [f'<h2>Streaming: time to first token and inter-token latency</h2><p class="muted">{r.ttft.n:,} '
                  "streamed answers.</p>", charts.timing_chart("ttft-chart", r.ttft, "time to first token (log scale)")]
        if r.itl.n:
            parts.append(charts.timing_chart("itl-chart", r.itl, "mean inter-token latency of an answer (log scale)"))
    parts += [
        "<h2>Output length</h2>",
        charts.tokens_hist_chart(d) if r.out_tokens.n else no("output-length-chart", "No usage in the answers."),
        "<h2>Failed tasks</h2>", _failed(d),
        f"<h2>Slowest tasks</h2><p class=\"muted\">The {len(r.slowest())} slowest of {n_lat:,}.</p>", _slowest(d),
        f'<h2>Memory</h2><p class="muted">{d.n_samples:,} samples{thinned}; shaded: throttled (orange), endpoint '
        "down (red); dashed verticals: recycles, restarts.</p>",
        _legend([("workers' RSS (one line a process)", charts.PALETTE[0]), ("total RSS", charts.TOTAL_COLOUR),
                 ("cgroup working set", charts.WS_COLOUR)]),
        charts.memory_chart(d, tm) if d.samples else no("memory-chart", "No memory samples."),
    ]
    if d.summary is not None:
        parts.append("<h2>summary.json</h2><details><summary>show</summary><pre>"
                     + esc(orjson.dumps(d.summary, option=orjson.OPT_INDENT_2).decode()) + "</pre></details>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
