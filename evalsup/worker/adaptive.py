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

What keeps it from getting stuck (issue 41; docs/architecture.md "Adaptive concurrency" says why each):

* The latency is of answers served (2xx) only, and comparable whatever the answer's length: a stream's time to
  its first token (``first_s``), else the whole answer's time. Latencies within ``noise_s`` of the floor are
  the client's own loop, not a queue (Envoy's buffer): ``ratio = latency / (floor + noise_s)``.
* The floor is re-measured (Vegas, Envoy's minRTT window, BBR's ProbeRTT): the lowest window mean, but once it
  is ``floor_ttl_s`` old (at least 30 answer times), or after 5 windows below ``low`` (a limit stuck low), one
  window runs at half the limit and its mean becomes the floor, up or down; then the limit is restored. A floor
  learnt at a fast moment thus lasts seconds, not the run.
* After a cut for a latency ``spell`` (2.5) x the floor or more (a slow spell: a queue past a knee reads
  1.25-2x), the limit doubles back towards where it was (``_high``) each window whose latency is under
  ``start_tolerance`` x floor (BBR's return to the last bandwidth), then grows by sqrt(limit) past it.
* A floor from what the server does (Little's law): the highest rate of answers served over 1 s buckets of the
  last ``rate_window_s``, times the lowest mean latency (whole answers) over the same buckets, is what the server
  sustained in flight (BBR's bandwidth-delay product); the limit never sits below ``bdp_share`` of it.
* ``reason`` says in words why a low limit is low, and which ``--concurrency`` did better by the rates measured
  at each level the limit went through (``level_rates``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from evalsup.ipc.messages import WorkerConfig
from evalsup.worker.errors import pushback


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
    noise_s: float = 0.005  # latency differences this small are the client's loop, not the server's queue
    floor_ttl_s: float = 10.0  # the floor is re-measured once this old (and at least 30 answer times)
    low: int = 4  # a limit under this for 5 windows re-measures the floor at once (Envoy: at its minimum)
    spell: float = 2.5  # a cut for a latency this many x the floor remembers where it came from (recovery)
    rate_bucket_s: float = 1.0  # answers served are counted in buckets this long (the Little's-law floor)
    rate_window_s: float = 10.0  # the buckets the floor reads: the last this many seconds
    bdp_share: float = 0.5  # the limit never sits below this share of the sustained rate x latency
    level_ttl_s: float = 60.0  # a level's measured rate is forgotten after this (``reason``'s suggestion)
    queue_target: float = 4.0  # the server's waiting queue held near this many requests
    server_fresh_s: float = 3.0  # a server sample older than this is ignored (latency rules instead)
    probe_samples: int = 20  # answers at the lower limit that judge a cut
    z_excess: float = 2.33  # a window's push-back share above the baseline: one-sided, 1 % by chance
    z_fell: float = 1.64  # the share fell after a cut: one-sided, 5 % by chance
    share_margin: float = 0.02  # a share this little above the baseline is never excess


def is_pushback(status: int | None, code: str | None) -> bool:
    """The server pushing back on the load: errors.py's reading (``errors.pushback``), the one place it is made."""
    return pushback(status, code)


@dataclass
class _Bucket:
    """Answers served since ``start``: how many, their whole latencies summed, the most in flight, the limit."""

    start: float
    ok: int = 0
    lat: float = 0.0
    peak: int = 0
    limits: list[int] = field(default_factory=list)


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
        self._w_full = 0.0  # the window's whole-answer latencies summed (``_w_sum`` is the signal's)
        self._floor_t = 0.0  # when the floor was last set (measured lower, or re-measured)
        self._rtt_saved: float | None = None  # a floor re-measure under way: the limit to restore after it
        self.remeasured = 0  # floor re-measures done (tests, reports)
        self._low_windows = 0  # consecutive windows with the limit under ``low``
        self._high: float | None = None  # the limit before the last cuts for latency: recovery doubles to it
        self._recovering = False  # the last window's growth was a recovery doubling
        self._drained = False  # the last window was a floor's re-measure (the server's queue drained in it)
        self._bucket: _Bucket | None = None
        self._rates: deque[tuple[float, float, float]] = deque()  # (end, answers/s, mean latency) of the buckets
        self.level_rates: dict[int, tuple[float, float]] = {}  # a level (power of 2) -> (answers/s, when)
        self.cause: tuple[str, float] | None = None  # what last lowered the limit: latency / pushback / queue
        self._ratio = 1.0  # the last window's latency / floor

    @property
    def limit(self) -> int:
        return max(self.s.min_limit, int(self._limit))

    @property
    def background_refusals(self) -> bool:
        """The server refuses a share whatever the load (a cut was undone and that share learnt): a request
        waiting out such a refusal's Retry-After need not hold a place (``client.Client._flow_wait``)."""
        return self.baseline is not None

    @property
    def measuring(self) -> bool:
        """A re-measure of the floor is under way (one window at half the limit)."""
        return self._rtt_saved is not None

    def allowed(self, cap: int) -> int:
        """Requests that may be in flight now, under the supervisor's cap."""
        return max(1, min(cap, self.limit))

    def server(self, now: float, waiting: float, running: float) -> None:
        """A scrape of the server's metrics: requests waiting in its queue and running."""
        self._srv_t, self._srv_waiting, self._srv_running, self._srv_new = now, waiting, running, True

    def observe(self, now: float, latency_s: float, status: int | None, code: str | None, inflight: int,
                cap: int | None = None, first_s: float | None = None) -> None:
        """One attempt ended at ``now`` after ``latency_s`` at the server, with ``inflight`` requests (itself
        included) in flight when it ended. ``cap``: the supervisor's cap now (the limit never sits above it).
        ``first_s``: a stream's time to its first token, the latency signal when given (comparable whatever the
        answer's length)."""
        if self._w_start is None:
            self._w_start = now - latency_s
        self._w_peak = max(self._w_peak, inflight)
        sent = now - latency_s
        push = is_pushback(status, code)
        served = status is not None and 200 <= status < 300 and not push
        self._count_rate(now, served, latency_s, inflight)
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
            self._w_sum += latency_s if first_s is None else first_s
            self._w_full += latency_s
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
        self._w_start, self._w_sum, self._w_n, self._w_peak, self._w_full = start, 0.0, 0, 0, 0.0
        self._w_answers = [a for a in self._w_answers if a[0] > start] if start < now else []
        self._w_push = sum(p for _, p in self._w_answers)

    def _decide(self, now: float, cap: int | None) -> None:
        s = self.s
        self.decisions += 1
        mean = self._w_sum / self._w_n if self._w_n else None
        full = self._w_full / self._w_n if self._w_n else None
        if self._rtt_saved is not None:  # the floor's re-measure (at half the limit) ends: its mean is the floor
            saved, self._rtt_saved = self._rtt_saved, None
            if mean is not None and mean > 0:
                self.floor = mean
                self.remeasured += 1
            self._floor_t, self._low_windows = now, 0
            self._drained = True  # (the next window's latency is low for the drained queue: no doubling on it)
            self._limit = max(float(s.min_limit), min(self._top(cap), max(self._limit, saved)))
            self._reset_window(now)
            return
        if mean is not None and mean > 0 and (self.floor is None or mean < self.floor):
            self.floor, self._floor_t = mean, now
        if self.floor is not None:
            self._lag = max(s.tolerance * self.floor, full or 0.0)
        self._low_windows = self._low_windows + 1 if self._limit < s.low else 0
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
            self.cause = ("pushback", k / n if n else 0.0)
            self._high = None
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
                ratio = self._ratio = mean / (self.floor + s.noise_s)
                recovering, self._recovering = self._recovering, False
                drained, self._drained = self._drained, False
                if self._floor_stale(now):  # re-measure the floor: one window at half the limit (ProbeRTT)
                    self._rtt_saved = limit
                    self._limit = max(float(s.min_limit), min(self._top(cap), limit * 0.5))
                    self._reset_window(now)
                    return
                if self.slow_start and ratio < s.start_tolerance:
                    if not app_limited:
                        limit = limit * 2
                elif (ratio < s.start_tolerance and self._high is not None and limit < self._high
                      and not app_limited and not drained):  # the cause of a cut went away: back where it was
                    limit = min(self._high, limit * 2)
                    self._recovering = True
                    if limit >= self._high:
                        self._high = None
                else:
                    overshoot = recovering or self.slow_start  # (where slow start or a recovery overshot)
                    self.slow_start = False
                    # past the tolerance only the gradient (Gradient2 adds sqrt(limit) here too, which holds
                    # the latency at ~1.7 x floor at a limit of 60: a replica left alone queued up, issue 28)
                    gradient = max(0.5, min(1.0, s.tolerance / ratio))
                    target = limit * gradient if ratio > s.tolerance else limit + math.sqrt(limit)
                    if target > limit and app_limited:
                        target = limit
                    if target < limit:
                        self.cause = ("latency", ratio)
                        # (a recovery that overshot is no evidence of where the limit was worth being)
                        if overshoot:
                            self._high = None
                        elif ratio >= s.spell:  # (a queue past the knee reads 1.25-2x: no spell to return from)
                            self._high = max(self._high or 0.0, limit)
                    limit = limit * (1 - s.smoothing) + target * s.smoothing
        sustained = self.sustained(now)
        if self._probe is None and sustained:  # never far below what the server was seen to sustain
            limit = max(limit, s.bdp_share * sustained)
        self._limit = max(float(s.min_limit), min(self._top(cap), limit))
        self._reset_window(now, None if self._probe is not None else cutoff)

    def _floor_stale(self, now: float) -> bool:
        """The floor is to be re-measured: it is ``floor_ttl_s`` old (and 30 answer times), or the limit has sat
        under ``low`` for 5 windows."""
        ttl = max(self.s.floor_ttl_s, 30 * self._lag)
        return now - self._floor_t >= ttl or self._low_windows >= 5

    def _count_rate(self, now: float, served: bool, latency_s: float, inflight: int) -> None:
        """Answers served counted in buckets of ``rate_bucket_s``: each full bucket's rate and mean latency kept
        for ``rate_window_s`` (``sustained``), and its rate as its level's (``level_rates``)."""
        s = self.s
        b = self._bucket
        if b is None:
            b = self._bucket = _Bucket(now)
        if served:
            b.ok += 1
            b.lat += latency_s
        b.peak = max(b.peak, inflight)
        b.limits.append(self.limit)
        span = now - b.start
        if span < s.rate_bucket_s:
            return
        rate = b.ok / span
        if b.ok:
            self._rates.append((now, rate, b.lat / b.ok))
        while self._rates and self._rates[0][0] < now - s.rate_window_s:
            self._rates.popleft()
        lim = sorted(b.limits)[len(b.limits) // 2]
        if b.peak * 2 >= lim:  # (an application-limited bucket says nothing of its level)
            level = 1 << max(0, lim.bit_length() - 1)
            old = self.level_rates.get(level)
            fresh = old is not None and now - old[1] <= s.level_ttl_s
            self.level_rates[level] = ((old[0] + rate) / 2 if fresh and old else rate, now)
        self._bucket = _Bucket(now)

    def sustained(self, now: float) -> float:
        """In flight the server was seen to sustain lately (Little's law): the best rate of answers served in a
        bucket of the last ``rate_window_s``, times the lowest mean latency of those buckets. 0 before any."""
        rows = [r for r in self._rates if r[0] >= now - self.s.rate_window_s]
        if not rows:
            return 0.0
        return max(r[1] for r in rows) * min(r[2] for r in rows)

    def reason(self, now: float) -> tuple[str, int] | None:
        """Why the limit is low (under twice ``low``), in words, and the ``--concurrency`` level that served
        answers at least 1.5x as fast by this run's own measurements (0: none); None when it is not low."""
        if self.limit >= 2 * self.s.low:
            return None
        said = []
        kind, x = self.cause or ("", 0.0)
        if kind == "latency":
            said.append(f"latency {x:.1f}x its baseline")
        elif kind == "pushback":
            said.append(f"{x:.0%} of answers pushed back (429/503/timeout), fewer when it sent less")
        elif kind == "queue":
            said.append(f"the server's queue held {x:.0f} waiting")
        if self.baseline is not None and self.baseline >= 0.05:
            said.append(f"{self.baseline:.0%} of answers (served or refused) are 429/503 at every limit tried")
        if not said:
            said.append(f"latency {self._ratio:.1f}x its baseline")
        live = {lv: r for lv, (r, t) in self.level_rates.items() if now - t <= self.s.level_ttl_s}
        here = live.get(1 << max(0, self.limit.bit_length() - 1))
        best = max(live, key=lambda lv: live[lv], default=0)
        better = best if best > self.limit and here is not None and live[best] >= 1.5 * here else 0
        return "; ".join(said), better

    def _from_server(self, limit: float, app_limited: bool) -> float:
        s = self.s
        self._srv_new = False
        excess = self._srv_waiting - s.queue_target
        if excess > 0:
            self.slow_start = False
            self.cause = ("queue", self._srv_waiting)
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
