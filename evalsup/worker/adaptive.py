"""The adaptive concurrency limit (issue 21): a policy object with no I/O and no clock of its own.

One per worker and endpoint. The worker tells it about every attempt (``observe``: when it ended, how long the
server took, its HTTP status and error code, how many requests were in flight) and, when the server exposes
Prometheus metrics, about the server's queue (``server``); it answers with ``limit``, the requests the worker may
have in flight. The supervisor's LIMIT (memory cap, autoscale share) stays an upper bound: ``allowed(cap)``.

The rule, after reading Netflix's concurrency-limits (Gradient2, Vegas) and Inspect AI's AIMD on 429:

* Samples are gathered in windows of at least two round trips (the floor latency) and ``min_samples``
  answers to requests sent since the window began, so each decision sees the effect of the one before it.
* Push-back (429, 503, a timeout) is judged by its *share* of a window's answers, not by its presence (issue 28:
  a gateway's per-key limiter, a flaky proxy refuse a share of requests whatever the load; TCP tells loss from
  congestion the same way, Vegas and Gradient2 by latency). The share is compared with a learnt baseline, the
  share that does not depend on the load; none is learnt at first (0). A window whose share is significantly
  above it (a one-sided binomial test) cuts the limit by ``backoff`` (AIMD's multiplicative decrease, once a
  window). Each cut is an experiment: the next ``probe_samples`` answers at the lower limit are compared with
  the window that caused it (a two-proportion test). When the share fell, the push-back was load: the cut
  stands. When it did not, the refusals do not depend on how many are in flight: the cut is undone and their
  share becomes the baseline. A 429 or 503 is thus a wait (the retry policy sits out its Retry-After) and not,
  by itself, a reason to send less. Other failures (a 500, a cut stream, a reset) are never the limit's
  evidence: a task's own failure, or the breaker's business.
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
    tolerance: float = 1.25  # (Gradient2 default: 1.5; lower, so a server past its knee holds less queue)
    start_tolerance: float = 1.2  # slow start ends once latency passes this x floor
    backoff: float = 0.5  # multiplicative decrease on push-back
    smoothing: float = 0.5
    min_samples: int = 4
    min_window_s: float = 0.05
    floor_drift: float = 0.0005
    queue_target: float = 4.0  # the server's waiting queue held near this many requests
    server_fresh_s: float = 3.0  # a server sample older than this is ignored (latency rules instead)
    probe_samples: int = 20  # answers at the lower limit that judge a cut
    z_excess: float = 2.33  # a window's push-back share above the baseline: one-sided, 1 % by chance
    z_fell: float = 1.64  # the share fell after a cut: one-sided, 5 % by chance
    share_margin: float = 0.02  # a share this little above the baseline is never excess


def is_pushback(status: int | None, code: str | None) -> bool:
    return status in PUSHBACK_STATUS or code in PUSHBACK_CODES


@dataclass(frozen=True)
class _Probe:
    """A cut under judgement: when, the limit before it, slow start before it, the window that caused it."""

    at: float
    before: float
    slow_start: bool
    push: int
    answers: int


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
        # (when sent, push-back) of the answers served (2xx) and the push-back to requests sent since the window
        # began: the share is counted by when requests were sent, not when answered (a refusal comes back at
        # once, an answer after its latency: counted as they arrive, refusals would read several times their share)
        self._w_answers: list[tuple[float, bool]] = []
        self._w_push = 0  # push-back among them
        # the push-back share that does not depend on the load (None: none learnt, taken as 0)
        self.baseline: float | None = None
        self._base_k = 0.0  # push-back and answers at the lower limits of the cuts undone: the baseline's evidence
        self._base_n = 0.0
        self._x_k = 0  # push-back and answers of the windows since the last test against the baseline
        self._x_n = 0
        self._tested = (0, 0)  # the push-back and answers the last test read (the probe's first sample)
        self._bg_k = 0  # push-back and answers of the windows since, not excess: a baseline that fell shows there
        self._bg_n = 0
        self._probe: _Probe | None = None
        self._p_answers: list[tuple[float, bool]] = []  # (when sent, push-back) at the lower limit since the cut
        self._lag = 0.0  # how long an answer takes (the last window's mean latency, at least tolerance x floor)
        # the server's queue, when known
        self._srv_t: float | None = None
        self._srv_waiting = 0.0
        self._srv_running = 0.0
        self._srv_new = False
        self.decisions = 0  # windows decided (tests, reports)
        self.cuts = 0  # multiplicative decreases on push-back
        self.undone = 0  # cuts undone: the push-back share did not fall at the lower limit

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
        sent = now - latency_s
        push = is_pushback(status, code)
        served = status is not None and 200 <= status < 300 and not push
        probe = self._probe
        if probe is not None:
            # a cut under judgement: only answers to requests sent at the lower limit say what it changed
            if (push or served) and sent >= probe.at:
                self._p_answers.append((sent, push))
        elif (push or served) and sent >= self._w_start:
            # only answers to requests sent since the window began see the limit it began with (slow start
            # would otherwise double again on answers to the old limit)
            self._w_answers.append((sent, push))
            self._w_push += push
        if served and sent >= self._w_start:  # only answers served say anything about latency
            self._w_sum += latency_s
            self._w_n += 1
        elapsed = now - self._w_start
        rtt = self.floor if self.floor is not None else 0.0
        if probe is not None:
            if len(self._p_answers) >= self.s.probe_samples and now - probe.at >= 2 * rtt + self._lag:
                cutoff = now - self._lag
                k2 = n2 = 0
                for t, p in self._p_answers:
                    if t <= cutoff:
                        n2 += 1
                        k2 += p
                if n2 >= self.s.probe_samples:
                    self._judge(now, probe, k2, n2, cap)
            return
        # two round trips: the answers to requests sent in the first have all come back (the first few back
        # are the fastest, and a window of those alone reads the latency low). Before any baseline is learnt,
        # push-back is taken for load at once, as AIMD does: the cut that follows is judged.
        if (self.baseline is None and self._w_push) or (
                len(self._w_answers) >= min(self.s.min_samples, max(1, self.limit))
                and elapsed >= max(self.s.min_window_s, 2 * rtt)):
            self._decide(now, cap)

    def _count(self, now: float) -> tuple[float, int, int]:
        """The window's push-back and answers to the requests sent until an answer's time (``_lag``) ago, by
        send time, and that moment, where the next window begins: the later ones' answers are still coming (all
        refusals, few answers)."""
        cutoff = now - self._lag
        k = n = 0
        for t, p in self._w_answers:
            if t <= cutoff:
                n += 1
                k += p
        return cutoff, k, n

    def _excess(self, k: int, n: int) -> bool:
        """The push-back share is significantly above the baseline (a one-sided binomial test) over the
        windows since the last test (this one's ``n`` answers, ``k`` of them push-back, included), tested
        once they hold ``probe_samples`` answers: a few answers say little, and testing every window on the
        same answers would find an excess by chance. Before any baseline is learnt, any push-back is (AIMD's
        rule)."""
        b = self.baseline
        self._tested = (k, n)
        if b is None:
            return self._w_push > 0
        self._x_k += k
        self._x_n += n
        if self._x_n < self.s.probe_samples:
            return False
        k, n, self._x_k, self._x_n = self._x_k, self._x_n, 0, 0
        self._tested = (k, n)
        if k == 0:
            return False
        sd = math.sqrt(max(b, 1.0 / n) * max(1.0 - b, 1.0 / n) / n)
        return k / n > b + self.s.share_margin + self.s.z_excess * sd

    def _top(self, cap: int | None) -> float:
        s = self.s
        return float(s.max_limit if cap is None else max(s.min_limit, min(s.max_limit, cap)))

    def _judge(self, now: float, probe: _Probe, k2: int, n2: int, cap: int | None) -> None:
        """Enough answers at the lower limit: did the push-back share fall (a two-proportion test)? Yes: it was
        load, the cut stands. No: it does not depend on how many are in flight; the cut is undone, and the
        share at the lower limit (not the window's that caused the cut, picked for being high) is the
        baseline."""
        k1, n1 = probe.push, max(1, probe.answers)
        p1, p2 = k1 / n1, k2 / n2
        pool = (k1 + k2) / (n1 + n2)
        se = math.sqrt(pool * (1 - pool) * (1 / n1 + 1 / n2))
        self._probe = None
        self._p_answers = []
        self._x_k = self._x_n = 0
        if not (p1 > p2 and p1 - p2 > self.s.z_fell * se):
            self.undone += 1
            if self._base_n > 400:  # the older experiments weigh less, so a baseline that rose is followed
                self._base_k, self._base_n = self._base_k / 2, self._base_n / 2
            self._base_k += k2
            self._base_n += n2
            self.baseline = self._base_k / self._base_n
            self._limit = min(self._top(cap), max(self._limit, probe.before))
            self.slow_start = probe.slow_start
        self._reset_window(now)

    def _reset_window(self, now: float, start: float | None = None) -> None:
        """A new window from ``now`` (its answers from those sent since ``start``, by default ``now``)."""
        start = now if start is None else start
        self._w_start, self._w_sum, self._w_n, self._w_peak = start, 0.0, 0, 0
        self._w_answers = [a for a in self._w_answers if a[0] > start] if start < now else []
        self._w_push = sum(p for _, p in self._w_answers)

    def _decide(self, now: float, cap: int | None) -> None:
        s = self.s
        self.decisions += 1
        mean = self._w_sum / self._w_n if self._w_n else None
        if mean is not None and mean > 0:
            if self.floor is None or mean < self.floor:
                self.floor = mean
            else:
                self.floor += (mean - self.floor) * s.floor_drift
        if self.floor is not None:
            self._lag = max(s.tolerance * self.floor, mean or 0.0)
        limit = self._limit
        if self.baseline is None:  # (any push-back is news: all of the window's answers count)
            cutoff, k, n = now, self._w_push, len(self._w_answers)
        else:
            cutoff, k, n = self._count(now)
        app_limited = self._w_peak * 2 < limit
        fresh = self._srv_t is not None and now - self._srv_t <= s.server_fresh_s
        if self._excess(k, n):
            k, n = self._tested
            self._probe = _Probe(now, limit, self.slow_start, k, n)
            self._p_answers = []
            limit = limit * s.backoff
            self.slow_start = False
            self.cuts += 1
        else:
            b = self.baseline
            if b is not None:
                # a background share that lessened (a gateway's limit raised) lowers the baseline: the share
                # of the last few hundred answers, when significantly below it
                self._bg_k += k
                self._bg_n += n
                if self._bg_n >= 10 * s.probe_samples:
                    share = self._bg_k / self._bg_n
                    if share < b - s.z_excess * math.sqrt(b * (1 - b) / self._bg_n):
                        self.baseline = share
                        self._base_k, self._base_n = share * self._bg_n, float(self._bg_n)
                    self._bg_k = self._bg_n = 0
            if fresh and self._srv_new:
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
                    # past the tolerance only the gradient (Gradient2 adds sqrt(limit) here too, which holds
                    # the latency at ~1.7 x floor at a limit of 60: a replica left alone queued up, issue 28)
                    gradient = max(0.5, min(1.0, s.tolerance / ratio))
                    target = limit * gradient if ratio > s.tolerance else limit + math.sqrt(limit)
                    if target > limit and app_limited:
                        target = limit
                    limit = limit * (1 - s.smoothing) + target * s.smoothing
        self._limit = max(float(s.min_limit), min(self._top(cap), limit))
        self._reset_window(now, None if self._probe is not None else cutoff)

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
