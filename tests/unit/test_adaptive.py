"""The adaptive concurrency limit as a pure policy object (evalsup.worker.adaptive), on synthetic traces.

The traces come from a small discrete-event simulation of a server with K slots and a FIFO of Q (what
`evalsup mock --capacity K --queue Q` does for real): the clock is the simulation's, so nothing here is timed.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from evalsup.ipc.messages import WorkerConfig
from evalsup.worker.adaptive import AdaptiveLimit, AdaptiveSettings, adaptive_from_config, is_pushback


@dataclass
class Sim:
    k: int
    q: int
    lat: float = 0.2
    jitter: float = 0.05
    retry_after: float = 1.0
    server_metrics: bool = False
    refuse: float = 0.0  # a share refused at once whatever the load (a gateway's limiter): 429, Retry-After
    per_running: float = 0.0  # seconds each request running beside it adds (continuous batching: no sharp knee)
    slow: tuple[float, float, float] | None = None  # (from, until, factor): latency times factor meanwhile
    seed: int = 1
    n429: int = 0
    answers: int = 0
    trace: list[tuple[float, int]] = field(default_factory=list)

    def run(self, ctl: AdaptiveLimit | None, tasks: int, fixed: int | None = None,
            change: tuple[float, int] | None = None) -> float:
        """Push ``tasks`` through the server under ``ctl`` (or a fixed limit); the throughput (tasks/s)."""
        rng = random.Random(self.seed)
        gate = random.Random(self.seed + 1)
        ev: list[tuple[float, int, str, float]] = []
        seq = itertools.count()
        running, queue, inflight, sent, done, t = 0, list[float](), 0, 0, 0, 0.0
        back = 0  # requests whose Retry-After ended, waiting for a place (ahead of new tasks)

        def push(at: float, kind: str, start: float = 0.0) -> None:
            heapq.heappush(ev, (at, next(seq), kind, start))

        def limit() -> int:
            return fixed if fixed is not None else ctl.allowed(10**9) if ctl else 1

        def serve(at: float, start: float) -> None:
            lat = self.lat + self.per_running * running + rng.uniform(-self.jitter, self.jitter)
            if self.slow and self.slow[0] <= at < self.slow[1]:
                lat *= self.slow[2]
            push(at + max(0.001, lat), "done", start)

        def arrive(at: float) -> None:
            nonlocal running
            if self.refuse and gate.random() < self.refuse:
                self.n429 += 1
                push(at + 0.001, "429", at)
            elif running < self.k:
                running += 1
                serve(at, at)
            elif len(queue) < self.q:
                queue.append(at)
            else:
                self.n429 += 1
                push(at + 0.001, "429", at)

        def fill(at: float) -> None:
            nonlocal inflight, sent, back
            while inflight < limit() and back:
                inflight += 1
                back -= 1
                arrive(at)
            while inflight < limit() and sent < tasks:
                inflight += 1
                sent += 1
                arrive(at)

        fill(0.0)
        push(0.5, "tick")
        if change:
            push(change[0], "capacity")
        while ev and done < tasks:
            t, _, kind, start = heapq.heappop(ev)
            if kind == "done":
                running -= 1
                if queue and running < self.k:
                    running += 1
                    serve(t, queue.pop(0))
                self.answers += 1
                if ctl:
                    ctl.observe(t, t - start, 200, None, inflight)
                inflight -= 1
                done += 1
                fill(t)
            elif kind == "429":
                self.answers += 1
                if ctl:
                    ctl.observe(t, t - start, 429, "http_429", inflight)
                # once the limit knows the refusals are not load, the request gives up its place while it waits
                # out Retry-After, then waits for one ahead of the new tasks, as in the worker
                # (client.Client._flow_wait, schedule.Schedule.back); until then it keeps it
                rest = ctl is not None and ctl.background_refusals
                if rest:
                    inflight -= 1
                    fill(t)
                push(t + self.retry_after, "back" if rest else "retry")
            elif kind == "back":
                back += 1
                fill(t)
            elif kind == "retry":
                arrive(t)
            elif kind == "tick":
                if ctl and self.server_metrics:
                    ctl.server(t, len(queue), running)
                if not (ctl and ctl.measuring):  # (a floor's re-measure, one window at half the limit, apart)
                    self.trace.append((t, limit()))
                push(t + 0.5, "tick")
            elif kind == "capacity" and change:
                self.k = change[1]
        return done / t

    def limits(self, t0: float, t1: float) -> list[int]:
        return [lim for t, lim in self.trace if t0 <= t < t1]


def best_fixed(k: int, q: int, tasks: int) -> float:
    return max(Sim(k, q).run(None, tasks, fixed=f) for f in (16, 32, 64, 128, 256))


def test_grows_to_its_maximum_while_latency_stays_at_its_floor() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=200))
    sim = Sim(k=10_000, q=0)
    sim.run(ctl, 20_000)
    assert ctl.limit == 200
    assert ctl.cuts == 0


def test_finds_the_knee_of_a_capacity_server_without_429s_and_near_the_best_fixed_throughput() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=64, q=64)
    rate = sim.run(ctl, 10_000)
    assert rate >= 0.9 * best_fixed(64, 64, 10_000)
    assert sim.n429 <= 0.01 * sim.answers
    settled = sim.limits(10, 30)
    assert settled and all(64 <= lim <= 128 for lim in settled), settled  # past K (full), short of K + Q (429s)


def test_follows_a_capacity_that_halves() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=64, q=64)
    sim.run(ctl, 16_000, change=(20.0, 32))
    before, after = sim.limits(15, 20), sim.limits(30, 40)
    assert min(before) >= 60  # at K or past it: the server full
    assert after and all(32 <= lim <= 64 + 8 for lim in after), after  # 32 slots + 64 queued: 429s past 96
    assert max(sim.limits(20, 30)[-1:]) <= 72  # within 10 s


def test_holds_the_servers_waiting_queue_near_its_target_when_the_server_reports_it() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, queue_target=4))
    sim = Sim(k=64, q=64, server_metrics=True)
    rate = sim.run(ctl, 10_000)
    assert sim.n429 == 0
    assert rate >= 0.9 * best_fixed(64, 64, 10_000)
    assert all(64 <= lim <= 64 + 16 for lim in sim.limits(5, 30))


def test_cuts_multiplicatively_once_on_a_burst_of_429s_then_judges_the_cut() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, initial=100))
    # 50 requests sent at t=0 all come back 429 at t=0.1: one cut, not fifty
    for i in range(50):
        ctl.observe(0.1 + i * 1e-4, 0.1, 429, "http_429", 100 - i)
    assert ctl.limit == 50 and ctl.cuts == 1
    # answers to requests sent after the cut judge it; until then no other cut
    now = 0.2
    for _ in range(30):
        now += 0.01
        ctl.observe(now, 0.05, 200, None, 50)
    # the share fell (all to none): it was load, the cut stands (and the limit grows on from there)
    assert 50 <= ctl.limit < 100 and ctl.cuts == 1 and ctl.undone == 0


def test_a_cut_is_undone_when_the_push_back_share_does_not_fall_and_that_share_becomes_the_baseline() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, initial=64))
    now, i = 1.0, 0
    statuses = [429, 200, 200, 429, 200, 200, 200, 429, 200, 200]  # 30 % refused, whatever the limit
    while ctl.cuts == 0:
        now += 0.001
        ctl.observe(now, 0.0005, statuses[i % 10], None, 64)
        i += 1
    assert ctl.limit == 32
    for _ in range(40):
        now += 0.001
        ctl.observe(now, 0.0005, statuses[i % 10], None, 32)
        i += 1
    assert ctl.undone == 1 and ctl.limit >= 64
    assert ctl.baseline is not None and 0.2 <= ctl.baseline <= 0.4
    # the same share later is no news: no cut
    cuts = ctl.cuts
    for _ in range(2000):
        now += 0.001
        ctl.observe(now, 0.0005, statuses[i % 10], None, ctl.limit)
        i += 1
    assert ctl.cuts == cuts and ctl.limit >= 64
    # a share well above it (more refused as more are sent) is: a cut again
    for _ in range(200):
        now += 0.001
        ctl.observe(now, 0.0005, 429 if i % 10 < 8 else 200, None, ctl.limit)
        i += 1
    assert ctl.cuts > cuts


def test_a_load_independent_refusal_share_does_not_collapse_the_limit() -> None:
    """30 % refused at once (Retry-After 1 s) whatever the load, no capacity limit: the limit does not sit at 1
    (issue 28: the old rule cut on every refusal and held 1), and the throughput is near the best fixed."""
    tasks = 3000
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=100_000, q=0, lat=0.05, jitter=0.01, refuse=0.3)
    rate = sim.run(ctl, tasks)
    best = max(Sim(k=100_000, q=0, lat=0.05, jitter=0.01, refuse=0.3).run(None, tasks, fixed=f)
               for f in (1, 4, 16, 64))
    assert rate >= 0.8 * best
    assert min(sim.limits(2, 10)) >= 16


def test_a_background_refusal_share_still_finds_the_knee_of_a_capacity_server() -> None:
    """20 % refused whatever the load in front of a K=64, Q=64 server: the limit neither collapses nor runs to
    its maximum. (Below 0.9 of the best fixed: a request waiting out its Retry-After holds its slot, and the
    limit, held near the knee by latency, counts them. The rule before issue 28 held 1 here: 0.01 of it.)"""
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=64, q=64, refuse=0.2)
    rate = sim.run(ctl, 10_000)
    assert rate >= 0.7 * max(Sim(64, 64, refuse=0.2).run(None, 10_000, fixed=f) for f in (64, 128, 256))
    settled = sim.limits(10, 40)
    assert settled and all(16 <= lim <= 200 for lim in settled), settled


def test_timeouts_and_503_push_back_but_other_errors_do_not() -> None:
    assert is_pushback(503, "http_503") and is_pushback(None, "timeout_read") and is_pushback(429, None)
    assert not is_pushback(500, "http_500") and not is_pushback(None, "connection_error")
    ctl = AdaptiveLimit(AdaptiveSettings(initial=64))
    ctl.observe(1.0, 0.5, None, "connection_error", 64)
    assert ctl.limit == 64
    ctl.observe(2.0, 0.5, None, "timeout_total", 64)
    assert ctl.limit == 32


def test_stays_within_one_and_the_supervisors_cap() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, initial=1))
    now = 0.0
    for _ in range(40):
        now += 1.0
        ctl.observe(now, 0.01, 429, "http_429", 1)
    assert ctl.limit == 1 and ctl.allowed(100) == 1
    for _ in range(400):  # fast answers: growth, but never past the cap it is given
        now += 0.1
        for _ in range(8):
            ctl.observe(now, 0.01, 200, None, ctl.limit, cap=20)
    assert ctl.limit == 20
    assert ctl.allowed(10) == 10  # the supervisor's cap is an upper bound at once


def test_an_application_limited_window_does_not_grow_the_limit() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, initial=64))
    now = 0.0
    for _ in range(200):  # only 2 requests in flight: nothing learnt about 64
        now += 0.1
        ctl.observe(now, 0.05, 200, None, 2)
    assert ctl.limit == 64


def test_fixed_concurrency_has_no_controller() -> None:
    def cfg(**kw: Any) -> WorkerConfig:
        return WorkerConfig(base_url="http://127.0.0.1:9/v1", **kw)

    assert adaptive_from_config(cfg(adaptive=False, concurrency=64)) is None
    ctl = adaptive_from_config(cfg(adaptive=True, concurrency=32))
    assert ctl is not None and ctl.s.max_limit == 32 and 1 <= ctl.limit <= 32 and ctl.slow_start
    # a replacement worker starts where its predecessor was, its limit past slow start
    ctl = adaptive_from_config(cfg(adaptive=True, concurrency=128, adaptive_start=70))
    assert ctl is not None and ctl.limit == 70 and not ctl.slow_start


def test_a_server_left_alone_past_its_knee_is_held_near_it_from_latency_alone() -> None:
    """Issue 28's surviving replica: K=32 served at once, a queue without end (no 429), no server metrics.
    Latency alone holds the limit within 1.5 K (the latency within 1.5 x its floor); Gradient2's sqrt(limit)
    added past the tolerance held it at ~1.7 K."""
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=32, q=100_000, lat=0.1, jitter=0.01)
    rate = sim.run(ctl, 8000)
    assert rate >= 0.95 * 32 / 0.1
    settled = sim.limits(5, 25)
    assert settled and all(32 <= lim <= 48 for lim in settled), settled


def test_a_floor_learnt_at_a_fast_moment_does_not_hold_the_limit_at_one_for_the_rest_of_the_run() -> None:
    """Issue 41's `transformers serve` run: the floor learnt while the server was fast, then the server's
    latency trebles for good (whatever the load). The limit comes down, but the floor is re-measured within
    seconds: the limit grows back rather than sitting at 1 to the end."""
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=100_000, q=0, lat=0.05, jitter=0.005, slow=(5.0, 1e9, 3.0))
    rate = sim.run(ctl, 40_000)
    assert min(sim.limits(5, 17)) >= 128  # never under half what the server sustained (Little's law)
    assert min(sim.limits(14, 17)) >= 200, sim.limits(5, 17)  # and back up once the floor is re-measured
    assert ctl.remeasured >= 1 and ctl.floor is not None and ctl.floor > 0.1
    assert rate >= 0.7 * 256 / 0.15


def test_a_burst_of_slowness_on_a_server_without_a_knee_is_left_behind() -> None:
    """A continuous-batching server (latency grows with the requests running, no 429) slowed 3x for 8 s by a
    burst of load on the machine: afterwards the limit returns to where it sat before, not 1."""
    def sim() -> Sim:
        return Sim(k=100_000, q=0, lat=0.02, jitter=0.002, per_running=0.002, slow=(10.0, 18.0, 3.0))
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    s = sim()
    s.run(ctl, 30_000)
    before = sorted(s.limits(5, 10))[len(s.limits(5, 10)) // 2]
    after = s.limits(28, 40)
    assert after and min(after) >= 0.7 * before, (before, after)


def test_after_a_slow_spell_the_limit_is_back_at_capacity_within_seconds() -> None:
    """Issue 41's recovery case: the K=64 server's latency rises 5x for 12 s and returns. Within 5 s of the end
    the limit is at 0.8 x K or more, and the throughput after it as the best fixed's."""
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=64, q=64, slow=(10.0, 22.0, 5.0))
    sim.run(ctl, 20_000)
    assert min(sim.limits(27, 40)) >= 0.8 * 64, sim.limits(20, 30)
    assert min(sim.limits(10, 22)) >= 16  # never far below what the server sustained (Little's law)


def test_fast_refusals_do_not_pull_the_latency_floor_down() -> None:
    """429s that come back at once (1 ms) beside answers that take 50 ms: the floor is the answers' latency."""
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256))
    sim = Sim(k=100_000, q=0, lat=0.05, jitter=0.005, refuse=0.3)
    sim.run(ctl, 5000)
    assert ctl.floor is not None and ctl.floor >= 0.04


def test_a_streams_latency_is_its_first_token() -> None:
    """Answers of any length: the signal is the time to the first token when there is one, so long answers
    after short ones are not read as a queue."""
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, initial=16))
    now = 0.0
    for i in range(4000):
        now += 0.002
        whole = 0.1 if i < 1000 else 2.0  # the answers grow 20x longer; the first token stays at 20 ms
        ctl.observe(now, whole, 200, None, ctl.limit, first_s=0.02)
    assert ctl.limit >= 128 and ctl.cuts == 0


def test_a_low_limit_says_why_and_which_concurrency_did_better() -> None:
    ctl = AdaptiveLimit(AdaptiveSettings(max_limit=256, initial=16))
    now = 0.0
    for _ in range(2000):  # 16 in flight, 10 ms each: ~1,600 answers/s at level 16
        now += 0.01 / 16
        ctl.observe(now, 0.01, 200, None, 16)
    assert ctl.reason(now) is None  # not low
    for _ in range(2000):  # the server slows: 10 ms a request in flight (a queue), the limit comes down
        lat = 0.01 * ctl.limit
        now += lat / ctl.limit
        ctl.observe(now, lat, 200, None, ctl.limit)
    assert ctl.limit < 8
    why = ctl.reason(now)
    assert why is not None
    text, better = why
    assert "latency" in text and "x its baseline" in text
    assert better >= 16  # (levels 16 to 64 served 1,600 answers/s; 1 or 2 serve 100-200)


def test_one_reading_of_a_status_for_the_client_the_limit_and_the_batch_planner() -> None:
    from evalsup.batch.plan import retryable
    from evalsup.worker.errors import RETRYABLE_KINDS, pushback, status_kind

    for status in (400, 401, 404, 408, 409, 422, 429, 500, 501, 502, 503, 504, 529):
        assert retryable(status, None) == (status_kind(status) in RETRYABLE_KINDS), status
    assert retryable(529, "overloaded_error") and not retryable(501, None)
    assert pushback(529, None) and pushback(503, None) and not pushback(500, None)


def test_the_progress_line_and_status_say_why_a_low_limit_is_low() -> None:
    from dataclasses import dataclass as dc

    from evalsup.supervisor.limits import limit_reason
    from evalsup.supervisor.progress import fmt_snapshot_plain
    from evalsup.tools.status import RunState, RunStatus, format_run

    @dc
    class W:
        conc_limit: int
        limit_why: list[Any] | None
        wire: int = 0
        ep_load: list[list[int]] | None = None
        alive: bool = True

    assert limit_reason([W(64, None), W(60, None)]) is None  # not low: nothing to say
    assert limit_reason([W(64, None), W(2, ["latency 3.1x its baseline", 8])]) is None  # the run's is not low
    why = limit_reason([W(2, ["latency 3.1x its baseline", 8]), W(3, ["latency 2.0x its baseline", 8])])
    assert why is not None and why.startswith("latency 3.1x its baseline") and "--concurrency 16" in why
    # a worker that measured nothing better: no setting to try
    assert "--concurrency" not in (limit_reason([W(2, ["latency 3.1x its baseline", 8]), W(2, ["x", 0])]) or "")
    snap = {"state": "running", "done": 10, "total": 100, "rate": 1.0, "eta_s": 90.0, "inflight": 2, "queued": 5,
            "failed": 0, "retries": 3, "workers_mb": [40.0], "conc_limit": 5, "limit_why": why}
    assert "(limit 5: latency 3.1x its baseline; --concurrency 16" in fmt_snapshot_plain(snap)
    text = format_run(RunStatus("r", RunState.RUNNING, in_flight=2, concurrency_limit=5, limit_why=why,
                                checkpoint_age_s=1.0))
    assert "limit 5: latency 3.1x its baseline" in text
