"""One streamed pass over results.jsonl, in memory that does not grow with the run: log-binned histograms
(latency, TTFT, inter-token latency, output tokens), finish_reason counts, the first failed tasks, the
slowest tasks (a heap of K), errors by code."""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.scoring.groups import GroupedScores
from evalsup.scoring.scorers import ScoreStats
from evalsup.tasks.group_key import group_of, parse_group_by

MAX_FAILED_ROWS = 100
SLOWEST = 20
MAX_KEYS = 40  # distinct finish_reason values / error codes kept; the rest are "other"
MESSAGE_CHARS = 240


class ReportError(Exception):
    """The report cannot be made; the message says why, naming the file."""



def jsonl(path: Path) -> Iterator[dict[str, Any]]:
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


class LogHist:
    """Counts in log-spaced bins, `per_decade` a decade from 10**lo to 10**hi; values <= 0 counted apart."""

    def __init__(self, lo: int, hi: int, per_decade: int = 10) -> None:
        self.lo, self.hi, self.per_decade = lo, hi, per_decade
        self.counts = [0] * ((hi - lo) * per_decade)
        self.zero = 0
        self.n = 0

    def add(self, v: float) -> None:
        self.n += 1
        if v <= 0:
            self.zero += 1
            return
        i = int((math.log10(v) - self.lo) * self.per_decade)
        self.counts[min(max(i, 0), len(self.counts) - 1)] += 1

    def edge(self, i: float) -> float:
        """Bin edge i as log10 of the value."""
        return self.lo + i / self.per_decade

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        rank, seen = q * (self.n - 1), self.zero
        if seen > rank:
            return 0.0
        for i, c in enumerate(self.counts):
            seen += c
            if seen > rank:
                return float(10 ** self.edge(i + 0.5))
        return None

    def percentiles(self) -> dict[str, float | None]:
        return {k: self.quantile(q) for k, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _count(d: dict[str, int], key: str) -> None:
    if key not in d and len(d) >= MAX_KEYS:
        key = "other"
    d[key] = d.get(key, 0) + 1


@dataclass
class ResultScan:
    records: int = 0
    ok: int = 0
    failed: int = 0
    lat_ok: LogHist = field(default_factory=lambda: LogHist(-3, 4, 20))
    lat_failed: LogHist = field(default_factory=lambda: LogHist(-3, 4, 20))
    ttft: LogHist = field(default_factory=lambda: LogHist(-3, 4, 20))
    itl: LogHist = field(default_factory=lambda: LogHist(-5, 2, 20))
    out_tokens: LogHist = field(default_factory=lambda: LogHist(0, 7))
    finish: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    failed_rows: list[dict[str, Any]] = field(default_factory=list)  # the first MAX_FAILED_ROWS
    _slow: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)  # a min-heap of SLOWEST
    # the scores of every record (all sessions), and per group with a group_by (at most MAX_GROUPS groups)
    scores: ScoreStats = field(default_factory=ScoreStats)
    groups: GroupedScores | None = None
    group_path: tuple[str, ...] = ()
    _scored: int = 0  # records with a "scores" object (scored, or left unscored, by the run's scorers)
    _scored_in: dict[str, int] = field(default_factory=dict)  # the same by group

    def add(self, rec: dict[str, Any]) -> None:
        self.records += 1
        self._score(rec)
        tid = str(rec.get("custom_id", rec.get("id")))
        metrics: dict[str, Any] = _dict(rec.get("metrics"))
        err = rec.get("error") if isinstance(rec.get("error"), dict) else None
        lat = metrics.get("latency_s")
        response = _dict(rec.get("response"))
        body = _dict(response.get("body"))
        ct = _dict(body.get("usage")).get("completion_tokens")
        if err is None:
            self.ok += 1
            choices = body.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                _count(self.finish, str(choices[0].get("finish_reason")))
            if isinstance(ct, int):
                self.out_tokens.add(ct)
        else:
            self.failed += 1
            code = str(err.get("code"))
            _count(self.errors, code)
            if len(self.failed_rows) < MAX_FAILED_ROWS:
                self.failed_rows.append({"id": tid, "code": code, "status": response.get("status_code"),
                                         "message": str(err.get("message") or "")[:MESSAGE_CHARS],
                                         "attempts": metrics.get("attempts")})
        for key, hist in (("ttft_s", self.ttft), ("itl_s", self.itl)):
            v = metrics.get(key)
            if isinstance(v, int | float):
                hist.add(float(v))
        if isinstance(lat, int | float):
            (self.lat_ok if err is None else self.lat_failed).add(float(lat))
            if len(self._slow) < SLOWEST or lat > self._slow[0][0]:
                row = {"id": tid, "latency_s": float(lat), "attempts": metrics.get("attempts"),
                       "ttft_s": metrics.get("ttft_s"), "completion_tokens": ct,
                       "outcome": "ok" if err is None else str(err.get("code"))}
                item = (float(lat), self.records, row)
                if len(self._slow) < SLOWEST:
                    heapq.heappush(self._slow, item)
                else:
                    heapq.heapreplace(self._slow, item)

    def _score(self, rec: dict[str, Any]) -> None:
        scores = rec.get("scores")
        scores = {str(k): (float(v) if isinstance(v, int | float) else None) for k, v in scores.items()} \
            if isinstance(scores, dict) else None
        if scores is not None:
            self._scored += 1
            self.scores.add(scores)
        if self.groups is not None:
            group = group_of(rec.get("metadata"), self.group_path)
            self.groups.add(group, rec.get("error") is None, scores)
            if scores is not None:
                self._scored_in[group] = self._scored_in.get(group, 0) + 1

    def finish_scores(self) -> None:
        """A record leaves a scorer's name out of its scores when it was unscored by it: count those."""
        _unscored(self.scores, self._scored)
        if self.groups is not None:
            for name, g in self.groups.groups.items():
                _unscored(g.scores, self._scored_in.get(name, 0))

    def slowest(self) -> list[dict[str, Any]]:
        return [row for _, _, row in sorted(self._slow, key=lambda x: -x[0])]


def _unscored(st: ScoreStats, scored: int) -> None:
    for k in set(st.n) | set(st.errors):
        st.unscored[k] = max(0, scored - st.n.get(k, 0) - st.errors.get(k, 0))


def scan_results(path: Path, group_by: str | None = None) -> ResultScan:
    """Every record of results.jsonl, checked: a damaged line is a one-line error naming results.jsonl:LINE.
    ``group_by`` (metadata.KEY): the scores per group too."""
    from evalsup.rundir.checkpoint import RunDirDamaged
    from evalsup.rundir.layout import RESULTS
    from evalsup.rundir.results_file import records

    s = ResultScan(groups=GroupedScores(group_by) if group_by else None,
                   group_path=parse_group_by(group_by) if group_by else ())
    if not path.exists():
        return s
    try:
        for rec in records(path, once=path.name == RESULTS):  # a run's results: each id counted once
            s.add(rec)
    except RunDirDamaged as e:
        raise ReportError(str(e)) from None
    s.finish_scores()
    return s
