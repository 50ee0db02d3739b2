"""The supervisor's state and its verbs (after gunicorn's arbiter): the only code that spawns or kills a worker,
sends it frames or appends to the journal. ``inbox.Inbox`` adds what workers say, ``arbiter.Supervisor`` the loop."""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import Any

from evalsup.config import exitcodes as ex  # exit codes in one module (issue 19)
from evalsup.config.ratelimits import rate_share
from evalsup.config.run_config import RunConfig
from evalsup.ipc import FrameKind
from evalsup.ipc.frames import BufferPool
from evalsup.ipc.ring import ring_size_from_env
from evalsup.rundir.checkpoint import Checkpoint, JournalError, previous_fingerprint
from evalsup.rundir.journal import Journal
from evalsup.rundir.results_file import ResumeState
from evalsup.supervisor.endpoints import Endpoints
from evalsup.supervisor.ledger import TaskLedger
from evalsup.supervisor.memory import MemoryControl
from evalsup.supervisor.policies import RestartIntensity
from evalsup.supervisor.progress import LineCounter, RateWindow
from evalsup.supervisor.scaling import ScaleUp
from evalsup.supervisor.stats import RunStats
from evalsup.supervisor.workers import Exit, WorkerHandle
from evalsup.tasks.fingerprint import fingerprint
from evalsup.tasks.reader import TaskReader, TaskRef
from evalsup.tasks.records import output_line

MIB = 1 << 20


class RunRefused(Exception):
    """The run ended early; ``code`` is the exit code and the message says why and what to do."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code





class SupervisorCore:
    def __init__(self, cfg: RunConfig, log: Any = None) -> None:
        self.cfg = cfg
        self.log = log or (lambda msg: None)
        self.journal = Journal(cfg.run_dir)
        self.stats = RunStats()
        self.ledger = TaskLedger(cfg.max_task_crashes)
        self.frame_buffers = BufferPool()  # large results from the pipe are read into these, reused once written
        self.workers: list[WorkerHandle] = []
        self.active = cfg.first_workers  # worker slots in use (grows with autoscale, see supervisor.scaling)
        self.scaler = ScaleUp()
        self.reader: TaskReader | None = None
        self.fp: dict[str, Any] = {}
        self.credit = asyncio.Event()  # set when a credit returns or the set of workers changes
        self.stopping: str | None = None  # None, "drain" or "now"
        self.stop_code = 0
        self.stop_message = ""
        self.exhausted = False
        self.paused = False  # dispatch gate (memory throttle)
        self.resumed_from: ResumeState | None = None
        self._signals = 0
        self.finished = False
        self.memory: MemoryControl | None = None
        self.intensity = RestartIntensity(cfg.max_restarts, 60.0)
        self.endpoints = Endpoints(cfg.worker.endpoints, cfg.max_wait_down_s)  # a breaker each (issue 21)
        self.events: Any = lambda kind, **fields: None
        self.counter = LineCounter(cfg.tasks_path, cfg.shard[1] if cfg.shard else 1)
        self.rate = RateWindow(time.monotonic())  # results a second, for the progress (supervisor.progress)
        self.metrics: Any = None
        self._bg: set[asyncio.Task[Any]] = set()
        self._backlogged = False  # reading results is held until the journal's writer catches up

    # what workers say (supervisor.inbox)
    def _on_frame(self, w: WorkerHandle, kind: FrameKind, payload: memoryview) -> None:
        raise NotImplementedError

    async def _reap(self, w: WorkerHandle) -> None:
        raise NotImplementedError

    # ----- set-up -----

    def _open(self) -> None:
        cfg = self.cfg
        if not cfg.tasks_path.is_file():
            raise RunRefused(f"{cfg.tasks_path}: no such file", ex.BAD_INPUT)
        self.fp = fingerprint(cfg.tasks_path, previous_fingerprint(cfg.run_dir))  # resume: hash only if written
        if cfg.shard is not None:
            self.fp["shard"] = list(cfg.shard)
        try:
            state = self.journal.prepare(self.fp, str(cfg.tasks_path))
        except JournalError as e:
            raise RunRefused(str(e), e.code) from None  # 2: changed input/settings, damaged; EXIT_DISK: disk
        if state is None:
            self.reader = TaskReader(cfg.tasks_path, cfg.max_line_bytes)
            return
        cp = state.checkpoint
        self.resumed_from = state
        self.reader = TaskReader(cfg.tasks_path, cfg.max_line_bytes, cp.frontier, cp.line_no, cp.index)
        if cp.ids_len:
            self.reader.ids.load(self.journal.read_ids(cp.ids_len))
        self.stats.succeeded = cp.succeeded + state.succeeded_after
        self.stats.failed = cp.failed + state.failed_after
        self.stats.invalid = cp.invalid
        self.stats.restore(cp.counters)
        self.ledger.restore(cp.outstanding, state.done_after)

    # ----- verbs: the only code that spawns, kills, sends frames or writes -----

    async def spawn(self, slot: int) -> WorkerHandle:
        share = self.cfg.per_worker_concurrency(self.active)[slot]
        # with autoscale, a worker can take all of --concurrency: its share shrinks as workers are added
        conc = self.cfg.concurrency if self.cfg.autoscale else share
        w = WorkerHandle(slot, conc, self.cfg.window_for(share), {}, share)
        w.held = self.ledger.open(w.id)
        # a replacement starts from its predecessor's adaptive limit, not from scratch (issue 21)
        start = max((x.conc_limit for x in self.workers if x.slot == slot), default=0)
        config = self.cfg.worker.to_wire() | {"concurrency": conc, "limit": self._worker_cap(w),
                                              "adaptive_start": start}
        await w.spawn(config, lambda kind, payload: self._on_frame(w, kind, payload), self.frame_buffers,
                      ring_size_from_env(self.active))  # a first worker alone gets all of the rings' budget
        if self.memory is not None:
            w.task_limit = self.memory.recycle.task_limit_for_new_worker()
        elif self.cfg.max_tasks_per_worker:  # the first workers start before the memory control exists
            w.task_limit = self.cfg.max_tasks_per_worker + random.randint(0, self.cfg.max_tasks_jitter)
        if self.paused:
            w.send(FrameKind.PAUSE)
        if self._backlogged and w.stream is not None:
            w.stream.hold("backlog")
        for ejected in self.endpoints.open_frames():  # endpoints ejected or left out (issue 21)
            w.send(FrameKind.BREAKER_OPEN, ejected)
        self.workers.append(w)
        self._send_rates()
        w.reader_task = asyncio.create_task(self._reap(w))
        return w

    def replace(self, w: WorkerHandle) -> None:
        """Start the worker that will take w's place (once), e.g. ahead of a recycle on task count."""
        if w.replaced or self.stopping is not None:
            return
        w.replaced = True
        t = asyncio.create_task(self.spawn(w.slot))
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        t.add_done_callback(lambda _: self.credit.set())

    def recycle(self, w: WorkerHandle, cause: str) -> None:
        """Past the hard RSS limit a worker is killed at once; otherwise it gets no new task and is drained
        (finishes what it holds, then exits). Its replacement starts at once, if not already."""
        if self.stopping is not None or not w.alive or (w.recycling and cause != "hard_kill"):
            return
        w.recycling = True
        self.stats.recycles[cause] += 1
        self.events("recycle", cause=cause, pid=w.pid, rss=w.rss, done=w.done)
        if self.metrics is not None:
            self.metrics.recycles.labels(cause).inc()
        if cause == "hard_kill":
            self.log(f"worker {w.pid}: RSS {w.rss / MIB:,.0f} MiB past the hard limit; killing and replacing it")
            w.kill(Exit.HARD_KILL)
        else:
            why = f"RSS {w.rss / MIB:,.0f} MiB" if cause == "rss" else f"{w.done} tasks done"
            self.log(f"worker {w.pid}: {why}; recycling it (drain, a fresh one takes its place)")
            w.drain(report=cause == "rss" and self.cfg.worker.trace_memory)
        self.replace(w)
        self.credit.set()

    def poison(self, ref: TaskRef) -> None:
        """A task that killed its worker --max-task-crashes times is written as failed (worker_crashed)."""
        msg = f"the worker died {ref.crashes} times while holding this task (line {ref.line_no})"
        line = output_line(ref.id, status=None, request_id=None, body=None,
                           error={"code": "worker_crashed", "message": msg},
                           metrics={"latency_s": None, "attempts": ref.crashes, "worker": None}, metadata=None)
        self.journal.append(line)
        self.stats.on_poisoned(ref.id)
        self.log(f"task {ref.id!r} (line {ref.line_no}) killed its worker {ref.crashes} times; "
                 "written as failed (worker_crashed)")

    async def checkpoint(self, finished: bool = False) -> None:
        """Snapshot F/O and the counts with no await in between; the journal's writer makes every result
        handed over before it durable and writes checkpoint.json with the results length that covers them."""
        assert self.reader is not None
        j, led = self.journal, self.ledger
        j.append_ids(self.reader.ids.take_log())
        cp = Checkpoint(
            fingerprint=self.fp, frontier=self.reader.offset, line_no=self.reader.line_no, index=self.reader.index,
            outstanding=list(led.outstanding()), ids_len=j.ids_length(),
            invalid_len=j.invalid_length(), succeeded=self.stats.succeeded, failed=self.stats.failed,
            invalid=self.stats.invalid, counters=self.stats.counters(),
            finished=finished, done_ahead=sorted(led.done_ahead), pid=os.getpid(),
        )
        self.events("progress", **self.stats.progress())  # the report's time series (tokens, errors by code)
        await j.checkpoint(cp)

    def stop(self, message: str, code: int, mode: str, hand_back: bool = False) -> None:
        """Stop dispatching: "now" ends the workers; "drain" lets them finish what they hold (within --grace),
        or with ``hand_back`` (SIGTERM) only the requests on the wire: the tasks queued in them and requests
        parked for an outage come back at once, outstanding for the rerun."""
        if self.stopping == "now" or (self.stopping == "drain" and mode == "drain"):
            return
        if self.stopping is None:
            self.stop_message, self.stop_code = message, code
        self.stopping = mode
        if mode == "drain" and hand_back:
            for w in self.workers:
                w.drain()
        self.credit.set()

    def _send_rates(self) -> None:
        """Split the rate limits, global and per endpoint, among the live workers: together they never exceed
        them (evalsup.config.ratelimits)."""
        cfg = self.cfg
        live = [w for w in self.workers if w.alive]
        share = rate_share(cfg.max_requests_per_s, cfg.max_tokens_per_min, cfg.endpoint_rates, cfg.arrivals, len(live))
        if share is None:
            return
        for w in live:
            w.send(FrameKind.RATE, share)

    def _broadcast(self, kind: FrameKind, obj: Any = None) -> None:
        for w in self.workers:
            w.send(kind, obj)

    def _worker_cap(self, w: WorkerHandle) -> int:
        """Requests w may have in flight: its share, less under the memory control's cap."""
        cap = self.cfg.concurrency if self.memory is None else self.memory.cap
        return max(1, min(w.share, cap * w.share // self.cfg.concurrency))

