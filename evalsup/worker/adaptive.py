"""The adaptive concurrency limit (issue 21): a policy object with no I/O and no clock of its own.

One per worker and endpoint. The worker tells it about every attempt (``observe``: when it ended, how long the
server took, its HTTP status and error code, how many requests were in flight) and, when the server exposes
Prometheus metrics, about the server's queue (``server``); it answers with ``limit``, the requests the worker may
have in flight. The supervisor's LIMIT (memory cap, autoscale share) stays an upper bound: ``allowed(cap)``.

The rule, after reading Netflix's concurrency-limits (Gradient2, Vegas) and Inspect AI's AIMD on 429:

* Samples are gathered in windows of at least two round trips (the floor latency) and ``min_samples``
  answers to requests sent since the window began, so each decision sees the effect of the one before it.
* Push-back (429, 503, a timeout) in a window: multiply the limit by ``backoff`` (AIMD's multiplicative
  decrease, at most once a window, so one burst of 429s costs one cut, not one cut per answer).
* Else, from the server's queue when its metrics are fresh: the waiting queue above ``queue_target`` is
  taken back in proportion to this worker's part of the server's load (several workers or clients share it);
  at or below the target the limit grows.
* Else, from latency (Gradient2): ``gradient = clamp(tolerance * floor / latency, 0.5, 1)`` and
  ``limit = limit * gradient + sqrt(limit)``, half-smoothed. Latency near its floor grows the limit by
  sqrt(limit) a window; latency past ``tolerance`` x floor is queueing, where in-flight requests rise with no
  gain in throughput (Little's law: throughput = in flight / latency is flat), and the limit shrinks by the
  ratio, down to half a window.
* Slow start: until the first sign of queueing (latency past ``start_tolerance`` x floor, a waiting queue, or
  push-back) the limit doubles each window, so it reaches a server's knee within a few round trips.
* An application-limited window (fewer than half the limit in flight: the worker has not the tasks, or the
  supervisor's cap holds it) never grows the limit.
* The floor is the lowest window mean latency seen, drifting up slowly (``floor_drift`` of the gap each
  window) so that a server whose base latency rose is not held to an old floor forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from evalsup.ipc.messages import WorkerConfig

PUSHBACK_STATUS = frozenset({429, 503})
# timeouts are push-back (an overloaded server answers late); a refused or reset connection is an outage,
# the breaker's business, not the limit's
PUSHBACK_CODES = frozenset({"timeout_read", "timeout_total", "timeout_connect"})


@dataclass(frozen=True)
class AdaptiveSettings:
    max_limit: int = 256
    min_limit: int = 1
    initial: int = 16  # as Gradient2 and Vegas start (20), a little under
    tolerance: float = 1.5  # Gradient2's default RTT tolerance
    start_tolerance: float = 1.2  # slow start ends once latency passes this x floor
    backoff: float = 0.5  # multiplicative decrease on push-back
    smoothing: float = 0.5
    min_samples: int = 4
    min_window_s: float = 0.05
    floor_drift: float = 0.0005
    queue_target: float = 4.0  # the server's waiting queue held near this many requests
    server_fresh_s: float = 3.0  # a server sample older than this is ignored (latency rules instead)


def is_pushback(status: int | None, code: str | None) -> bool:
    return status in PUSHBACK_STATUS or code in PUSHBACK_CODES


class AdaptiveLimit:
    """The limit of one worker on one endpoint. ``now`` is always passed in (seconds, monotonic)."""

    def __init__(self, settings: AdaptiveSettings | None = None) -> None:
        self.s = s = settings or AdaptiveSettings()
        self._limit = float(max(s.min_limit, min(s.max_limit, s.initial)))
        self.floor: float | None = None
        self.slow_start = True
        # the current window
        self._w_start: float | None = None
        self._w_sum = 0.0
        self._w_n = 0
        self._w_peak = 0
        self._w_push = False
        self._cut_at: float | None = None  # when the limit was last cut for push-back
        # the server's queue, when known
        self._srv_t: float | None = None
        self._srv_waiting = 0.0
        self._srv_running = 0.0
        self._srv_new = False
        self.decisions = 0  # windows decided (tests, reports)
        self.cuts = 0  # multiplicative decreases on push-back

    @property
    def limit(self) -> int:
        return max(self.s.min_limit, int(self._limit))

    def allowed(self, cap: int) -> int:
        """Requests that may be in flight now, under the supervisor's cap."""
        return max(1, min(cap, self.limit))

    def server(self, now: float, waiting: float, running: float) -> None:
        """A scrape of the server's metrics: requests waiting in its queue and running."""
        self._srv_t, self._srv_waiting, self._srv_running, self._srv_new = now, waiting, running, True

    def observe(self, now: float, latency_s: float, status: int | None, code: str | None, inflight: int,
                cap: int | None = None) -> None:
        """One attempt ended at ``now`` after ``latency_s`` at the server, with ``inflight`` requests (itself
        included) in flight when it ended. ``cap``: the supervisor's cap now (the limit never sits above it)."""
        if self._w_start is None:
            self._w_start = now - latency_s
        self._w_peak = max(self._w_peak, inflight)
        if is_pushback(status, code):
            # once per round trip, as TCP does: push-back to a request sent before the last cut says nothing new
            if self._cut_at is None or now - latency_s >= self._cut_at:
                self._w_push = True
        elif status is not None and 200 <= status < 300 and now - latency_s >= self._w_start:
            # only answers served say anything about latency, and only those sent since the window began see
            # the limit it began with (slow start would otherwise double again on answers to the old limit)
            self._w_sum += latency_s
            self._w_n += 1
        elapsed = now - self._w_start
        rtt = self.floor if self.floor is not None else 0.0
        # two round trips: the answers to requests sent in the first have all come back (the first few back
        # are the fastest, and a window of those alone reads the latency low)
        if self._w_push or (self._w_n >= min(self.s.min_samples, max(1, self.limit))
                            and elapsed >= max(self.s.min_window_s, 2 * rtt)):
            self._decide(now, cap)

    def _decide(self, now: float, cap: int | None) -> None:
        s = self.s
        self.decisions += 1
        mean = self._w_sum / self._w_n if self._w_n else None
        if mean is not None and mean > 0:
            if self.floor is None or mean < self.floor:
                self.floor = mean
            else:
                self.floor += (mean - self.floor) * s.floor_drift
        limit = self._limit
        app_limited = self._w_peak * 2 < limit
        fresh = self._srv_t is not None and now - self._srv_t <= s.server_fresh_s
        if self._w_push:
            limit = limit * s.backoff
            self._cut_at = now
            self.slow_start = False
            self.cuts += 1
        elif fresh and self._srv_new:
            limit = self._from_server(limit, app_limited)
        elif fresh:
            pass  # the server's queue rules while it is known: no new scrape since the last window, no change
        elif mean is not None and self.floor is not None:
            ratio = mean / self.floor
            if self.slow_start and ratio < s.start_tolerance:
                if not app_limited:
                    limit = limit * 2
            else:
                self.slow_start = False
                gradient = max(0.5, min(1.0, s.tolerance / ratio))
                target = limit * gradient + math.sqrt(limit)
                if target > limit and app_limited:
                    target = limit
                limit = limit * (1 - s.smoothing) + target * s.smoothing
        top = s.max_limit if cap is None else max(s.min_limit, min(s.max_limit, cap))
        self._limit = max(float(s.min_limit), min(float(top), limit))
        self._w_start, self._w_sum, self._w_n, self._w_peak, self._w_push = now, 0.0, 0, 0, False

    def _from_server(self, limit: float, app_limited: bool) -> float:
        s = self.s
        self._srv_new = False
        excess = self._srv_waiting - s.queue_target
        if excess > 0:
            self.slow_start = False
            load = self._srv_running + self._srv_waiting
            mine = min(1.0, limit / load) if load > 0 else 1.0
            return max(limit * 0.5, limit - excess * mine)
        if app_limited:
            return limit
        return limit * 2 if self.slow_start else limit + max(1.0, math.sqrt(limit) / 2)


def adaptive_from_config(cfg: WorkerConfig, endpoints: int = 1) -> AdaptiveLimit | None:
    """One endpoint's controller in this worker, or None when --concurrency fixes the limit."""
    if not cfg.adaptive:
        return None
    top = max(1, cfg.concurrency)
    # a replacement worker (recycled, crashed) starts where its predecessor was (its endpoints' share of
    # that), out of slow start
    start = -(-cfg.adaptive_start // max(1, endpoints))
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=top, initial=min(top, start or AdaptiveSettings.initial)))
    ctl.slow_start = not start
    return ctl
