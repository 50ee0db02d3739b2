"""Small policy objects for the supervisor's memory and lifecycle control.

Each takes plain inputs and returns a decision: no I/O, no clock reads (time is passed in), no
processes. The supervisor loop only wires them together (DESIGN.md invariant 6).

* :class:`Watermark`: pause/resume dispatch with hysteresis on the container working set.
* :class:`PressureSignal`: "the kernel is reclaiming or refusing memory" from memory.events and PSI.
* :class:`InflightBudget`: how many requests may be in flight so that their responses fit in memory.
* :class:`RecyclePolicy`: when a worker should be drained (soft RSS, task count) or killed (hard RSS).
* :class:`RestartIntensity`: too many unplanned restarts in a sliding window ends the run.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Literal

__all__ = [
    "DEFAULT_PARSE_FACTOR",
    "InflightBudget",
    "PressureSignal",
    "RecycleCause",
    "RecyclePolicy",
    "RestartIntensity",
    "Watermark",
    "WatermarkAction",
]

WatermarkAction = Literal["pause", "resume"]


class RecycleCause(enum.StrEnum):
    """Why a worker is recycled (``RecyclePolicy.decide``, the memory control's give-back, the task count): the
    key of ``recycles`` in the run's counters and summary, the label of evalsup_worker_recycles_total."""

    RSS = "rss"  # RSS at or above the soft limit (or memory given back): drained and replaced
    TASKS = "tasks"  # its task limit reached: drained and replaced
    HARD_KILL = "hard_kill"  # RSS at or above the hard limit: killed at once and replaced


class Watermark:
    """Hysteresis throttle: PAUSE at or above ``high_bytes`` (or under pressure), RESUME at or below
    ``low_bytes`` once the pressure is gone.

    :meth:`update` returns an action only when the state changes, so a reading that wanders between the
    two marks without crossing both causes no flapping. A working set of ``None`` (no container figures)
    leaves the decision to ``pressure`` alone, so a pause caused by pressure ends when the pressure does.
    """

    def __init__(self, high_bytes: int, low_bytes: int) -> None:
        if low_bytes < 0 or high_bytes < low_bytes:
            raise ValueError(f"need 0 <= low_bytes <= high_bytes, got low={low_bytes} high={high_bytes}")
        self.high_bytes = high_bytes
        self.low_bytes = low_bytes
        self.paused = False
        self.episodes = 0

    @classmethod
    def from_limit(cls, limit: int, high_frac: float = 0.85, low_frac: float = 0.70) -> Watermark:
        """Marks as fractions of a memory limit (e.g. the cgroup's effective limit)."""
        if not 0.0 < low_frac <= high_frac <= 1.0:
            raise ValueError(f"need 0 < low_frac <= high_frac <= 1, got {low_frac}, {high_frac}")
        if limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        return cls(int(limit * high_frac), int(limit * low_frac))

    def update(self, working_set: int | None, pressure: bool = False) -> WatermarkAction | None:
        """Feed one reading; return ``"pause"``/``"resume"`` on a state change, else ``None``."""
        if not self.paused:
            if pressure or (working_set is not None and working_set >= self.high_bytes):
                self.paused = True
                self.episodes += 1
                return "pause"
            return None
        if not pressure and (working_set is None or working_set <= self.low_bytes):
            self.paused = False
            return "resume"
        return None

    def __repr__(self) -> str:
        return (
            f"Watermark(high={self.high_bytes}, low={self.low_bytes}, paused={self.paused}, "
            f"episodes={self.episodes})"
        )


class PressureSignal:
    """True when the kernel reports memory trouble since the previous call.

    Watches the monotonic ``memory.events`` counters ``high`` (throttled above memory.high), ``max``
    (hit memory.max / v1 failcnt) and ``oom_kill``: any rise since the last call counts. Also true when
    PSI ``some avg10`` (percent of the last 10 s in which some task stalled on memory) exceeds
    ``psi_threshold``. The first call only records the baseline counters. A counter that goes down (the
    probe moved to another cgroup) is taken as a new baseline, not as a rise.

    :attr:`reasons` holds what made the last call true (e.g. ``("max", "psi")``), for the memory log.
    """

    DEFAULT_KEYS: tuple[str, ...] = ("high", "max", "oom_kill")

    def __init__(self, psi_threshold: float = 10.0, keys: Iterable[str] = DEFAULT_KEYS) -> None:
        self.psi_threshold = psi_threshold
        self.keys = tuple(keys)
        self._last: dict[str, int] | None = None
        self.reasons: tuple[str, ...] = ()

    def update(self, sample_events: Mapping[str, int], psi_some_avg10: float | None) -> bool:
        reasons: list[str] = []
        current = {k: sample_events[k] for k in self.keys if k in sample_events}
        if self._last is not None:
            for key, value in current.items():
                prev = self._last.get(key)
                if prev is not None and value > prev:
                    reasons.append(key)
        self._last = current
        if psi_some_avg10 is not None and psi_some_avg10 > self.psi_threshold:
            reasons.append("psi")
        self.reasons = tuple(reasons)
        return bool(reasons)


#: Memory one in-flight request costs, as a multiple of its response body: the raw bytes as read, the
#: decoded text and the parsed JSON objects all live at once while the worker handles it (orjson's
#: output line is about one more copy). 3x is a rounded figure for that; tune with ``parse_factor``.
DEFAULT_PARSE_FACTOR = 3.0


class InflightBudget:
    """An in-flight request cap that keeps the expected response memory under ``high_frac * limit``.

    :meth:`observe` feeds each finished response's size; the budget keeps an exponentially weighted
    moving average (weight ``alpha`` on the newest) of ``response_bytes * parse_factor +
    overhead_bytes``, the estimated peak cost of one in-flight request.

    :meth:`cap` answers how many may be in flight: the largest ``n`` with ``baseline + n * avg <=
    high_frac * limit``, clamped to ``[1, requested]`` (never zero, so the run always makes progress;
    the watermark is what stops dispatch outright). ``baseline_bytes`` is the memory that does not
    depend on in-flight requests, e.g. the idle footprint of the supervisor and workers. With no limit,
    or before any observation, the cap is ``requested``.
    """

    def __init__(
        self,
        limit_bytes: int | None,
        high_frac: float = 0.85,
        parse_factor: float = DEFAULT_PARSE_FACTOR,
        overhead_bytes: int = 0,
        alpha: float = 0.2,
    ) -> None:
        if not 0.0 < high_frac <= 1.0:
            raise ValueError(f"high_frac must be in (0, 1], got {high_frac}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if parse_factor <= 0 or overhead_bytes < 0:
            raise ValueError("parse_factor must be positive and overhead_bytes non-negative")
        self.limit_bytes = limit_bytes
        self.high_frac = high_frac
        self.parse_factor = parse_factor
        self.overhead_bytes = overhead_bytes
        self.alpha = alpha
        self.avg_bytes: float | None = None
        self.observations = 0

    def observe(self, response_bytes: int) -> None:
        cost = max(response_bytes, 0) * self.parse_factor + self.overhead_bytes
        if self.avg_bytes is None:
            self.avg_bytes = float(cost)
        else:
            self.avg_bytes += self.alpha * (cost - self.avg_bytes)
        self.observations += 1

    def cap(self, baseline_bytes: int, requested: int) -> int:
        if requested <= 1:
            return max(requested, 0)
        if self.limit_bytes is None or self.avg_bytes is None or self.avg_bytes <= 0:
            return requested
        room = self.high_frac * self.limit_bytes - baseline_bytes
        n = math.floor(room / self.avg_bytes) if room > 0 else 0
        return max(1, min(requested, n))

    def __repr__(self) -> str:
        return f"InflightBudget(limit={self.limit_bytes}, avg={self.avg_bytes}, n={self.observations})"


class RecyclePolicy:
    """When to replace a worker.

    * ``HARD_KILL``: RSS at or above ``hard_rss``: kill now, hand its tasks on, replace it.
    * ``RSS``: RSS at or above ``soft_rss``: drain (finish what it holds, then exit) and replace.
    * ``TASKS``: it has done ``task_limit`` tasks: drain and replace (bounds slow leaks).

    ``task_limit`` is per worker, drawn at spawn by :meth:`task_limit_for_new_worker` as ``max_tasks``
    plus a uniform random jitter in ``[0, jitter]`` (gunicorn's ``max_requests_jitter``), so workers
    started together do not all recycle at once. ``None`` disables a check.
    """

    def __init__(
        self,
        soft_rss: int | None,
        hard_rss: int | None,
        max_tasks: int | None = None,
        jitter: int = 0,
        seed: int | str | bytes | None = None,
    ) -> None:
        if soft_rss is not None and hard_rss is not None and soft_rss > hard_rss:
            raise ValueError(f"soft_rss ({soft_rss}) must not exceed hard_rss ({hard_rss})")
        if jitter < 0:
            raise ValueError(f"jitter must be >= 0, got {jitter}")
        if max_tasks is not None and max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1, got {max_tasks}")
        self.soft_rss = soft_rss
        self.hard_rss = hard_rss
        self.max_tasks = max_tasks
        self.jitter = jitter
        self._rng = random.Random(seed)

    def task_limit_for_new_worker(self) -> int | None:
        if self.max_tasks is None:
            return None
        return self.max_tasks + (self._rng.randint(0, self.jitter) if self.jitter else 0)

    def decide(self, rss: int | None, tasks_done: int, task_limit: int | None) -> RecycleCause | None:
        if rss is not None:
            if self.hard_rss is not None and rss >= self.hard_rss:
                return RecycleCause.HARD_KILL
            if self.soft_rss is not None and rss >= self.soft_rss:
                return RecycleCause.RSS
        if task_limit is not None and tasks_done >= task_limit:
            return RecycleCause.TASKS
        return None


def task_count_step(done: int, task_limit: int | None, window: int) -> Literal["recycle", "warm"] | None:
    """Recycling on task count, as each result comes: at the limit, recycle; within a window's worth (or a
    tenth of the limit) of it, warm up the successor now, so the recycle costs no throughput."""
    if task_limit is None:
        return None
    if done >= task_limit:
        return "recycle"
    if done >= task_limit - max(window, task_limit // 10):
        return "warm"
    return None


class RestartIntensity:
    """Erlang-style restart intensity: :meth:`record` returns True when more than ``max_restarts``
    restarts fall within the last ``period_s`` seconds (inclusive). Feed it unplanned restarts only
    (crashes, hangs, hard kills), not planned recycles. Memory is bounded: only the newest
    ``max_restarts + 1`` timestamps are kept, which is all the decision needs.
    """

    def __init__(self, max_restarts: int = 10, period_s: float = 60.0) -> None:
        if max_restarts < 0 or period_s <= 0:
            raise ValueError("max_restarts must be >= 0 and period_s > 0")
        self.max_restarts = max_restarts
        self.period_s = period_s
        self._times: deque[float] = deque(maxlen=max_restarts + 1)

    def record(self, now: float) -> bool:
        self._times.append(now)
        self._expire(now)
        return len(self._times) > self.max_restarts

    def count(self, now: float) -> int:
        """Restarts within the window ending at ``now`` (capped at ``max_restarts + 1``)."""
        self._expire(now)
        return len(self._times)

    def _expire(self, now: float) -> None:
        while self._times and now - self._times[0] > self.period_s:
            self._times.popleft()
