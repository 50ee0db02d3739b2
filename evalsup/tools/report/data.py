"""What the report reads from a run directory, streamed and thinned: summary.json, run.json's settings, the
memory samples (memory.jsonl), the events (events.jsonl: sessions, recycles and restarts, throttle and
endpoint-down periods, the `progress` counts written at each checkpoint) and one pass over results.jsonl."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalsup.common.states import EndpointState
from evalsup.rundir import layout
from evalsup.rundir.results_file import json_file as _json_file
from evalsup.tools.report.scan import ResultScan, jsonl, scan_results

MAX_POINTS = 2000
MAX_MARKERS = 500
MAX_SESSIONS = 200


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
    limit: int = 0  # requests the workers could have in flight (their adaptive limits summed; 0: not recorded)
    wire: int = 0  # requests on the wire
    eps: dict[str, int] = field(default_factory=dict)  # several endpoints: URL -> its limit (0 while not up)


@dataclass
class Progress:
    """The cumulative counts of one `progress` event (one a checkpoint) of a session."""
    t: float
    session: int
    done: int
    tokens: int  # prompt + completion, this session
    completion_tokens: int
    errors: dict[str, int]  # by code, this session


@dataclass
class Session:
    start: float
    end: float | None = None  # None: no `end` event (killed), see last_seen
    last_seen: float = 0.0
    first_done: int | None = None
    last_done: int | None = None
    resumed: bool = False
    finished: bool = False
    stopped: str | None = None
    code: int | None = None

    @property
    def stop(self) -> float:
        return self.end if self.end is not None else max(self.last_seen, self.start)

    @property
    def tasks(self) -> int:
        return max(0, (self.last_done or 0) - (self.first_done or 0))


@dataclass
class RunData:
    summary: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    samples: list[Sample] = field(default_factory=list)
    n_samples: int = 0
    limit: int | None = None
    high: int | None = None
    low: int | None = None
    throttled: list[tuple[float, float]] = field(default_factory=list)
    down: list[tuple[float, float]] = field(default_factory=list)  # circuit breaker open
    markers: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, label)
    sessions: list[Session] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    results: ResultScan = field(default_factory=ResultScan)
    # `evalsup score`'s records (results.scored.jsonl), when the run was scored again: shown beside the run's
    rescored: ResultScan | None = None
    rescored_by: str | None = None  # what scored them again (scores.json's scorers), for the table
    t0: float = 0.0
    t1: float = 1.0
    endpoints: list[str] = field(default_factory=list)  # several endpoints: their URLs, in the order first seen

    def spans(self) -> list[tuple[float, float]]:
        """The periods the run was running: its sessions, or (no `start` event) first to last time seen."""
        if self.sessions:
            return [(s.start, s.stop) for s in self.sessions]
        return [(self.t0, self.t1)]


def intervals(flags: list[tuple[float, bool]], end: float) -> list[tuple[float, float]]:
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


def _memory(d: RunData, run_dir: Path) -> list[tuple[float, bool]]:
    thin = Thinner(MAX_POINTS - 1)
    paused: list[tuple[float, bool]] = []
    was_paused = False
    for rec in jsonl(run_dir / layout.MEMORY):
        t = float(rec.get("t", 0.0))
        workers = {k: int(v) for k, v in (rec.get("workers_rss") or {}).items()}
        total = int(rec.get("supervisor_rss") or 0) + sum(workers.values())
        eps = {str(e.get("url")): int(e.get("limit") or 0) if e.get("state") == EndpointState.UP else 0
               for e in rec.get("endpoints") or () if isinstance(e, dict)}
        d.endpoints += [u for u in eps if u not in d.endpoints]
        thin.add(Sample(t, total, int(rec.get("working_set") or 0), int(rec.get("done") or 0), workers,
                        int(rec.get("concurrency_limit") or 0), int(rec.get("in_flight") or 0), eps))
        d.n_samples += 1
        for name in ("limit", "high", "low"):
            if rec.get(name):
                setattr(d, name, int(rec[name]))
        if bool(rec.get("paused")) != was_paused:
            was_paused = not was_paused
            paused.append((t, was_paused))
    d.samples = thin.result()
    return paused


def _events(d: RunData, run_dir: Path, times: list[float]) -> list[tuple[float, bool]]:
    marks = Thinner(MAX_MARKERS)
    prog = Thinner(MAX_POINTS)
    breaker: list[tuple[float, bool]] = []
    sessions: list[Session] = []
    for ev in jsonl(run_dir / layout.EVENTS):
        t, kind = float(ev.get("t", 0.0)), str(ev.get("event"))
        times.append(t)
        if kind == "start":
            if len(sessions) >= MAX_SESSIONS:  # keep the first and the latest ones
                del sessions[MAX_SESSIONS // 2]
            sessions.append(Session(t, last_seen=t, resumed=bool(ev.get("resumed"))))
            continue  # a resume shows as the end of a gap on the time charts
        cur = sessions[-1] if sessions else None
        if cur is not None:
            cur.last_seen = max(cur.last_seen, t)
        if kind == "progress" and cur is not None:
            done = int(ev.get("done") or 0)
            cur.first_done = done if cur.first_done is None else cur.first_done
            cur.last_done = done
            ct = int(ev.get("completion_tokens") or 0)
            prog.add(Progress(t, len(sessions) - 1, done, int(ev.get("prompt_tokens") or 0) + ct, ct,
                              {str(k): int(v) for k, v in (ev.get("errors") or {}).items()}))
        elif kind == "end" and cur is not None:
            cur.end, cur.finished, cur.code = t, bool(ev.get("finished")), ev.get("code")
            cur.stopped = ev.get("stopped")
            if ev.get("done") is not None:
                cur.last_done = int(ev["done"])
        elif kind in ("recycle", "restart"):
            marks.add((t, kind, f"{kind} ({ev.get('cause')}) worker {ev.get('pid')}"))
        elif kind in ("breaker_open", "breaker_close"):
            breaker.append((t, kind == "breaker_open"))
    d.markers = marks.result()
    d.progress = prog.result()
    d.sessions = sessions
    return breaker


def load(run_dir: Path, group_by: str | None = None) -> RunData:
    """Everything the report shows. ``group_by`` (metadata.KEY): scores per group; default: the run's own
    --group-by (summary.json's)."""
    d = RunData(summary=_json_file(run_dir / layout.SUMMARY))
    if group_by is None and d.summary is not None and isinstance(d.summary.get("groups"), dict):
        by = d.summary["groups"].get("by")
        group_by = by if isinstance(by, str) else None
    run = _json_file(run_dir / layout.RUN_JSON)
    if run is not None and isinstance(run.get("settings"), dict):
        d.settings = run["settings"]
    paused = _memory(d, run_dir)
    times = [s.t for s in d.samples[:1] + d.samples[-1:]]
    breaker = _events(d, run_dir, times)
    if times:
        d.t0, d.t1 = min(times), max(times)
        d.t1 = max(d.t1, d.t0 + 1.0)
    # a session without an `end` (killed) lasted until the last sample or event seen before the next one began
    for i, s in enumerate(d.sessions):
        nxt = d.sessions[i + 1].start if i + 1 < len(d.sessions) else float("inf")
        seen = [x.t for x in d.samples if s.start <= x.t < nxt]
        if seen:
            s.last_seen = max(s.last_seen, max(seen))
        if s.first_done is None:  # no progress events (an older run): the memory samples' counts
            dones = [x.done for x in d.samples if s.start <= x.t < nxt]
            if dones:
                s.first_done, s.last_done = dones[0], s.last_done if s.last_done is not None else dones[-1]
    d.throttled = intervals(paused, d.t1)
    d.down = intervals(breaker, d.t1)
    d.results = scan_results(run_dir / layout.RESULTS, group_by)
    if (run_dir / layout.SCORED).is_file():  # every set of scores the run has, side by side (issue 43)
        d.rescored = scan_results(run_dir / layout.SCORED, group_by)
        scores = _json_file(run_dir / layout.SCORES)
        judge = scores.get("judge_usage") if scores is not None else None
        if isinstance(judge, dict) and judge.get("requests"):
            d.rescored_by = f"evalsup score (the judge asked {int(judge['requests']):,} times)"
    return d
