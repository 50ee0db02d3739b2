"""Run statistics in constant memory: counters and a log-bucket latency histogram."""

from __future__ import annotations

import collections
import math
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from evalsup.ipc.messages import ResultMeta
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
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ring_results: int = 0  # results whose line came through a worker's shared-memory ring, not the pipe
    bodies_checked: int = 0  # large answers checked to be JSON without being built (worker.bodies)
    scores: ScoreStats = field(default_factory=ScoreStats)
    by_endpoint: dict[int, int] = field(default_factory=dict)  # results this session by endpoint (issue 21)
    # (unix time, done) at each of the last checkpoints of this session: `evalsup status` takes its rate from it
    history: collections.deque[tuple[float, int]] = field(default_factory=lambda: collections.deque(maxlen=31))

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    def on_result(self, meta: ResultMeta) -> None:
        """Count one result written (its RESULT frame's meta, see ipc.messages)."""
        if meta["ok"]:
            self.succeeded += 1
        else:
            self.failed += 1
        self.session_done += 1
        self.latency.add(float(meta["lat"]))
        self.retries += int(meta["rt"])
        self.stalled += int(meta.get("st", 0))
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
        ep = meta.get("ep", 0)
        self.by_endpoint[ep] = self.by_endpoint.get(ep, 0) + 1
        self.prompt_tokens += int(meta.get("pt") or 0)
        self.completion_tokens += int(meta.get("ct") or 0)

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
