"""The supervisor's one loop: read tasks, hand them to workers by credit, write results, and spawn,
reap and replace workers (after gunicorn's arbiter). Policies live in small objects; this wires them."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import signal
import time
from typing import Any

import orjson

from evalsup.check import CheckFailed, check_endpoint
from evalsup.config import RunConfig
from evalsup.ipc import Kind, decode_json, split_meta
from evalsup.ipc.frames import KEY, BufferPool, ProtocolError, quiet_gc
from evalsup.ipc.ring import ring_size_from_env
from evalsup.journal import Checkpoint, Journal, JournalError, ResumeState
from evalsup.supervisor.breaker import EndpointBreaker
from evalsup.supervisor.events import EventLog
from evalsup.supervisor.limits import limit_total  # issue 21
from evalsup.supervisor.memory import MemoryControl
from evalsup.supervisor.policies import RestartIntensity
from evalsup.supervisor.progress import LineCounter, LiveDisplay, fmt_snapshot_plain
from evalsup.supervisor.scaling import ScaleUp, cpu_seconds
from evalsup.supervisor.stats import RunStats
from evalsup.supervisor.workers import State, WorkerHandle
from evalsup.tasks import TaskError, TaskReader, TaskRef, fingerprint, output_line, read_line_at

MIB = 1 << 20


class RunStopped(Exception):
    """The run ended early; ``code`` is the exit code and the message says why and what to do."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Supervisor:
    def __init__(self, cfg: RunConfig, log: Any = None) -> None:
        self.cfg = cfg
        self.log = log or (lambda msg: None)
        self.journal = Journal(cfg.run_dir)
        self.stats = RunStats()
        self.frame_buffers = BufferPool()  # large results from the pipe are read into these, reused once written
        if ring_size_from_env(cfg.workers):  # large results come through shared-memory rings (ipc.ring)
            self.journal.on_written = self._release_rings  # a ring's space is free once its lines are written
        self.workers: list[WorkerHandle] = []
        self.active = cfg.first_workers  # worker slots in use (grows with autoscale, see supervisor.scaling)
        self.scaler = ScaleUp()
        self.redo: collections.deque[TaskRef] = collections.deque()  # tasks to hand out before new ones
        # tasks that were being worked on when a worker died: each goes to a worker holding no other suspect,
        # so a poison task cannot take innocent tasks down with it again and again
        self.suspects: collections.deque[TaskRef] = collections.deque()
        self.skip_ids: set[str] = set()  # D: finished after the last checkpoint of an earlier run
        self.reader: TaskReader | None = None
        self.fp: dict[str, Any] = {}
        self.credit = asyncio.Event()  # set when a credit returns or the set of workers changes
        self.stopping: str | None = None  # None, "drain" or "now"
        self.stop_code = 0
        self.stop_message = ""
        self.exhausted = False
        self.started = time.monotonic()
        self.paused = False  # dispatch gate (memory throttle, endpoint down)
        self.resumed_from: ResumeState | None = None
        self._signals = 0
        self.finished = False
        self.memory: MemoryControl | None = None
        self.intensity = RestartIntensity(cfg.max_restarts, 60.0)
        self.breaker = EndpointBreaker(max_down_s=cfg.max_wait_down_s)
        self.events: Any = lambda kind, **fields: None
        self.counter = LineCounter(cfg.tasks_path, cfg.shard[1] if cfg.shard else 1)
        self._rate_samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=120)
        self.metrics: Any = None
        self._stuck_since: float | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self._backlogged = False  # reading results is held until the journal's writer catches up
        self.journal.on_error = self._on_journal_error
        self.journal.on_backlog_low = self._on_backlog_low

    # ----- set-up -----

    def _open(self) -> None:
        cfg = self.cfg
        if not cfg.tasks_path.is_file():
            raise RunStopped(f"{cfg.tasks_path}: no such file", 2)
        self.fp = fingerprint(cfg.tasks_path)
        if cfg.shard is not None:
            self.fp["shard"] = list(cfg.shard)
        try:
            state = self.journal.prepare(self.fp, str(cfg.tasks_path))
        except JournalError as e:
            raise RunStopped(str(e), 2) from None
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
        d = set(state.done_after)
        for ref in sorted(cp.outstanding, key=lambda r: r.offset):
            if ref.id in d:
                d.discard(ref.id)
            elif ref.crashes:
                self.suspects.append(ref)
            else:
                self.redo.append(ref)
        self.skip_ids = d

    def _worker_config(self, concurrency: int, limit: int) -> dict[str, Any]:
        d = self.cfg.worker.to_dict()
        d["concurrency"] = concurrency
        d["limit"] = limit
        return d

    async def _start_worker(self, slot: int) -> WorkerHandle:
        share = self.cfg.per_worker_concurrency(self.active)[slot]
        # with autoscale, a worker can take all of --concurrency: its share shrinks as workers are added
        conc = self.cfg.concurrency if self.cfg.autoscale else share
        w = WorkerHandle(slot, conc, self.cfg.window_for(share), share)
        wcfg = self._worker_config(conc, self._worker_cap(w))
        # issue 21: a replacement starts from its predecessor's adaptive limit, not from scratch
        wcfg["adaptive_start"] = max((x.conc_limit for x in self.workers if x.slot == slot), default=0)
        await w.spawn(wcfg,
                      lambda kind, payload: self._on_frame(w, kind, payload), self.frame_buffers,
                      ring_size_from_env(self.active))  # a first worker alone gets all of the rings' budget
        if self.memory is not None:
            w.task_limit = self.memory.recycle.task_limit_for_new_worker()
        elif self.cfg.max_tasks_per_worker:  # the first workers start before the memory control exists
            w.task_limit = self.cfg.max_tasks_per_worker + random.randint(0, self.cfg.max_tasks_jitter)
        if self.paused:
            w.send(Kind.PAUSE)
        if self._backlogged and w.stream is not None:
            w.stream.hold("backlog")
        if self.breaker.open:
            w.send(Kind.BREAKER_OPEN)
        self.workers.append(w)
        self._send_rates()
        w.reader_task = asyncio.create_task(self._read_worker(w))
        return w

    # ----- worker side -----

    async def _read_worker(self, w: WorkerHandle) -> None:
        assert w.proc is not None and w.stream is not None
        err = await w.stream.closed
        if err is not None:
            self.log(f"worker {w.pid}: broken pipe ({err})")
            w.kill("crashed")
        rc = await w.proc.wait()
        self._on_exit(w, rc)

    def _on_frame(self, w: WorkerHandle, kind: Kind, payload: memoryview) -> None:
        if kind is Kind.RESULT:
            self._on_result(w, payload)
        elif kind is Kind.RETURNED:
            for k in decode_json(payload).get("keys", []):
                ref = w.outstanding.pop(k, None)
                if ref is not None:
                    ref.started = False
                    (self.suspects if ref.crashes else self.redo).appendleft(ref)
            self.credit.set()
        elif kind is Kind.STARTED:
            for (k,) in KEY.iter_unpack(payload):
                ref = w.outstanding.get(k)
                if ref is not None:
                    ref.started = True
        elif kind is Kind.HEARTBEAT:
            w.last_beat = time.monotonic()
            hb = decode_json(payload)
            w.parked = int(hb.get("parked", 0))
            w.conc_limit = int(hb.get("limit") or 0)  # issue 21: the adaptive limit, summed for display
        elif kind is Kind.TRIP:
            self._on_trip(w, str(decode_json(payload).get("reason", "")))
        elif kind is Kind.PROBE_RESULT:
            r = decode_json(payload)
            self._on_probe_result(bool(r.get("ok")), str(r.get("detail", "")))
        elif kind is Kind.READY:
            if w.state is State.STARTING:
                w.state = State.READY
            w.last_beat = time.monotonic()
            self.credit.set()
        elif kind is Kind.FATAL:
            w.fatal = str(decode_json(payload).get("message"))
        elif kind is Kind.LEAKS:
            self._write_leaks(w, str(decode_json(payload).get("text", "")))

    def _on_result(self, w: WorkerHandle, payload: memoryview) -> None:
        meta, line = split_meta(payload)
        ref = w.outstanding.pop(meta["k"], None)
        if ref is None:
            return  # not ours any more (cannot happen while one worker owns each task)
        sh = meta.get("sh")
        if sh is not None:  # the line is in the worker's ring: the journal writes it from there
            try:
                if w.ring is None:
                    raise ProtocolError("a result in a ring that was never made")
                line = w.ring.line(int(sh[0]), int(sh[1]), self.journal.appended + int(sh[1]))
            except (ProtocolError, TypeError, ValueError, IndexError) as e:
                # the task stays the worker's, so it is handed on with the others when the broken worker goes
                w.outstanding[meta["k"]] = ref
                raise ProtocolError(f"bad ring reference {sh!r}") from e
            self.stats.ring_results += 1
        self.journal.append(line)
        self._count_result(w, meta)
        if self.journal.backlog > Journal.BACKLOG_HIGH and not self._backlogged:
            self.journal.flush()  # the writer's progress is what releases the hold: give it all there is
            self._backlogged = True  # the disk is behind: read no more results until it catches up
            self.events("disk_behind", backlog=self.journal.backlog)
            for x in self.workers:
                if x.stream is not None:
                    x.stream.hold("backlog")

    def _release_rings(self) -> None:
        """After each write of the journal (``on_written``), the only time ``written`` moves."""
        written = self.journal.written
        for w in self.workers:
            w.release_ring(written)

    def _on_backlog_low(self) -> None:
        if self._backlogged:
            self._backlogged = False
            for x in self.workers:
                if x.stream is not None:
                    x.stream.release("backlog")

    def _on_journal_error(self, message: str) -> None:
        self._stop(f"{message}; the run directory still describes what is safely on disk", 1, "now")

    def _count_result(self, w: WorkerHandle, meta: dict[str, Any]) -> None:
        if meta["ok"]:
            self.stats.succeeded += 1
        else:
            self.stats.failed += 1
        self.stats.session_done += 1
        self.stats.latency.add(float(meta["lat"]))
        self.stats.retries += max(0, int(meta.get("att", 1)) - 1)
        if meta.get("ec"):
            self.stats.errors[meta["ec"]] = self.stats.errors.get(meta["ec"], 0) + 1
        if meta.get("ttft") is not None:
            self.stats.ttft.add(float(meta["ttft"]))
        if self.metrics is not None:
            self.metrics.on_result(bool(meta["ok"]), float(meta["lat"]), meta.get("ttft"),
                                   max(0, int(meta.get("att", 1)) - 1))
        if meta.get("sc"):
            self.stats.scores.add(meta["sc"])
        if "chk" in meta:
            self.stats.bodies_checked += 1
        self.stats.prompt_tokens += int(meta.get("pt") or 0)
        self.stats.completion_tokens += int(meta.get("ct") or 0)
        if self.memory is not None and meta["ok"]:
            self.memory.budget.observe(int(meta.get("rb", 0)))
        w.done += 1
        if w.credits >= w.refill or self.exhausted or self.suspects or self.stopping is not None:
            self.credit.set()  # wake the dispatcher only when it has something to do: a refill, the end
        if w.task_limit is not None and not w.recycling:
            if w.done >= w.task_limit:
                self._begin_recycle(w, "tasks")
            elif w.done >= w.task_limit - max(w.window, w.task_limit // 10):
                self._ensure_replacement(w)  # warm up its successor, so the recycle costs no throughput

    def _on_exit(self, w: WorkerHandle, rc: int) -> None:
        planned = w.state is State.DRAINING or (w.state is State.KILLED and w.kill_cause in ("stop", "hard_kill"))
        cause = w.kill_cause if w.state is State.KILLED else ("drained" if w.state is State.DRAINING else "crashed")
        w.state = State.GONE
        if w in self.workers:
            self.workers.remove(w)
        died = cause in ("crashed", "hung", "hard_kill")
        for ref in sorted(w.outstanding.values(), key=lambda r: r.offset, reverse=True):
            if died and ref.started:  # only what it was working on; queued tasks are not suspects
                ref.crashes += 1
            ref.started = False
            if ref.crashes >= self.cfg.max_task_crashes:
                self._poison(ref)
            elif ref.crashes:
                self.suspects.appendleft(ref)
            else:
                self.redo.appendleft(ref)
        w.outstanding.clear()
        self.credit.set()
        self._send_rates()
        if w.fatal and self.stopping is None:
            self._stop(f"worker could not start: {w.fatal}", 2, "now")
            return
        if self.stopping is not None or planned:
            return
        self.stats.restarts["hung" if cause == "hung" else "crashed"] += 1
        self.events("restart", cause="hung" if cause == "hung" else "crashed", pid=w.pid, exit=rc)
        if self.metrics is not None:
            self.metrics.restarts.labels("hung" if cause == "hung" else "crashed").inc()
        if self.intensity.record(time.monotonic()):
            self._stop(f"more than {self.cfg.max_restarts} unplanned worker restarts within 60s (last: worker "
                       f"{w.pid} {cause}, exit {rc}); stopping instead of crash-looping", 1, "now")
            return
        self.log(f"worker {w.pid} {'hung' if cause == 'hung' else f'exited ({rc})'}; "
                 f"{len(self.redo) + len(self.suspects)} task(s) handed on; "
                 + ("its successor was already starting" if w.replaced else "starting a new one"))
        self._ensure_replacement(w)

    def _write_leaks(self, w: WorkerHandle, text: str) -> None:
        d = self.cfg.run_dir / "leaks"
        try:
            d.mkdir(exist_ok=True)
            (d / f"worker-{w.pid}.txt").write_text(text)
        except OSError as e:
            self.log(f"cannot write leak report of worker {w.pid}: {e.strerror}")
        else:
            self.log(f"worker {w.pid}: top allocation sites written to {d / f'worker-{w.pid}.txt'}")

    # ----- the endpoint -----

    def _send_rates(self) -> None:
        """Split the global rate limits among the live workers: together they never exceed them."""
        cfg = self.cfg
        if not cfg.max_requests_per_s and not cfg.max_tokens_per_min:
            return
        live = [w for w in self.workers if w.alive]
        if not live:
            return
        n = len(live)
        share = {"rps": cfg.max_requests_per_s / n if cfg.max_requests_per_s else None,
                 "tpm": cfg.max_tokens_per_min / n if cfg.max_tokens_per_min else None, "arrivals": cfg.arrivals}
        for w in live:
            w.send(Kind.RATE, share)

    def _on_trip(self, w: WorkerHandle, reason: str) -> None:
        if self.breaker.trip(time.monotonic(), reason):
            self.log(f"endpoint looks down ({reason}); pausing dispatch and probing it, no task is failed meanwhile "
                     f"(gives up after --max-wait-down {self.cfg.max_wait_down_s:g}s)")
            self.events("breaker_open", reason=reason)
            for x in self.workers:
                x.send(Kind.BREAKER_OPEN)
        elif self.breaker.open:
            w.send(Kind.BREAKER_OPEN)

    def _on_probe_result(self, ok: bool, detail: str) -> None:
        now = time.monotonic()
        if self.breaker.probe_result(ok, now):
            self.log(f"endpoint is back after {now - self.breaker.opened_at:.1f}s; resuming")
            self.events("breaker_close", down_s=round(now - self.breaker.opened_at, 3))
            for w in self.workers:
                w.send(Kind.BREAKER_CLOSE)
            self.credit.set()
        elif self.breaker.open and not ok:
            self.log(f"endpoint still down ({detail}); next probe in {self.breaker.interval:g}s")

    def _breaker_tick(self, now: float) -> None:
        b = self.breaker
        if not b.open:
            return
        if b.down_too_long(now):
            self._stop(f"the endpoint has been down for more than --max-wait-down {self.cfg.max_wait_down_s:g}s "
                       f"({b.reason})", 1, "now")
            return
        if b.probe_due(now):
            ready = [w for w in self.workers if w.state is State.READY]
            if ready:
                target = max(ready, key=lambda x: x.parked)
                target.send(Kind.PROBE)
                b.probe_sent(now)

    # ----- memory -----

    def _worker_cap(self, w: WorkerHandle) -> int:
        """Requests w may have in flight: its share, less under the memory control's cap."""
        cap = self.cfg.concurrency if self.memory is None else self.memory.cap
        return max(1, min(w.share, cap * w.share // self.cfg.concurrency))

    def _maybe_scale(self, mem: MemoryControl) -> None:
        """Automatic worker count (supervisor.scaling): one more while each worker is CPU-bound and there is
        work left, memory to spare and no worker starting."""
        now = time.monotonic()
        takers = [w for w in self.workers if w.state is State.READY and not w.recycling]
        self.scaler.observe(now, ((w.pid, c) for w in takers if (c := cpu_seconds(w.pid)) is not None))
        if (self.active >= self.cfg.workers or self.paused or self.stopping is not None or self.exhausted
                or any(w.state is State.STARTING for w in self.workers)
                or mem.cap < self.cfg.concurrency
                or not self.scaler.wants_more(now)):
            return
        loads = [round(v, 3) for v in self.scaler.loads.values()]
        self.scaler.changed(now)
        self.active += 1
        mem.set_workers(self.active)
        shares = self.cfg.per_worker_concurrency(self.active)
        for w in takers:
            w.share = shares[w.slot]
            w.window = self.cfg.window_for(w.share)
            w.send(Kind.LIMIT, {"inflight": self._worker_cap(w)})
        self.events("scale", workers=self.active, loads=loads)
        self.log(f"workers: each one busy ({', '.join(f'{v:.0%}' for v in loads)} of a core); adding worker "
                 f"{self.active} of at most {self.cfg.workers}")
        t = asyncio.create_task(self._start_worker(self.active - 1))
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        t.add_done_callback(lambda _: self.credit.set())

    def _update_gauges(self) -> None:
        m, mem = self.metrics, self.memory
        assert m is not None and mem is not None
        m.inflight.set(self._outstanding())
        m.throttled.set(1 if self.paused else 0)
        m.endpoint_down.set(1 if self.breaker.open else 0)
        m.worker_rss.clear()
        for w in self.workers:
            if w.alive and w.rss:  # 0 until the first sample
                m.worker_rss.labels(str(w.slot)).set(w.rss)
        m.supervisor_rss.set(mem.last_supervisor_rss)
        m.cgroup_usage.set(mem.last_ws)
        m.cgroup_limit.set(mem.limit or 0)
        m.concurrency_limit.set(limit_total(self.workers))  # issue 21

    async def _monitor(self) -> None:
        assert self.memory is not None
        mem = self.memory
        while True:
            await asyncio.sleep(self.cfg.monitor_interval_s)
            mem.concurrency_limit = limit_total(self.workers)  # issue 21: into memory.jsonl
            dec = mem.tick(self.workers, self.paused, self.log, self.stats.done)
            for w in self.workers:
                self.stats.peak_rss["worker_max"] = max(self.stats.peak_rss["worker_max"], w.rss)
            if self.metrics is not None:
                self._update_gauges()
            sup = mem.last_supervisor_rss
            self.stats.peak_rss["supervisor"] = max(self.stats.peak_rss["supervisor"], sup)
            self.stats.peak_rss["total"] = max(self.stats.peak_rss["total"], sup + sum(w.rss for w in self.workers))
            if dec.throttle == "pause":
                self.paused = True
                self.events("pause", working_set=mem.last_ws)
                why = "above the high mark" if mem.watermark and mem.last_ws >= mem.watermark.high_bytes else \
                    f"kernel reports pressure ({', '.join(mem.pressure.reasons)})"
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use, {why}; pausing dispatch")
                for w in self.workers:
                    w.send(Kind.PAUSE)
            elif dec.throttle == "resume":
                self.paused = False
                self.events("resume", working_set=mem.last_ws)
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use, below the low mark; resuming")
                for w in self.workers:
                    w.send(Kind.RESUME)
                self.credit.set()
            if dec.inflight_cap is not None:
                for w in self.workers:
                    w.send(Kind.LIMIT, {"inflight": self._worker_cap(w)})
            for w, cause in dec.recycle:
                self._begin_recycle(w, cause)
            self._unstick(mem)
            if self.cfg.autoscale:
                self._maybe_scale(mem)

    def _unstick(self, mem: MemoryControl) -> None:
        """Paused with no request in flight (tasks may wait queued in workers) and still above the low mark:
        idle workers' RSS (CPython keeps what it freed) holds the pause forever. Recycle the largest worker to
        give memory back, one every 2 s."""
        started = any(r.started for w in self.workers for r in w.outstanding.values())
        if not self.paused or started or self.stopping is not None:
            self._stuck_since = None
            return
        now = time.monotonic()
        if self._stuck_since is None:
            self._stuck_since = now
            return
        if now - self._stuck_since < 2.0:
            return
        self._stuck_since = now
        idle = [w for w in self.workers if w.state is State.READY and not w.recycling]
        if idle:
            w = max(idle, key=lambda x: x.rss)
            self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use with nothing in flight (above the low mark); "
                     f"recycling the largest worker ({w.rss / MIB:,.0f} MiB) to give memory back")
            self._begin_recycle(w, "rss")

    def _begin_recycle(self, w: WorkerHandle, cause: str) -> None:
        """Replace a worker: past the hard RSS limit it is killed at once; otherwise it gets no new task and
        is drained (finishes what it holds, then exits). Its replacement starts at once, if not already."""
        if self.stopping is not None or not w.alive or (w.recycling and cause != "hard_kill"):
            return
        w.recycling = True
        self.stats.recycles[cause] += 1
        self.events("recycle", cause=cause, pid=w.pid, rss=w.rss, done=w.done)
        if self.metrics is not None:
            self.metrics.recycles.labels(cause).inc()
        if cause == "hard_kill":
            self.log(f"worker {w.pid}: RSS {w.rss / MIB:,.0f} MiB past the hard limit; killing and replacing it")
            w.kill("hard_kill")
        else:
            why = f"RSS {w.rss / MIB:,.0f} MiB" if cause == "rss" else f"{w.done} tasks done"
            self.log(f"worker {w.pid}: {why}; recycling it (drain, a fresh one takes its place)")
            w.drain(report=cause == "rss" and self.cfg.worker.trace_memory)
        self._ensure_replacement(w)
        self.credit.set()

    def _ensure_replacement(self, w: WorkerHandle) -> None:
        """Start the worker that will take w's place (once), e.g. ahead of a recycle on task count."""
        if w.replaced or self.stopping is not None:
            return
        w.replaced = True
        t = asyncio.create_task(self._start_worker(w.slot))
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        t.add_done_callback(lambda _: self.credit.set())

    def _poison(self, ref: TaskRef) -> None:
        msg = f"the worker died {ref.crashes} times while holding this task (line {ref.line_no})"
        line = output_line(ref.id, status=None, request_id=None, body=None,
                           error={"code": "worker_crashed", "message": msg},
                           metrics={"latency_s": None, "attempts": ref.crashes, "worker": None}, metadata=None)
        self.journal.append(line)
        self.stats.failed += 1
        self.stats.session_done += 1
        self.stats.poisoned.append(ref.id)
        self.log(f"task {ref.id!r} (line {ref.line_no}) killed its worker {ref.crashes} times; "
                 "written as failed (worker_crashed)")

    # ----- dispatch -----

    def _outstanding(self) -> int:
        return sum(len(w.outstanding) for w in self.workers)

    def _next_task(self) -> tuple[TaskRef, bytes] | None:
        cfg = self.cfg
        assert self.reader is not None
        if self.redo:
            ref = self.redo.popleft()
            return ref, read_line_at(cfg.tasks_path, ref.offset, cfg.max_line_bytes)
        while not self.exhausted:
            try:
                got = self.reader.next()
            except TaskError as e:
                if cfg.on_invalid == "skip":
                    self.stats.invalid += 1
                    self.journal.append_invalid(orjson.dumps(
                        {"line": e.line_no, "offset": e.offset, "error": e.reason},
                        option=orjson.OPT_APPEND_NEWLINE))
                    continue
                self.reader.unread()  # a rerun must meet this line again, not read on past it
                self._stop(f"{e}  (use --on-invalid skip to record bad lines in invalid.jsonl and go on)", 2,
                           "drain")
                return None
            if got is None:
                self.exhausted = True
                return None
            ref, line, index = got
            if cfg.shard is not None and index % cfg.shard[1] != cfg.shard[0]:
                continue  # another shard's line (still validated, and its id still counts for duplicates)
            if ref.id in self.skip_ids:
                self.skip_ids.discard(ref.id)
                continue
            return ref, line
        return None

    def _pick_worker(self, suspect_free: bool = False) -> WorkerHandle | None:
        """The worker with the most free credits, if it has a refill's worth (so that a refill sends many
        tasks in one write); for a suspect, any credit will do, but only with a worker holding no other."""
        best: WorkerHandle | None = None
        for w in self.workers:
            c = w.credits
            if c >= (1 if suspect_free else w.refill) and (best is None or c > best.credits):
                if suspect_free and any(r.crashes for r in w.outstanding.values()):
                    continue
                best = w
        return best

    async def _wait_credit(self) -> None:
        self.credit.clear()
        await self.credit.wait()

    def _may_dispatch(self) -> bool:
        return self.stopping is None and not self.paused and not self.breaker.open

    async def _dispatch(self) -> None:
        """Hand out tasks until the input is done and nothing is outstanding, or a stop is asked."""
        while self.stopping is None:
            if not self._may_dispatch():
                await self._wait_credit()
                continue
            if self.suspects:
                sw = self._pick_worker(suspect_free=True)
                if sw is not None:
                    ref = self.suspects.popleft()
                    sw.send_task(ref, read_line_at(self.cfg.tasks_path, ref.offset, self.cfg.max_line_bytes))
                    await sw.pipe_room()
                    continue
            if self.exhausted and not self.redo:
                if self._outstanding() == 0 and not self.suspects:
                    return
                await self._wait_credit()  # a result or a dead worker's tasks coming back
                continue
            w = self._pick_worker()
            if w is None:
                await self._wait_credit()
                continue
            await self._fill(w)

    async def _fill(self, w: WorkerHandle) -> None:
        """Use up w's credits; the tasks go out together at the end of this loop iteration (one write)."""
        while w.credits > 0 and self._may_dispatch():
            task = self._next_task()
            if task is None:
                return
            w.send_task(*task)
            if w.out is not None and w.out.must_drain():
                await w.pipe_room()

    async def _drain_outstanding(self) -> None:
        while self._outstanding() and self.stopping != "now":
            await self._wait_credit()

    # ----- periodic work -----

    async def checkpoint(self, finished: bool = False) -> None:
        """Snapshot F/O and the counts with no await in between; the journal's writer makes every result
        handed over before it durable and writes checkpoint.json with the results length that covers them."""
        assert self.reader is not None
        j = self.journal
        j.append_ids(self.reader.ids.take_log())
        outstanding = [r for w in self.workers for r in w.outstanding.values()]
        cp = Checkpoint(
            fingerprint=self.fp, frontier=self.reader.offset, line_no=self.reader.line_no, index=self.reader.index,
            outstanding=outstanding + list(self.redo) + list(self.suspects), ids_len=j.ids_length(),
            invalid_len=j.invalid_length(), succeeded=self.stats.succeeded, failed=self.stats.failed,
            invalid=self.stats.invalid, counters=self.stats.counters(),
            finished=finished, done_ahead=sorted(self.skip_ids), pid=os.getpid(),
        )
        await j.checkpoint(cp)

    async def _ticker(self) -> None:
        cfg = self.cfg
        last_flush = last_cp = time.monotonic()
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            try:
                if now - last_cp >= cfg.checkpoint_interval_s:
                    await self.checkpoint()
                    last_cp = last_flush = now
                elif now - last_flush >= cfg.flush_interval_s:
                    self.journal.flush()
                    last_flush = now
            except JournalError as e:
                self._stop(str(e), 1, "now")
                return
            self._breaker_tick(now)
            for w in list(self.workers):
                if w.alive and w.state is not State.STARTING and now - w.last_beat > cfg.hang_timeout_s:
                    self.log(f"worker {w.pid} sent no heartbeat for {now - w.last_beat:.0f}s (hung); killing it")
                    w.kill("hung")
                elif w.state is State.STARTING and now - w.started > max(30.0, cfg.hang_timeout_s):
                    w.kill("hung")

    # ----- what a person sees -----

    def state(self) -> str:
        if self.stopping is not None:
            return "draining" if self.stopping == "drain" else "stopping"
        if self.breaker.open:
            return "waiting for endpoint"
        if self.paused:
            return "throttled"
        return "running"

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        st = self.stats
        self._rate_samples.append((now, st.session_done))
        t0, d0 = self._rate_samples[0]
        for t, d in self._rate_samples:  # rate over the last ~30 s
            if now - t <= 30:
                t0, d0 = t, d
                break
        rate = (st.session_done - d0) / (now - t0) if now - t0 > 0.5 else 0.0
        total = self.counter.total
        mem = self.memory
        return {
            "state": self.state(), "done": st.done, "total": total, "failed": st.failed, "retries": st.retries,
            "rate": rate, "eta_s": (max(0, total - st.done) / rate) if total is not None and rate > 0 else None,
            "inflight": self._outstanding(), "workers_mb": [w.rss / MIB for w in self.workers if w.alive],
            "cgroup_mb": mem.last_ws / MIB if mem is not None and mem.last_ws else None,
            "limit_mb": mem.limit / MIB if mem is not None and mem.limit else None,
            "conc_limit": limit_total(self.workers),  # issue 21
        }

    async def _progress(self) -> None:
        if self.cfg.quiet:
            return  # before rich's import (~15 ms of start-up)
        import sys

        from rich.console import Console

        console = Console(stderr=True)
        if console.is_terminal and self.cfg.log_format == "text":
            display = LiveDisplay(console)
            display.start()
            try:
                while True:
                    display.update(self.snapshot())
                    await asyncio.sleep(0.5)
            finally:
                display.update(self.snapshot())
                display.stop()
        else:
            while True:
                await asyncio.sleep(self.cfg.log_interval_s)
                s = self.snapshot()
                if self.cfg.log_format == "json":
                    sys.stderr.write(orjson.dumps({"t": round(time.time(), 3), "level": "info", "progress": s})
                                     .decode() + "\n")
                    sys.stderr.flush()
                else:
                    self.log(fmt_snapshot_plain(s))

    # ----- stopping -----

    def _stop(self, message: str, code: int, mode: str) -> None:
        if self.stopping == "now" or (self.stopping == "drain" and mode == "drain"):
            return
        if self.stopping is None:
            self.stop_message, self.stop_code = message, code
        self.stopping = mode
        self.credit.set()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if signum == signal.SIGTERM and self._signals == 1:
            self.log(f"SIGTERM: finishing requests in flight (up to {self.cfg.grace_s:g}s), then checkpointing")
            self._stop("stopped by SIGTERM", 0, "drain")
        else:
            self._stop("interrupted", 130 if signum == signal.SIGINT else 143, "now")
            self.stop_message, self.stop_code = "interrupted", 130 if signum == signal.SIGINT else 143

    async def _shutdown_workers(self) -> None:
        for w in self.workers:
            if self.stopping == "now":
                w.kill("stop")
            else:
                w.state = State.DRAINING
                w.close_input()
        procs = [w.proc for w in self.workers if w.proc is not None]
        if procs:
            _, pending = await asyncio.wait([asyncio.create_task(p.wait()) for p in procs], timeout=5)
            if pending:
                for w in self.workers:
                    w.kill("stop")
                await asyncio.wait(pending, timeout=5)
        readers = [w.reader_task for w in list(self.workers) if w.reader_task is not None]
        if readers:
            await asyncio.wait(readers, timeout=5)

    # ----- the run -----

    async def _prepare(self) -> None:
        """Start the workers while the endpoint is checked (their interpreters take a moment to start); open
        the run directory only once the check has passed, so a wrong URL, key or model touches nothing."""
        check = asyncio.create_task(check_endpoint(self.cfg)) if self.cfg.check else None
        try:
            for slot in range(self.active):
                await self._start_worker(slot)
            if check is not None:
                try:
                    found = await check
                except CheckFailed as e:
                    raise RunStopped(str(e), 2) from None
                if not self.cfg.quiet:
                    self.log(found)
            self._open()
        except BaseException:
            if check is not None:
                check.cancel()
            for w in self.workers:
                w.kill("stop")
            raise

    async def run(self) -> int:
        await self._prepare()
        quiet_gc()
        self.memory = MemoryControl(self.cfg, self.cfg.run_dir / "memory.jsonl")
        self.events = EventLog(self.cfg.run_dir / "events.jsonl")
        self.counter.start()
        if self.cfg.metrics_port is not None:
            from evalsup.supervisor.metrics import Metrics

            self.metrics = Metrics()
            try:
                self.metrics.serve(self.cfg.metrics_host, self.cfg.metrics_port)
            except OSError as e:
                raise RunStopped(f"cannot serve metrics on {self.cfg.metrics_host}:{self.cfg.metrics_port}: "
                                 f"{e.strerror}", 2) from None
            self.log(f"metrics on http://{self.cfg.metrics_host}:{self.cfg.metrics_port}/metrics")
            self._update_gauges()
        self.events("start", workers=self.active, max_workers=self.cfg.workers, concurrency=self.cfg.concurrency,
                    resumed=self.resumed_from is not None)
        if not self.cfg.quiet:
            self.log(self.memory.describe())
        if self.memory.cap < self.cfg.concurrency:
            self.log(f"memory: capping requests in flight at {self.memory.cap} of --concurrency {self.cfg.concurrency} "
                     "until response sizes are known (1 MiB each assumed); the cap follows what they turn out to be")
            for w in self.workers:  # started before the memory control existed
                w.send(Kind.LIMIT, {"inflight": self._worker_cap(w)})
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if self.resumed_from is not None:
            rs = self.resumed_from
            extra = f", cut a torn last line of {rs.torn_bytes} bytes" if rs.torn_bytes else ""
            self.log(f"resuming: {rs.done:,} done, {len(self.redo):,} to redo, reading on from line "
                     f"{rs.checkpoint.line_no + 1:,}{extra}")
        try:
            try:
                await self.checkpoint()  # from the start, the run directory says where the run is
            except JournalError as e:
                self._stop(str(e), 1, "now")
            ticker = asyncio.create_task(self._ticker())
            monitor = asyncio.create_task(self._monitor())
            progress = asyncio.create_task(self._progress())
            await self._dispatch()
            if self.stopping == "drain":
                try:
                    await asyncio.wait_for(self._drain_outstanding(), self.cfg.grace_s)
                except TimeoutError:
                    self.log(f"grace of {self.cfg.grace_s:g}s over; {self._outstanding()} task(s) left for the rerun")
                    self.stopping = "now"
            for t in (ticker, monitor, progress):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self._shutdown_workers()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        self.finished = (self.stopping is None and self.exhausted and not self.redo and not self.suspects
                         and self._outstanding() == 0)
        try:
            await self.checkpoint(finished=self.finished)
        except JournalError as e:
            self.stop_message, self.stop_code = str(e), 1
        self.events("end", finished=self.finished, done=self.stats.done, code=self.stop_code)
        self.journal.close()
        self.memory.close()
        self.events.close()
        if self.reader is not None:
            self.reader.close()
        return self.stop_code
