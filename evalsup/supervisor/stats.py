"""Run statistics in constant memory: counters and a log-bucket latency histogram."""

from __future__ import annotations

import collections
import math
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from evalsup.ipc.messages import ResultMeta
from evalsup.scoring.groups import GroupedScores
from evalsup.scoring.scorers import ScoreStats
from evalsup.supervisor.policies import RecycleCause

_RATIO = 1.02  # 2 % bucket width
_LOW = 1e-4  # seconds
_BUCKETS = int(math.log(1e5 / _LOW, _RATIO)) + 2


class Histogram:
    """Latencies from 0.1 ms to a day in 2 % buckets: about 8 KiB whatever the number of tasks."""

    def __init__(self) -> None:
        self.counts = array("Q", bytes(8 * _BUCKETS))
        self.n = 0
        self.total = 0.0

    def add(self, x: float) -> None:
        i = 0 if x <= _LOW else min(_BUCKETS - 1, int(math.log(x / _LOW, _RATIO)) + 1)
        self.counts[i] += 1
        self.n += 1
        self.total += x

    def quantile(self, q: float) -> float | None:
        if self.n == 0:
            return None
        rank = q * (self.n - 1)
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen > rank:
                return _LOW if i == 0 else _LOW * _RATIO ** (i - 0.5)
        return None

    def summary(self) -> dict[str, float | None]:
        return {k: (round(v, 4) if (v := self.quantile(q)) is not None else None)
                for k, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}


POISONED_KEPT = 1000  # ids of tasks written as worker_crashed kept for the summary: memory bounded in N


@dataclass
class RunStats:
    succeeded: int = 0  # records in results.jsonl, all sessions
    failed: int = 0
    invalid: int = 0
    session_done: int = 0  # records written by this session
    latency: Histogram = field(default_factory=Histogram)
    restarts: dict[str, int] = field(default_factory=lambda: {"crashed": 0, "hung": 0})
    recycles: dict[str, int] = field(default_factory=lambda: {str(c): 0 for c in RecycleCause})
    poisoned: list[str] = field(default_factory=list)
    peak_rss: dict[str, int] = field(default_factory=lambda: {"supervisor": 0, "worker_max": 0, "total": 0})
    ttft: Histogram = field(default_factory=Histogram)
    errors: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    stalled: int = 0  # attempts abandoned on a STALL (timeout_stall) and retried, this session (issue 28)
    hedged: int = 0  # tasks whose request got a second copy (--hedge), this session (issue 28)
    hedge_wins: int = 0  # of them, those whose record is the second copy's answer
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # the judge's tokens (--scorer judge), counted apart: never the answers' (summary.json judge_usage)
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    judged: int = 0  # results the judge was asked about
    ring_results: int = 0  # results whose line came through a worker's shared-memory ring, not the pipe
    bodies_checked: int = 0  # large answers checked to be JSON without being built (worker.bodies)
    scores: ScoreStats = field(default_factory=ScoreStats)
    by_endpoint: dict[int, int] = field(default_factory=dict)  # results this session by endpoint (issue 21)
    groups: GroupedScores | None = None  # --group-by: tasks, failures and scores per group (bounded)
    reasks: int = 0  # answers asked again for their JSON schema (--response-schema), this session
    schema_invalid: int = 0  # records still failing their schema after the re-asks, this session
    # the cache (issue 30), this session: answers from it, requests sent with the cache on, the tokens of the
    # hits by model (what they would have cost)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_unusable: int = 0  # of the misses: an entry was there but failed an answer's checks (issue 39)
    unusable_said: bool = False
    saved_tokens: dict[str, list[int]] = field(default_factory=dict)
    # (unix time, done) at each of the last checkpoints of this session: `evalsup status` takes its rate from it
    history: collections.deque[tuple[float, int]] = field(default_factory=lambda: collections.deque(maxlen=31))

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    def on_result(self, meta: ResultMeta) -> str | None:
        """Count one result written (its RESULT frame's meta, see ipc.messages). Returns a warning to log once:
        the groups of --group-by are full, the tasks of new ones go to "(other)"."""
        if meta["ok"]:
            self.succeeded += 1
        else:
            self.failed += 1
        self.session_done += 1
        cached = meta.get("ca")
        if cached == "h":  # answered from the cache: no request, no latency, no endpoint
            self.cache_hits += 1
            self._saved(meta)
        else:
            if cached == "m":
                self.cache_misses += 1
                if "cu" in meta:
                    self.cache_unusable += 1
            self.latency.add(float(meta["lat"]))
            ep = meta.get("ep", 0)
            self.by_endpoint[ep] = self.by_endpoint.get(ep, 0) + 1
        self.retries += int(meta["rt"])
        self.stalled += int(meta.get("st", 0))
        hedge = meta.get("hg")
        if hedge:
            self.hedged += 1
            self.hedge_wins += hedge == 2
        code = meta.get("ec")
        if code:
            self.errors[code] = self.errors.get(code, 0) + 1
        ttft = meta.get("ttft")
        if ttft is not None:
            self.ttft.add(float(ttft))
        scores = meta.get("sc")
        if scores or "us" in meta:
            self.scores.add(scores or {}, meta.get("us", ()))
        if "chk" in meta:
            self.bodies_checked += 1
        # the tokens of every request the task made: a re-asked answer's earlier ones too (rpt, rct)
        self.prompt_tokens += int(meta.get("pt") or 0) + int(meta.get("rpt") or 0)
        self.completion_tokens += int(meta.get("ct") or 0) + int(meta.get("rct") or 0)
        if "jpt" in meta or "jct" in meta:
            self.judged += 1
            self.judge_prompt_tokens += int(meta.get("jpt") or 0)
            self.judge_completion_tokens += int(meta.get("jct") or 0)
        self.reasks += int(meta.get("rk", 0))
        if code == "schema_invalid":
            self.schema_invalid += 1
        group = meta.get("g")
        if group is not None and self.groups is not None and self.groups.add(
                str(group), bool(meta["ok"]), scores, meta.get("us", ())):
            return self.groups.overflow_note()
        if "cu" in meta and not self.unusable_said:  # the first this session: said once, the rest counted
            self.unusable_said = True
            return (f"cache entries unusable (the first: {str(meta['cu'])[:200]}): each is a miss, sent as usual, "
                    "and its answer replaces the entry; counted in the summary (cache.unusable)")
        return None

    def _saved(self, meta: ResultMeta) -> None:
        """A hit's tokens, by model (a run has few models; more than 100 are counted under "other")."""
        model = str(meta.get("cm") or "?")
        if model not in self.saved_tokens and len(self.saved_tokens) >= 100:
            model = "other"
        t = self.saved_tokens.setdefault(model, [0, 0])
        t[0] += int(meta.get("pt") or 0)
        t[1] += int(meta.get("ct") or 0)

    def on_poisoned(self, task_id: str) -> None:
        self.failed += 1
        self.session_done += 1
        if len(self.poisoned) < POISONED_KEPT:  # the first ones name them; their records say the rest
            self.poisoned.append(task_id)

    def on_memory(self, supervisor_rss: int, worker_rss: list[int]) -> None:
        self.peak_rss["worker_max"] = max(self.peak_rss["worker_max"], *worker_rss, 0)
        self.peak_rss["supervisor"] = max(self.peak_rss["supervisor"], supervisor_rss)
        self.peak_rss["total"] = max(self.peak_rss["total"], supervisor_rss + sum(worker_rss))

    def counters(self) -> dict[str, Any]:
        """What the checkpoint keeps: what carries over a resume, and (not carried over) the recent history of
        the done count, sampled at each call, that `evalsup status` computes a rate and an ETA from."""
        self.history.append((round(time.time(), 3), self.done))
        return {"restarts": self.restarts, "recycles": self.recycles, "poisoned": self.poisoned[:POISONED_KEPT],
                "history": list(self.history)}

    def progress(self) -> dict[str, Any]:
        """The cumulative figures of the `progress` event (events.jsonl, one at each checkpoint): the report
        draws tokens/s and errors by code over time from the differences between two of them."""
        return {"done": self.done, "ok": self.succeeded, "failed": self.failed, "session_done": self.session_done,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "retries": self.retries, "errors": dict(self.errors)}

    def restore(self, counters: dict[str, Any]) -> None:
        for k, v in counters.get("restarts", {}).items():
            self.restarts[k] = self.restarts.get(k, 0) + int(v)
        for k, v in counters.get("recycles", {}).items():
            self.recycles[k] = self.recycles.get(k, 0) + int(v)
        self.poisoned.extend(counters.get("poisoned", [])[: POISONED_KEPT - len(self.poisoned)])
