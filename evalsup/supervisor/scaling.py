"""When to add a worker. Without --workers a run starts with one worker and adds one while every worker is
CPU-bound, up to the most the machine and the memory limit allow (``config.default_workers``).

One event loop carries hundreds of requests a second when responses are small; a second process then only
costs CPU and memory (the loops wake for a share of the events each, and each interpreter starts at ~0.2 s of
CPU). Large responses make the loop CPU-bound (parsing, copying): that is when another worker pays. Workers are
never taken away for being idle; the counts only grow, one at a time, with time to settle in between.

``ScaleUp.may_add(now, ScaleGate(...))`` is the whole decision; the arbiter only adds the worker. No clock here
(time is passed in); ``cpu_seconds`` is the one probe, and the arbiter calls it.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ScaleGate", "ScaleUp", "cpu_seconds"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC_STAT = os.path.exists("/proc/self/stat")


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of ``pid`` (all its threads); None when it is gone."""
    if not _PROC_STAT:
        import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs; only where /proc is missing

        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.Error, OSError):
            return None
        return float(t.user + t.system)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rpartition(b")")[2].split()  # the name may hold spaces; what follows it does not
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (IndexError, ValueError):
        return None


class ScaleUp:
    """Add a worker when each worker used at least ``busy`` of a core over the last ``window_s``, and the
    last change is ``settle_s`` old (a new worker takes a share of the requests of the others)."""

    def __init__(self, busy: float = 0.6, window_s: float = 2.0, settle_s: float = 3.0) -> None:
        self.busy = busy
        self.window_s = window_s
        self.settle_s = settle_s
        self.last_change: float | None = None
        self._samples: dict[int, collections.deque[tuple[float, float]]] = {}
        self.loads: dict[int, float] = {}  # pid -> share of a core over the window, as last computed

    def observe(self, now: float, cpu: Iterable[tuple[int, float]]) -> None:
        """Record (pid, CPU seconds) of the workers that take tasks now; others are forgotten."""
        seen = set()
        for pid, secs in cpu:
            seen.add(pid)
            q = self._samples.setdefault(pid, collections.deque())
            q.append((now, secs))
            while len(q) > 2 and now - q[1][0] >= self.window_s:
                q.popleft()
        for pid in set(self._samples) - seen:
            del self._samples[pid]
        self.loads = {}
        for pid, q in self._samples.items():
            (t0, c0), (t1, c1) = q[0], q[-1]
            if t1 - t0 >= self.window_s * 0.9:
                self.loads[pid] = (c1 - c0) / (t1 - t0)

    def wants_more(self, now: float) -> bool:
        """Every worker observed is busy over a full window, and the last change has settled."""
        if self.last_change is not None and now - self.last_change < self.settle_s:
            return False
        if not self._samples or len(self.loads) < len(self._samples):
            return False  # a worker without a full window yet (just started)
        return min(self.loads.values()) >= self.busy

    def may_add(self, now: float, gate: ScaleGate) -> bool:
        """The seven conditions: the run allows another worker now (``gate``: six of them), and every worker
        is CPU-bound over a full window with the last change settled (``wants_more``)."""
        return gate.blocked() is None and self.wants_more(now)

    def changed(self, now: float) -> None:
        """A worker was added: measure afresh from here."""
        self.last_change = now
        self._samples.clear()
        self.loads = {}


@dataclass(frozen=True)
class ScaleGate:
    """The run's side of the question "may a worker be added now?", as the arbiter sees it at one moment;
    ``blocked`` names the first condition that says no (the workers' CPU is ``ScaleUp.wants_more``'s)."""

    active: int  # worker slots in use
    max_workers: int  # --workers: the most there may be
    paused: bool  # dispatch is held by the memory throttle
    stopping: bool
    input_done: bool  # the input is read to its end: no new work for another worker
    starting: bool  # a worker is still starting (its share of the load is not yet seen)
    memory_cap: int  # requests in flight the memory allows now
    concurrency: int  # --concurrency

    def blocked(self) -> str | None:
        if self.active >= self.max_workers:
            return "at the most workers"
        if self.paused:
            return "paused"
        if self.stopping:
            return "stopping"
        if self.input_done:
            return "input done"
        if self.starting:
            return "a worker is starting"
        if self.memory_cap < self.concurrency:
            return "memory caps requests in flight"
        return None

