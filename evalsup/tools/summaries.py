"""The shards' own figures summed for a merged summary (`evalsup merge`, `run --ray`): each shard's summary.json
holds its scores, groups, spend, judge usage, structured-output and cache counts; this adds them up.

What is summed: per scorer (overall and per group) the count, errors and unscored, and the sum of the scores
(each shard's ``count x mean``; an integer for a 0/1 scorer), from which the mean, accuracy and 95 % Wilson
interval are computed again (``scoring.scorers.ScoreStats``, as a run computes them); per group its tasks and
failures; ``budget``: each shard's share of the caps and what it spent (the shards' reservations at their end
are not kept); ``judge_usage``, ``structured`` and ``cache`` (hits, misses, written, pruned, tokens and dollars
saved) count by count. A shard's summary.json is its last session's: figures a resumed shard gives for that
session only (``scores_this_session_only``) stay so, and the merged summary says so too. Nothing else (latency
percentiles, workers, memory) can be summed: each shard's own summary.json keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from evalsup.scoring.groups import Group, GroupedScores
from evalsup.scoring.scorers import ScoreStats


def _num(v: Any) -> float | None:
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def add_scores(dest: ScoreStats, scores: Any) -> None:
    """Add a summary.json ``scores`` object (``ScoreStats.summary``'s shape) to ``dest``."""
    if not isinstance(scores, dict):
        return
    for name, d in scores.items():
        if not isinstance(d, dict):
            continue
        n = int(_num(d.get("count")) or 0)
        if n:
            mean = _num(d.get("mean")) or 0.0
            binary = "accuracy" in d  # a 0/1 scorer: its sum is a whole number of correct answers
            total = float(round(mean * n)) if binary else mean * n
            dest.n[name] = dest.n.get(name, 0) + n
            dest.total[name] = dest.total.get(name, 0.0) + total
            dest.binary[name] = dest.binary.get(name, True) and binary
        for key, into in (("errors", dest.errors), ("unscored", dest.unscored)):
            c = int(_num(d.get(key)) or 0)
            if c:
                into[name] = into.get(name, 0) + c


def _add_counts(dest: dict[str, Any], src: Any) -> None:
    """Numbers added key by key, nested objects likewise, lists joined; a key a shard gives as None (a cap not
    set, a figure not known) stays None."""
    if not isinstance(src, dict):
        return
    for k, v in src.items():
        if isinstance(v, dict):
            sub = dest.setdefault(k, {})
            if isinstance(sub, dict):
                _add_counts(sub, v)
        elif isinstance(v, list):
            have = dest.setdefault(k, [])
            if isinstance(have, list):
                have.extend(x for x in v if x not in have)
        elif _num(v) is None:
            dest[k] = None
        elif k not in dest:
            dest[k] = v
        elif _num(dest[k]) is not None:
            dest[k] += v


def combined(summaries: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The figures of the shards' summary.json (those present) summed, as summary.json's keys."""
    scores = ScoreStats()
    groups: GroupedScores | None = None
    budget: dict[str, Any] = {}
    judge: dict[str, Any] = {}
    structured: dict[str, Any] = {}
    cache: dict[str, Any] = {}
    prices: dict[str, Any] = {"sources": [], "by_model": {}}  # which source priced each model (issue 40)
    session_only = False
    for s in summaries:
        add_scores(scores, s.get("scores"))
        g = s.get("groups")
        if isinstance(g, dict) and isinstance(g.get("groups"), dict):
            if groups is None:
                groups = GroupedScores(str(g.get("by")))
            for name, gd in g["groups"].items():
                one = Group()
                one.tasks, one.failed = int(gd.get("tasks") or 0), int(gd.get("failed") or 0)
                add_scores(one.scores, gd.get("scores"))
                groups.groups.setdefault(str(name), Group()).merge(one)
                groups.whole.merge(one)
            groups.overflowed += int((g.get("overflowed") or {}).get("tasks") or 0)
        b = s.get("budget")
        if isinstance(b, dict):
            _add_counts(budget, {k: b.get(k) for k in ("caps", "spent", "unpriced_results") if k in b})
        _add_counts(judge, s.get("judge_usage"))
        _add_counts(structured, s.get("structured"))
        _add_counts(cache, s.get("cache"))
        p = s.get("prices")
        if isinstance(p, dict):
            prices["sources"] += [x for x in p.get("sources") or [] if x not in prices["sources"]]
            prices["by_model"].update(p.get("by_model") or {})
        session_only = session_only or bool(s.get("scores_this_session_only"))
    out: dict[str, Any] = {}
    if scores:
        out["scores"] = scores.summary()
    if groups:
        out["groups"] = groups.summary()
    if session_only and (scores or groups):
        out["scores_this_session_only"] = True
    if prices["sources"]:
        out["prices"] = prices
    for key, v in (("budget", budget), ("judge_usage", judge), ("structured", structured), ("cache", cache)):
        if v:
            out[key] = v
    return out
