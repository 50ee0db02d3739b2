"""The memory control loop: sample, decide, record.

Every interval: per-worker RSS and the container's working set, limit, events and PSI -> a pressure
level -> throttle with hysteresis (PAUSE above the high mark, RESUME below the low mark), an in-flight
cap from the observed response sizes, and a recycle decision per worker. The container's figures
decide how much; per-worker RSS decides who. Every sample is appended to memory.jsonl.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.config.cgroup import CgroupProbe, CgroupSample
from evalsup.config.run_config import RunConfig
from evalsup.supervisor.policies import InflightBudget, PressureSignal, RecycleCause, RecyclePolicy, Watermark
from evalsup.supervisor.rss import own_rss_bytes, rss_bytes
from evalsup.supervisor.workers import State, WorkerView

GIB = 1 << 30
MIB = 1 << 20


@dataclass
class MemoryDecision:
    throttle: str | None = None  # "pause" | "resume" | None
    recycle: list[tuple[int, RecycleCause]] = field(default_factory=list)  # (worker id, why)
    inflight_cap: int | None = None  # total requests in flight allowed now (None: no change)
    rss: dict[int, int] = field(default_factory=dict)  # worker id -> RSS just sampled
    notes: list[str] = field(default_factory=list)  # what to tell the user


class MemoryControl:
    def __init__(self, cfg: RunConfig, path: Path, probe: CgroupProbe | None = None) -> None:
        self.cfg = cfg
        self.probe = probe or CgroupProbe.detect()
        first = self.probe.sample()
        self.source = first.source
        self.limit = cfg.memory_limit or first.limit_bytes
        self.limit_from = "flag" if cfg.memory_limit else (first.source if first.limit_bytes else "none")
        high = cfg.memory_high or (int(self.limit * cfg.high_frac) if self.limit else None)
        self.watermark: Watermark | None = None
        if high is not None:
            low = int(high * cfg.low_frac / cfg.high_frac) if cfg.memory_high else int((self.limit or 0) * cfg.low_frac)
            self.watermark = Watermark(high, min(low, high - 1))
        # memory.events "max" (v1 failcnt) also rises when the kernel merely drops clean page cache (of the
        # results file, say) at the limit: not a sign of trouble. Throttling above memory.high, OOM and PSI are.
        self.pressure = PressureSignal(cfg.psi_threshold, keys=("high", "oom", "oom_kill"))
        self.budget = InflightBudget(self.limit, cfg.high_frac)
        if self.limit:
            # before any response is seen, assume 1 MiB ones: requests are let out as room is shown to exist
            self.budget.avg_bytes = float(MIB) * self.budget.parse_factor
        soft = cfg.max_worker_rss
        if soft is None:
            soft = self._share(cfg.first_workers) if self.limit else GIB
        self.recycle = RecyclePolicy(soft, int(soft * cfg.hard_rss_factor), cfg.max_tasks_per_worker,
                                     cfg.max_tasks_jitter)
        self.cap = cfg.concurrency
        self.concurrency_limit = 0  # issue 21: the workers' limits summed (set by the arbiter), for memory.jsonl
        self.on_wire = 0  # requests on the wire (set by the arbiter), for memory.jsonl and the report
        self.endpoints: list[Any] | None = None  # several endpoints: each one's load (set by the arbiter)
        self.oldest: list[dict[str, Any]] | None = None  # the oldest requests on the wire (set by the arbiter)
        self.limit_why: str | None = None  # why the adaptive limit is low, when it is (set by the arbiter; issue 41)
        self.ceiling: int | None = None  # RUN_DIR/concurrency's ceiling when the file sets one (set by the arbiter)
        if self.limit:
            self.cap = self.budget.cap(max(80 * MIB, 0) + cfg.workers * 60 * MIB, cfg.concurrency)
        self.cap_announced = False
        self.peak_working_set = 0
        self.oom_kills_start = first.events.get("oom_kill", 0)
        self.oom_kills = 0
        self.paused_since: float | None = None
        self.paused_s = 0.0
        self.last: CgroupSample = first
        self.last_supervisor_rss = 0
        self.last_ws = 0
        self._file: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - closed in close()
        self._sup_pid = os.getpid()
        self._stuck_since: float | None = None

    def _share(self, workers: int) -> int:
        """A worker's part of the high mark: the supervisor counts as one more."""
        return int((self.limit or 0) * self.cfg.high_frac / (workers + 1))

    def set_workers(self, n: int) -> None:
        """``n`` workers now share the load (autoscale added one): each one's part of the limit shrinks, so a
        worker grown large while it carried more is recycled (drained, not killed: the hard limit stays)."""
        if self.cfg.max_worker_rss is not None or not self.limit:
            return
        soft = self._share(n)
        self.recycle.soft_rss = soft
        self.recycle.hard_rss = max(int(soft * self.cfg.hard_rss_factor), self.recycle.hard_rss or 0)

    def describe(self) -> str:
        lim = f"{self.limit / MIB:,.0f} MiB ({self.limit_from})" if self.limit else "none found"
        wm = self.watermark
        marks = (f", pause above {wm.high_bytes / MIB:,.0f} MiB, resume below {wm.low_bytes / MIB:,.0f} MiB"
                 if wm else "")
        soft = self.recycle.soft_rss or 0
        c = self.cfg
        shares = c.per_worker_concurrency(c.first_workers)
        count = f"1 worker (up to {c.workers} while CPU-bound)" if c.autoscale else f"{c.workers} workers"
        return (f"sizing: memory limit {lim}{marks}; {count} x {shares[0]} requests "
                f"({'adaptive, up to ' if c.adaptive else ''}{c.concurrency} in flight), "  # issue 21
                f"window {c.window_for(shares[0])} tasks a worker; recycle a worker "
                f"past {soft / MIB:,.0f} MiB RSS (kill past {(self.recycle.hard_rss or 0) / MIB:,.0f} MiB)")

    def tick(self, workers: Iterable[WorkerView], paused: bool, done: int = 0) -> MemoryDecision:
        """Sample and decide; the arbiter applies the decision (records the RSS, throttles, recycles)."""
        now = time.time()
        dec = MemoryDecision()
        sample = self.probe.sample()
        self.last = sample
        sup_rss = rss_bytes(self._sup_pid) or 0
        per_worker: dict[int, int] = {}
        for w in workers:
            r = own_rss_bytes(w.pid) if w.pid else None
            if r is None:
                continue
            dec.rss[w.id] = r
            per_worker[w.pid] = r
            if w.state in (State.READY, State.DRAINING):
                d = self.recycle.decide(r, w.done, w.task_limit)
                if d is RecycleCause.HARD_KILL or (d is not None and w.state is State.READY and not w.recycling):
                    dec.recycle.append((w.id, d))
        total = sup_rss + sum(per_worker.values())
        ws = sample.working_set_bytes
        if self.cfg.memory_limit and not sample.limit_bytes:
            ws = total  # an explicit budget without a cgroup limit: count our own processes, not the host's
        elif ws is None:
            ws = total
        self.peak_working_set = max(self.peak_working_set, ws)
        self.last_supervisor_rss, self.last_ws = sup_rss, ws
        self.oom_kills = max(0, sample.events.get("oom_kill", 0) - self.oom_kills_start)
        pressure = self.pressure.update(sample.events, sample.psi_some_avg10)
        if self.watermark is not None:
            action = self.watermark.update(ws, pressure)
            if action is not None:
                dec.throttle = action
                if action == "pause":
                    self.paused_since = now
                elif self.paused_since is not None:
                    self.paused_s += now - self.paused_since
                    self.paused_since = None
        if self.limit and self.budget.avg_bytes is not None:
            cap = self.budget.cap(self._baseline(sup_rss, per_worker), self.cfg.concurrency)
            if cap != self.cap:
                if cap < self.cfg.concurrency and not self.cap_announced and self.budget.observations:
                    self.cap_announced = True
                    dec.notes.append(
                        f"memory: responses average {self.budget.avg_bytes / 3 / MIB:,.2f} MiB; capping requests in "
                        f"flight at {cap} of --concurrency {self.cfg.concurrency} to stay under "
                        f"{self.cfg.high_frac:.0%} of the {self.limit / MIB:,.0f} MiB limit")
                self.cap = cap
                dec.inflight_cap = cap
        self._record(now, sample, ws, sup_rss, per_worker, paused or dec.throttle == "pause", done)
        return dec

    def give_back(self, now: float, paused: bool, any_started: bool,
                  workers: Iterable[WorkerView]) -> WorkerView | None:
        """Paused with no request in flight (tasks may wait queued in workers) and still above the low mark:
        idle workers' RSS (CPython keeps what it freed) holds the pause forever. The largest worker is to be
        recycled to give memory back, one every 2 s."""
        if not paused or any_started:
            self._stuck_since = None
            return None
        if self._stuck_since is None:
            self._stuck_since = now
            return None
        if now - self._stuck_since < 2.0:
            return None
        self._stuck_since = now
        idle = [w for w in workers if w.state is State.READY and not w.recycling]
        return max(idle, key=lambda x: x.rss) if idle else None

    def _baseline(self, sup_rss: int, per_worker: dict[int, int]) -> int:
        # what the processes cost with nothing in flight: about 60 MiB a worker, 80 MiB the supervisor
        return max(sup_rss, 80 * MIB) + len(per_worker) * 60 * MIB

    def _record(self, now: float, s: CgroupSample, ws: int, sup_rss: int, per_worker: dict[int, int],
                paused: bool, done: int) -> None:
        if self._file is None:
            return
        rec = {"t": round(now, 3), "supervisor_rss": sup_rss, "workers_rss": {str(k): v for k, v in per_worker.items()},
               "cgroup_usage": s.usage_bytes, "working_set": ws, "limit": self.limit, "paused": paused,
               "inflight_cap": self.cap, "concurrency_limit": self.concurrency_limit, "in_flight": self.on_wire,
               "psi_some_avg10": s.psi_some_avg10, "done": done,
               "high": self.watermark.high_bytes if self.watermark else None,
               "low": self.watermark.low_bytes if self.watermark else None}
        if self.endpoints is not None:
            rec["endpoints"] = self.endpoints  # [{url, state, limit, in_flight}] (supervisor.limits)
        if self.ceiling is not None:
            rec["ceiling"] = self.ceiling  # RUN_DIR/concurrency (supervisor.ceiling), for status and evalsup serve
        if self.limit_why:
            rec["limit_why"] = self.limit_why  # for `evalsup status` (issue 41)
        if self.oldest:
            rec["oldest"] = self.oldest  # [{id, endpoint, age_s, attempt, bytes}], at most WIRE_TOP (issue 28)
        try:
            self._file.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
            self._file.flush()
        except OSError:
            self._file = None

    def summary(self) -> dict[str, Any]:
        paused = self.paused_s + (time.time() - self.paused_since if self.paused_since else 0.0)
        return {
            "throttle": {"episodes": self.watermark.episodes if self.watermark else 0, "paused_s": round(paused, 2)},
            "memory": {"limit_mb": round(self.limit / MIB, 1) if self.limit else None,
                       "peak_mb": round(self.peak_working_set / MIB, 1), "source": self.source},
            "oom_kills": self.oom_kills,
        }

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
