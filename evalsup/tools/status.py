"""`evalsup status`: where a run stands, read-only, from its checkpoint and the tails of its files.

One source for the counts: the checkpoint's (what results.jsonl held up to its fsynced length L), plus the
complete lines written after L (bounded by one checkpoint interval of work), each classified ok or failed from
the end of its line, where the record's top-level "error" sits. Nothing reads a large file whole: the rate and
the ETA come from the checkpoint's recent history, why a run stopped from the tail of events.jsonl and from
summary.json, the settings from run.json (when the run wrote one). A parent of `shard-K-of-N` directories gets
one row a shard (below).
"""

from __future__ import annotations

import enum
import os
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.batch.journal import chunks_of
from evalsup.cache.text import saved_text
from evalsup.common.states import EndpointState
from evalsup.common.text import fmt_duration
from evalsup.config.caps import budget_text
from evalsup.config.exitcodes import BAD_INPUT
from evalsup.rundir import layout
from evalsup.rundir.checkpoint import Checkpoint, JournalError, load_checkpoint
from evalsup.rundir.layout import is_run_dir, parse_shard_dir, shard_dir_name, writer_alive
from evalsup.rundir.results_file import json_file as _json_file
from evalsup.rundir.run_json import SETTING_DEFAULTS

SHOWN_DEFAULTS = {**SETTING_DEFAULTS, "endpoint_path": "/v1"}  # status's text leaves these out (the usual path too)
TAIL_EVENTS = 1 << 20  # bytes of events.jsonl read from its end
SHOW_IDS = 10
OK_MARK = b',"error":null,"metrics":'  # a record without error (tasks.output_line writes this order)
ID_HEAD = re.compile(rb'^\{"id":("(?:[^"\\]|\\.)*")')
SECRET_KEYS = re.compile(r"(?i)^(api_?key|authorization|password|secret|token)$")


class RunState(enum.StrEnum):
    """Where a run stands (RunStatus.state; `evalsup status` prints and --json writes the value)."""

    NOT_STARTED = "not started"  # no checkpoint yet
    RUNNING = "running"  # a run holds the directory's lock
    FINISHED = "finished"  # every task has its record
    STOPPED = "stopped"  # ended before that: rerun to resume (after fixing the input, when it was bad)
    UNREADABLE = "unreadable"  # the checkpoint cannot be read


@dataclass
class RunStatus:
    run_dir: str
    state: RunState
    why: str | None = None  # stopped by SIGTERM; waiting for the endpoint (down since ...); ...
    done: int = 0
    ok: int = 0
    failed: int = 0
    invalid: int = 0
    outstanding: int = 0  # dispatched at the checkpoint and not in results.jsonl
    outstanding_ids: list[str] = field(default_factory=list)  # the first few
    input_line: int = 0  # the task file's lines read (dispatched) so far
    total: int | None = None  # tasks in the input: exact once all is read, else estimated (total_estimated)
    total_estimated: bool = False
    rate: float | None = None  # results a second over the last minute (running), or the session's (ended)
    eta_s: float | None = None
    checkpoint_age_s: float | None = None
    in_flight: int | None = None  # running: requests on the wire at the last memory sample
    concurrency_limit: int | None = None  # running: the workers' (adaptive) limits summed, same sample
    limit_why: str | None = None  # running: why that limit is low, when it is (issue 41)
    ceiling: int | None = None  # running: RUN_DIR/concurrency's ceiling, when the file sets one, same sample
    sampled_at: float | None = None  # running: when that sample was taken (time.time(); evalsup serve reads it)
    endpoints: list[dict[str, Any]] | None = None  # running, several endpoints: url, state, limit, in_flight each
    # running: the oldest requests on the wire at the last memory sample (id, endpoint, age_s, attempt, bytes)
    oldest: list[dict[str, Any]] | None = None
    pid: int | None = None
    exit_code: int | None = None
    restarts: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] | None = None
    # with a cap (issue 30): caps, spent, reserved, projected at the last checkpoint (supervisor.budget)
    budget: dict[str, Any] | None = None
    exit_reason: str | None = None  # "budget" when a cap stopped the run
    # --cache (issue 30): this session's hits and misses at the last checkpoint (a finished run: summary.json's
    # cache figures, the money saved with them)
    cache: dict[str, Any] | None = None
    # a --batch-api run (issue 31): each chunk's batch as its journal last saw it (batches.jsonl)
    batches: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def settings_of(run_dir: Path) -> dict[str, Any] | None:
    """run.json's settings (written by the run, when it does), values of secret-sounding keys hidden."""
    obj = _json_file(run_dir / layout.RUN_JSON)
    s = obj.get("settings") if obj is not None else None
    if not isinstance(s, dict):
        return None
    return {k: ("[hidden]" if SECRET_KEYS.match(str(k)) and v else v) for k, v in s.items()}


def _lines_after(path: Path, start: int) -> list[bytes]:
    """The complete lines of `path` from byte `start` (bounded: what was written after a checkpoint)."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return []
    end = data.rfind(b"\n")
    return data[:end].split(b"\n") if end >= 0 else []


def _record_id(line: bytes) -> str | None:
    m = ID_HEAD.match(line[:4096])
    if m is None:
        return None
    try:
        v = orjson.loads(m.group(1))
    except orjson.JSONDecodeError:
        return None
    return str(v)


def tail_events(run_dir: Path, limit: int = TAIL_EVENTS) -> list[dict[str, Any]]:
    """The events of the last `limit` bytes of events.jsonl (the first, maybe partial, line dropped)."""
    path = run_dir / layout.EVENTS
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > limit:
        lines = lines[1:]
    out = []
    for line in lines:
        try:
            ev = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(ev, dict):
            out.append(ev)
    return out


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _waiting(st: RunStatus) -> bool:
    """The running run is paused, every endpoint down (``_why_running`` said so)."""
    return st.state is RunState.RUNNING and (st.why or "").startswith(WAITING)


WAITING = "waiting for the endpoint"


def _why_running(events: list[dict[str, Any]], now: float) -> str | None:
    """Waiting for the endpoint, or throttled for memory, from the last events of the session."""
    down: dict[str, Any] | None = None
    paused = False
    for ev in events:
        kind = ev.get("event")
        if kind == "start":
            down, paused = None, False
        elif kind == "breaker_open":
            down = ev
        elif kind == "breaker_close":
            down = None
        elif kind in ("pause", "resume"):
            paused = kind == "pause"
    if down is not None:
        t = float(down.get("t") or now)
        return (f"{WAITING}: down since {_clock(t)} ({now - t:,.0f}s)"
                + (f": {down['reason']}" if down.get("reason") else ""))
    if paused:
        return "throttled: dispatch paused for memory"
    return None


def _why_stopped(run_dir: Path, cp: Checkpoint, events: list[dict[str, Any]]) -> tuple[str, int | None]:
    """Why a run that is not running stopped, and its exit code when known."""
    end: dict[str, Any] | None = None
    for ev in events:
        if ev.get("event") == "start":
            end = None
        elif ev.get("event") == "end":
            end = ev
    summary = _json_file(run_dir / layout.SUMMARY)
    try:  # a summary.json of an earlier session says nothing of this one (nor of a later refusal's `end`)
        mtime = (run_dir / layout.SUMMARY).stat().st_mtime
        if summary is not None and (mtime < cp.time - 1 or (end is not None and float(end.get("t") or 0) > mtime)):
            summary = None
    except OSError:
        summary = None
    code = None
    for src in (summary, end):
        if src is None:
            continue
        for k in ("exit_code", "code"):
            if isinstance(src.get(k), int):
                code = src[k]
                break
        if code is not None:
            break
    reason = None
    for src in (summary, end):
        if src is not None:
            r = src.get("stop_reason") or src.get("stopped")
            if r:
                reason = str(r)
                break
    if reason is None:
        reason = ("ended without a word (killed, or the machine went down)" if end is None and summary is None
                  else "stopped")
    if code == BAD_INPUT:  # bad input or settings: the reason says what to fix; the same command meets it again
        return reason, code
    if reason.startswith("budget:"):  # a cap stopped it (issue 30)
        return reason + "; rerun with a higher cap to resume", code
    return reason + "; rerun the same command to resume", code


def _scanned_total(events: list[dict[str, Any]]) -> int | None:
    """The session's total as its pre-scan counted it (the last ``start`` event's ``total``), None without."""
    starts = [e for e in events if e.get("event") == "start"]
    total = starts[-1].get("total") if starts else None
    return total if isinstance(total, int) and not isinstance(total, bool) else None


def _total(cp: Checkpoint, done: int, outstanding: int, scanned: int | None = None) -> tuple[int | None, bool]:
    """Tasks in the input: exact once the reader reached the end it knew of, or once the pre-scan counted every
    line (``scanned``, issue 44), else extrapolated from the bytes read (the fingerprint's size), divided among
    the shards."""
    size = int(cp.fingerprint.get("size") or 0)
    shards = cp.fingerprint.get("shard")
    n = int(shards[1]) if isinstance(shards, list) and len(shards) == 2 else 1
    if cp.finished or (size and cp.frontier >= size):
        return done + outstanding + cp.invalid, False
    if scanned is not None:
        return max(scanned, done + outstanding + cp.invalid), False
    if cp.frontier <= 0 or cp.index <= 0 or not size:
        return None, True
    return max(done + outstanding, round(cp.index * size / cp.frontier / n)), True


def run_status(run_dir: Path, now: float | None = None) -> RunStatus:
    now = time.time() if now is None else now
    st = RunStatus(str(run_dir), RunState.NOT_STARTED, settings=settings_of(run_dir), batches=batch_rows(run_dir))
    try:
        cp = load_checkpoint(run_dir)
    except JournalError as e:
        st.state, st.why = RunState.UNREADABLE, str(e)
        return st
    results = run_dir / layout.RESULTS
    if cp is None:
        tail = _lines_after(results, 0) if results.exists() and results.stat().st_size < 64 << 20 else []
        st.done = len(tail)
        st.ok = sum(OK_MARK in ln for ln in tail)
        st.failed = st.done - st.ok
        st.why = "no checkpoint yet (the run is starting, or died before its first)"
        return st
    tail = _lines_after(results, cp.results_len)
    ok_after = sum(OK_MARK in ln for ln in tail)
    st.ok, st.failed = cp.succeeded + ok_after, cp.failed + len(tail) - ok_after
    st.done = st.ok + st.failed
    after_ids = {i for ln in tail if (i := _record_id(ln)) is not None}
    left = [r.id for r in cp.outstanding if r.id not in after_ids]
    st.outstanding, st.outstanding_ids = len(left), left[:SHOW_IDS]
    st.invalid = cp.invalid + len(_lines_after(run_dir / layout.INVALID, cp.invalid_len))
    st.input_line, st.pid = cp.line_no, cp.pid
    st.checkpoint_age_s = round(max(0.0, now - cp.time), 1)
    st.restarts = {k: int(v) for k, v in (cp.counters.get("restarts") or {}).items() if v}
    budget = cp.counters.get("budget")
    st.budget = budget if isinstance(budget, dict) and isinstance(budget.get("caps"), dict) else None
    cache = cp.counters.get("cache")
    st.cache = cache if isinstance(cache, dict) else None
    events = tail_events(run_dir)
    st.total, st.total_estimated = _total(cp, st.done, st.outstanding, _scanned_total(events))
    if cp.finished:
        st.state = RunState.FINISHED
        summary = _json_file(run_dir / layout.SUMMARY) or {}
        st.rate = summary.get("requests_per_s")
        st.exit_code = summary.get("exit_code") if isinstance(summary.get("exit_code"), int) else None
        if isinstance(summary.get("cache"), dict):
            st.cache = summary["cache"]
    elif writer_alive(run_dir, command="run"):  # a run holds its lock (a dead run never does)
        st.state = RunState.RUNNING
        st.why = _why_running(events, now)
        hist = cp.counters.get("history") or []
        if len(hist) >= 2 and float(hist[-1][0]) > float(hist[0][0]):
            st.rate = round((int(hist[-1][1]) - int(hist[0][1])) / (float(hist[-1][0]) - float(hist[0][0])), 2)
        if st.rate and st.total is not None and not _waiting(st):  # a wait for the endpoint has no ETA
            st.eta_s = round(max(0, st.total - st.done - st.invalid) / st.rate, 1)
        last = _last_sample(run_dir)
        if last.get("concurrency_limit"):
            st.in_flight, st.concurrency_limit = int(last.get("in_flight") or 0), int(last["concurrency_limit"])
            st.limit_why = str(last["limit_why"]) if last.get("limit_why") else None
        if isinstance(last.get("ceiling"), int):
            st.ceiling = int(last["ceiling"])
        if isinstance(last.get("t"), (int, float)):
            st.sampled_at = float(last["t"])
        if isinstance(last.get("endpoints"), list):
            st.endpoints = [e for e in last["endpoints"] if isinstance(e, dict)]
        if isinstance(last.get("oldest"), list):
            st.oldest = [o for o in last["oldest"] if isinstance(o, dict)]
        if st.checkpoint_age_s > 30:
            st.why = ((st.why + "; ") if st.why else "") + f"no checkpoint for {st.checkpoint_age_s:,.0f}s (stuck?)"
    else:
        st.state = RunState.STOPPED
        st.why, st.exit_code = _why_stopped(run_dir, cp, events)
        if st.why.startswith("budget:"):
            st.exit_reason = "budget"
    return st


def _last_sample(run_dir: Path) -> dict[str, Any]:
    """The last complete line of memory.jsonl (read from its tail), or {}."""
    try:
        with open(run_dir / layout.MEMORY, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - 16384))
            tail = f.read()
    except OSError:
        return {}
    for line in reversed(tail[: tail.rfind(b"\n") + 1].splitlines()):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        return obj if isinstance(obj, dict) else {}
    return {}


_EP_STATE: dict[str, str] = {
    EndpointState.DOWN: "down (ejected; probed until it answers)",
    EndpointState.OUT: "left out of this run (it failed the connection check, or refused the API key)"}


def format_run(st: RunStatus) -> str:
    head = f"{st.run_dir}: {st.state}" + (f" ({st.why})" if st.why else "")
    if st.state is RunState.UNREADABLE:
        return head
    lines = [head]
    total = ""
    if st.total is not None:
        total = f" of {'~' if st.total_estimated else ''}{st.total:,}"
        if st.total:
            total += f" ({100 * (st.done + st.invalid) / st.total:.1f}%)"
    lines.append(f"  done        {st.done:,}{total}: {st.ok:,} ok, {st.failed:,} failed, {st.invalid:,} invalid"
                 + (" (in invalid.jsonl)" if st.invalid else ""))
    if st.state is RunState.NOT_STARTED:
        return "\n".join(lines)
    lines.append(f"  outstanding {st.outstanding:,} (dispatched, no result yet); input read to line {st.input_line:,}")
    if st.outstanding_ids:
        more = f" and {st.outstanding - len(st.outstanding_ids):,} more" if st.outstanding > SHOW_IDS else ""
        lines.append(f"              {', '.join(st.outstanding_ids)}{more}")
    if st.rate is not None:
        what = "over the last minute" if st.state is RunState.RUNNING else "in the last session"
        eta = f", ETA {fmt_duration(st.eta_s)}" if st.eta_s is not None else ", ETA paused" if _waiting(st) else ""
        lines.append(f"  rate        {st.rate:,.1f} req/s {what}{eta}")
    if st.concurrency_limit is not None:
        why = f": {st.limit_why}" if st.limit_why else ""
        ceiling = f", ceiling {st.ceiling:,} ({layout.CEILING})" if st.ceiling is not None else ""
        lines.append(f"  in flight   {st.in_flight:,} requests, limit {st.concurrency_limit:,}{ceiling}{why}")
    for e in st.endpoints or ():
        what = (f"{int(e.get('in_flight') or 0):,} in flight, limit {int(e.get('limit') or 0):,}"
                if e.get("state") == EndpointState.UP else _EP_STATE.get(str(e.get("state")), str(e.get("state"))))
        lines.append(f"  endpoint    {e.get('url')}: {what}")
    for i, o in enumerate(st.oldest or ()):  # what holds up the end of the run (issue 28)
        copy = " (hedge)" if o.get("hedge") else ""  # a hedged task's second copy: the same id, on the wire twice
        lines.append(f"  {'oldest' if i == 0 else '':<11} {o.get('id')!r}{copy} at {o.get('endpoint')}: "
                     f"{fmt_duration(float(o.get('age_s') or 0))} on the wire, attempt {o.get('attempt')}, "
                     f"{int(o.get('bytes') or 0):,} bytes received")
    pid = f" (pid {st.pid})" if st.state is RunState.RUNNING else ""
    lines.append(f"  checkpoint  {st.checkpoint_age_s:,.1f}s ago{pid}")
    if st.exit_code is not None:
        lines.append(f"  exit code   {st.exit_code}")
    if st.budget:
        lines.append(f"  budget      {budget_text(st.budget)}")
    if st.cache:
        usd = saved_text(st.cache)
        lines.append(f"  cache       {int(st.cache.get('hits') or 0):,} hits, {int(st.cache.get('misses') or 0):,} "
                     "misses this session" + (f"; {usd}" if usd else ""))
    if st.restarts:
        lines.append("  restarts    " + ", ".join(f"{k} {v}" for k, v in st.restarts.items()))
    if st.settings:  # those that differ from the defaults (issue 44); status --json has them all
        changed = [f"{k}={v}" for k, v in st.settings.items()
                   if v is not None and (k not in SHOWN_DEFAULTS or v != SHOWN_DEFAULTS[k])]
        lines.append("  settings    " + (", ".join(changed) if changed else "the defaults") + " (all: --json)")
    shown = st.batches
    if len(shown) > BATCH_ROWS:  # many chunks: the count by state, then the open ones and the newest
        by = Counter(str(b["status"] or b["step"]) for b in st.batches)
        lines.append(f"  {'batches':<11} {len(st.batches):,}: " + ", ".join(f"{v:,} {k}" for k, v in by.most_common()))
        open_rows = [b for b in st.batches if b["step"] not in ("done", "failed")][-BATCH_ROWS:]
        shown = open_rows or st.batches[-BATCH_ROWS:]
    for i, b in enumerate(shown):
        c = b["counts"] or {}
        when = "".join(f", {w} {_clock(float(b[w + '_at']))}" for w in ("created", "expires") if b[w + "_at"])
        label = "batches" if i == 0 and shown is st.batches else ""
        if "succeeded" in c:  # an Anthropic Message Batch's counts, in its words
            got = ", ".join(f"{c.get(k, 0)} {k}" for k in ("succeeded", "errored", "expired", "canceled")
                            if c.get(k) or k in ("succeeded", "errored"))
        else:
            got = f"{c.get('completed', 0)} completed, {c.get('failed', 0)} failed"
        lines.append(f"  {label:<11} chunk {b['chunk']} {b['batch_id'] or '(not created)'}: "
                     f"{b['status'] or b['step']} ({got} of {c.get('total') or b['tasks']}{when})"
                     + (f": {b['reason']}" if b["reason"] else ""))
    return "\n".join(lines)


BATCH_ROWS = 10  # chunks shown one a line; more are counted by state


def batch_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Each chunk of a --batch-api run: its batch id, the provider's state and counts, created and expires."""
    return [{"chunk": c.chunk, "batch_id": c.batch_id, "step": c.step.value, "status": c.status,
             "counts": c.counts, "tasks": len(c.keys), "created_at": c.created_at, "expires_at": c.expires_at,
             "reason": c.reason} for c in chunks_of(run_dir).values()]


# ----- the parent of shard run directories (`--shard`: TASKS.run/shard-K-of-N/) -----

def find_shards(parent: Path) -> dict[int, dict[int, Path]]:
    """{N: {K: directory}} of the shard directories in `parent`."""
    out: dict[int, dict[int, Path]] = {}
    try:
        entries = list(parent.iterdir())
    except OSError:
        return out
    for p in entries:
        kn = parse_shard_dir(p.name)
        if kn is not None and p.is_dir():
            out.setdefault(kn[1], {})[kn[0]] = p
    return out


def shards_status(parent: Path) -> dict[str, Any]:
    """{"parent", "groups": [{"shards": N, "rows": [...], "total": {...}, "missing": [...]}]}: one group per
    shard count found (normally one)."""
    groups = []
    for n, found in sorted(find_shards(parent).items()):
        rows = []
        for k in sorted(found):
            st = run_status(found[k]).as_dict()
            st["shard"] = shard_dir_name(k, n)
            rows.append(st)
        running = [r for r in rows if r["state"] == RunState.RUNNING]
        total: dict[str, Any] = {
            "done": sum(r["done"] for r in rows), "ok": sum(r["ok"] for r in rows),
            "failed": sum(r["failed"] for r in rows), "invalid": sum(r["invalid"] for r in rows),
            "outstanding": sum(r["outstanding"] for r in rows),
            "rate": round(sum(r["rate"] or 0.0 for r in running), 2) if running else None,
            "finished": sum(r["state"] == RunState.FINISHED for r in rows), "running": len(running),
        }
        figs = [f for r in rows if (f := budget_figures(r.get("budget"))) is not None]
        if figs and len({f[0] for f in figs}) == 1:  # with caps (issue 30): the shards' spend and caps summed
            total["budget"] = {"kind": figs[0][0], "spent": round(sum(f[1] for f in figs), 6),
                               "cap": round(sum(f[2] for f in figs), 6), "shards_capped": len(figs)}
        known = [r["total"] for r in rows]
        if len(rows) == n and all(t is not None for t in known):
            total["total"] = sum(known)
            total["total_estimated"] = any(r["total_estimated"] for r in rows)
        groups.append({"shards": n, "rows": rows, "total": total,
                       "missing": [shard_dir_name(k, n) for k in range(n) if k not in found]})
    return {"parent": str(parent), "groups": groups}


def budget_figures(b: dict[str, Any] | None) -> tuple[str, float, float] | None:
    """A budget's first cap (cost, then completion tokens, then total tokens) as (kind, spent, cap), or None."""
    if not isinstance(b, dict) or not isinstance(b.get("caps"), dict):
        return None
    caps, spent = b["caps"], b.get("spent") or {}
    if caps.get("cost") is not None:
        return "usd", float(spent.get("cost_usd") or 0.0), float(caps["cost"])
    if caps.get("completion_tokens") is not None:
        return "completion", float(spent.get("completion_tokens") or 0), float(caps["completion_tokens"])
    if caps.get("total_tokens") is not None:
        return "tokens", float(int(spent.get("prompt_tokens") or 0) + int(spent.get("completion_tokens") or 0)), \
            float(caps["total_tokens"])
    return None


def budget_cell(fig: tuple[str, float, float] | None) -> str:
    """The shard table's budget column: "$1.20/$2.50", "12,000/50,000 completion tokens", or "-"."""
    if fig is None:
        return "-"
    kind, spent, cap = fig
    if kind == "usd":
        return f"${spent:,.2f}/${cap:,.2f}"
    return f"{spent:,.0f}/{cap:,.0f}" + (" compl." if kind == "completion" else " tok.")


def format_shards(s: dict[str, Any]) -> str:
    lines = []
    for g in s["groups"]:
        n = g["shards"]
        t = g["total"]
        state = "finished" if t["finished"] == n else f"{t['finished']} of {n} shards finished, {t['running']} running"
        lines.append(f"{s['parent']}: {n} shards, {state}")
        # with caps (issue 30): each shard's spend against its own cap (its share, or its own per-shard cap)
        figs = [budget_figures(r.get("budget")) for r in g["rows"]]
        kinds = {f[0] for f in figs if f is not None}
        capped = bool(kinds)
        bcol = f" {'budget':>22}" if capped else ""
        lines.append(f"  {'shard':<16} {'state':<12} {'done':>10} {'failed':>8} {'req/s':>8}{bcol} {'checkpoint':>11}"
                     "  why")
        for r, fig in zip(g["rows"], figs, strict=True):
            rate = "-" if r["rate"] is None else f"{r['rate']:,.1f}"
            age = "-" if r["checkpoint_age_s"] is None else f"{r['checkpoint_age_s']:,.0f}s ago"
            cell = f" {budget_cell(fig):>22}" if capped else ""
            lines.append(f"  {r['shard']:<16} {r['state']:<12} {r['done']:>10,} {r['failed']:>8,} {rate:>8}{cell} "
                         f"{age:>11}  {r['why'] or ''}".rstrip())
        rate = "-" if t["rate"] is None else f"{t['rate']:,.1f}"
        tot = f" of {'~' if t.get('total_estimated') else ''}{t['total']:,}" if t.get("total") is not None else ""
        cell = ""
        if capped:  # the shards' sums, when they count one kind of cap
            known = [f for f in figs if f is not None]
            whole = (known[0][0], sum(f[1] for f in known), sum(f[2] for f in known)) if len(kinds) == 1 else None
            cell = f" {budget_cell(whole):>22}"
        lines.append(f"  {'total':<16} {'':<12} {t['done']:>10,} {t['failed']:>8,} {rate:>8}{cell}"
                     f"   {t['ok']:,} ok, {t['invalid']:,} invalid, {t['outstanding']:,} outstanding{tot}")
        if g["missing"]:
            lines.append(f"  missing     {len(g['missing'])} of {n}: {', '.join(g['missing'])} (not started)")
    if len(s["groups"]) > 1:
        lines.append("  note: shard directories for more than one shard count N are here")
    return "\n".join(lines)


def status(path: Path) -> dict[str, Any]:
    """The status of a run directory, or of a parent of shard directories (`{"shards": ...}`)."""
    if not is_run_dir(path) and find_shards(path):
        return shards_status(path)
    return run_status(path).as_dict()


def status_text(path: Path) -> str:
    if not is_run_dir(path):
        if find_shards(path):
            return format_shards(shards_status(path))
        if not os.path.exists(path / layout.RUN_JSON):
            return f"{path}: not a run directory (no checkpoint.json, results.jsonl or shard-K-of-N/ in it)"
    return format_run(run_status(path))
