"""The supervisor's frames to a worker, one handler per kind (``Control.handlers``, a ``{FrameKind: handler}`` table).

TASK queues a task (``schedule.Schedule``); the rest steer the worker: PAUSE/RESUME (the memory throttle), LIMIT
(the supervisor's cap on requests in flight, and the judge's share of --judge-concurrency), RATE (this worker's
share of the rate limits, global and per endpoint), BREAKER_OPEN/BREAKER_CLOSE (an endpoint ejected, left out, or
back), PROBE (the breaker asks this worker to probe an endpoint), RELEASE (a ring line written), DRAIN (finish what
is in flight, hand the rest back), STALL (abandon the attempts on the wire for at least so many seconds: they fail
as ``timeout_stall`` and retry). Payloads are typed in ``ipc.messages``. No handler waits: the read loop calls them
in order, then starts whatever may start (``Schedule.pump``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from evalsup.ipc import FrameKind, decode_json, split_meta
from evalsup.ipc.ring import POS
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.pacing import Pacer
from evalsup.worker.pipes import Outbox
from evalsup.worker.schedule import Schedule


class Control:
    def __init__(self, schedule: Schedule, endpoints: EndpointPool, pacer: Pacer, outbox: Outbox,
                 probe: Callable[[int], None], drain: Callable[[], None], report: Callable[[], str],
                 abandon: Callable[[float, float], int] = lambda age, now: 0,
                 judge_limit: Callable[[int], None] = lambda n: None) -> None:
        self.schedule = schedule
        self.endpoints = endpoints
        self.pacer = pacer
        self.outbox = outbox
        self.probe = probe  # starts the breaker's probe of an endpoint (Client.probe), in the background
        self.drain = drain  # the worker drains: it ends once nothing is queued or in flight
        self.report = report  # the leak report's text (DRAIN with "report")
        self.abandon = abandon  # cuts the attempts on the wire that long (Client.abandon): STALL
        self.judge_limit = judge_limit  # LIMIT's "judge": this worker's share of --judge-concurrency (Judge.resize)
        self.handlers: dict[FrameKind, Callable[[memoryview], None]] = {
            FrameKind.TASK: self.task, FrameKind.RELEASE: self.release, FrameKind.PAUSE: self.pause,
            FrameKind.RESUME: self.resume, FrameKind.RATE: self.rate, FrameKind.BREAKER_OPEN: self.breaker_open,
            FrameKind.BREAKER_CLOSE: self.breaker_close, FrameKind.PROBE: self.probe_frame, FrameKind.LIMIT: self.limit,
            FrameKind.DRAIN: self.drain_frame, FrameKind.STALL: self.stall,
        }

    def on_frame(self, kind: FrameKind, payload: memoryview) -> None:
        handler = self.handlers.get(kind)
        if handler is not None:
            handler(payload)

    def task(self, payload: memoryview) -> None:
        meta, line = split_meta(payload)
        self.schedule.add(meta, line)

    def release(self, payload: memoryview) -> None:
        self.outbox.release(POS.unpack(payload)[0])

    def pause(self, payload: memoryview) -> None:
        self.schedule.paused = True

    def resume(self, payload: memoryview) -> None:
        self.schedule.paused = False

    def rate(self, payload: memoryview) -> None:
        self.endpoints.apply_rate(self.pacer, decode_json(payload))  # global and per endpoint (issue 21)

    def breaker_open(self, payload: memoryview) -> None:
        self._breaker(payload, True)

    def breaker_close(self, payload: memoryview) -> None:
        self._breaker(payload, False)

    def _breaker(self, payload: memoryview, is_open: bool) -> None:
        """One endpoint ejected (``out``: left out for good) / it rejoins (``was_down``: a probe had failed)."""
        b = decode_json(payload) if payload else {}  # ipc.messages.BreakerOpen, BreakerClose
        self.endpoints.set_open(int(b.get("e", 0)), is_open, bool(b.get("was_down")), out=bool(b.get("out")))

    def probe_frame(self, payload: memoryview) -> None:
        self.probe(int(decode_json(payload).get("e", 0)) if payload else 0)

    def limit(self, payload: memoryview) -> None:
        got = decode_json(payload)
        self.schedule.set_limit(int(got["inflight"]))
        if "judge" in got:
            self.judge_limit(int(got["judge"]))

    def stall(self, payload: memoryview) -> None:
        """The run saw no result for --stall-after: cut every attempt on the wire that long (ipc.messages.Stall)."""
        self.abandon(float(decode_json(payload)["age"]), time.monotonic())

    def drain_frame(self, payload: memoryview) -> None:
        if payload and decode_json(payload).get("report"):
            text = self.report()
            if text:
                self.outbox.leaks(text)
        # finish only what is in flight; hand the rest back (it may be paused, and it is going anyway), and
        # what is parked for an outage (it would hold the drain until the endpoint is back, or to --grace)
        keys = self.schedule.take_all()
        if keys:
            self.outbox.returned(keys)
        self.endpoints.hand_back()
        self.drain()


def leak_report(pid: int, done: int) -> str:
    """The top allocation sites of this worker (tracemalloc, by line), when it traces memory; else ""."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return ""
    snap = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
    stats = snap.statistics("lineno")[:25]
    lines = [f"top allocation sites of worker {pid} (tracemalloc, by line), {done} tasks done"]
    for s in stats:
        frame = s.traceback[0]
        lines.append(f"{frame.filename}:{frame.lineno}  size={s.size / 1024:,.1f} KiB  count={s.count}")
    return "\n".join(lines) + "\n"

