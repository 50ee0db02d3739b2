"""The supervisor's one loop: read tasks, hand them to workers by credit, write results, and spawn, reap and
replace workers (after gunicorn's arbiter).

Rooms decide, the arbiter acts. Who holds which task is the ledger's (``ledger.TaskLedger``); a worker's life is
its handle's state machine (``workers.WorkerHandle``); memory, scaling, the breaker, restart intensity and
recycling are small policy objects that return decisions. Only the verbs here send frames, spawn, kill or
append to the journal: ``spawn``, ``replace``, ``recycle``, ``poison``, ``checkpoint``, ``stop``. Frames from a
worker go through one table, ``{FrameKind: handler}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from typing import Any

import orjson

from evalsup.common.process import quiet_gc
from evalsup.config import exitcodes as ex  # exit codes in one module (issue 19)
from evalsup.ipc import FrameKind
from evalsup.rundir.checkpoint import JournalError
from evalsup.rundir.layout import EVENTS, MEMORY
from evalsup.supervisor.check import CheckFailed, check_endpoints
from evalsup.supervisor.events import EventLog
from evalsup.supervisor.inbox import Inbox, RunRefused
from evalsup.supervisor.limits import endpoint_loads, limit_total
from evalsup.supervisor.memory import MemoryControl
from evalsup.supervisor.progress import show_progress
from evalsup.supervisor.progress import snapshot as progress_snapshot
from evalsup.supervisor.scaling import cpu_seconds
from evalsup.supervisor.workers import Exit, State, WorkerHandle
from evalsup.tasks.reader import TaskError, TaskRef, read_line_at

MIB = 1 << 20

__all__ = ["RunRefused", "Supervisor"]


class Supervisor(Inbox):
    # ----- memory and scaling -----

    async def _monitor(self) -> None:
        assert self.memory is not None
        mem = self.memory
        while True:
            await asyncio.sleep(self.cfg.monitor_interval_s)
            mem.concurrency_limit = limit_total(self.workers)  # into memory.jsonl (issue 21)
            mem.on_wire = sum(w.wire for w in self.workers if w.alive)
            mem.endpoints = endpoint_loads(self.workers, self.endpoints) if self.endpoints.many else None
            dec = mem.tick(self.workers, self.paused, self.stats.done)
            for note in dec.notes:
                self.log(note)
            by_id = {w.id: w for w in self.workers}
            for wid, rss in dec.rss.items():
                if (w := by_id.get(wid)) is not None:
                    w.rss, w.peak_rss = rss, max(w.peak_rss, rss)
            self.stats.on_memory(mem.last_supervisor_rss, [w.rss for w in self.workers])
            if self.metrics is not None:
                self._update_gauges()
            if dec.throttle == "pause":
                self.paused = True
                self.events("pause", working_set=mem.last_ws)
                why = "above the high mark" if mem.watermark and mem.last_ws >= mem.watermark.high_bytes else \
                    f"kernel reports pressure ({', '.join(mem.pressure.reasons)})"
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use, {why}; pausing dispatch")
                self._broadcast(FrameKind.PAUSE)
            elif dec.throttle == "resume":
                self.paused = False
                self.events("resume", working_set=mem.last_ws)
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use, below the low mark; resuming")
                self._broadcast(FrameKind.RESUME)
                self.credit.set()
            if dec.inflight_cap is not None:
                for w in self.workers:
                    w.send(FrameKind.LIMIT, {"inflight": self._worker_cap(w)})
            for wid, cause in dec.recycle:
                if (w := by_id.get(wid)) is not None:
                    self.recycle(w, cause)
            big = mem.give_back(time.monotonic(), self.paused and self.stopping is None, self.ledger.any_started(),
                                self.workers)
            if big is not None:
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use with nothing in flight (above the low mark); "
                         f"recycling the largest worker ({big.rss / MIB:,.0f} MiB) to give memory back")
                self.recycle(by_id[big.id], "rss")
            if self.cfg.autoscale:
                self._maybe_scale(mem)

    def _update_gauges(self) -> None:
        mem = self.memory
        assert self.metrics is not None and mem is not None
        self.metrics.update(sum(w.wire for w in self.workers if w.alive), self.paused, self.endpoints.open,
                            {w.slot: w.rss for w in self.workers if w.alive}, mem.last_supervisor_rss, mem.last_ws,
                            mem.limit, limit_total(self.workers), endpoint_loads(self.workers, self.endpoints))

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
            w.send(FrameKind.LIMIT, {"inflight": self._worker_cap(w)})
        self.events("scale", workers=self.active, loads=loads)
        self.log(f"workers: each one busy ({', '.join(f'{v:.0%}' for v in loads)} of a core); adding worker "
                 f"{self.active} of at most {self.cfg.workers}")
        t = asyncio.create_task(self.spawn(self.active - 1))
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        t.add_done_callback(lambda _: self.credit.set())

    # ----- dispatch -----

    def _next_task(self) -> tuple[TaskRef, bytes] | None:
        cfg = self.cfg
        assert self.reader is not None
        if self.ledger.redo:
            ref = self.ledger.redo.popleft()
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
                self.stop(f"{e}  (use --on-invalid skip to record bad lines in invalid.jsonl and go on)", ex.BAD_INPUT,
                          "drain")
                return None
            if got is None:
                self.exhausted = True
                return None
            ref, line, index = got
            if cfg.shard is not None and index % cfg.shard[1] != cfg.shard[0]:
                continue  # another shard's line (still validated, and its id still counts for duplicates)
            if self.ledger.skip(ref.id):
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
                if suspect_free and self.ledger.holds_suspect(w.id):
                    continue
                best = w
        return best

    async def _wait_credit(self) -> None:
        self.credit.clear()
        await self.credit.wait()

    def _may_dispatch(self) -> bool:
        return self.stopping is None and not self.paused and not self.endpoints.open

    def _hand(self, w: WorkerHandle, ref: TaskRef, line: bytes) -> None:
        self.ledger.assign(w.id, ref)
        w.send_task(ref, line)

    async def _dispatch(self) -> None:
        """Hand out tasks until the input is done and nothing is outstanding, or a stop is asked."""
        led = self.ledger
        while self.stopping is None:
            if not self._may_dispatch():
                await self._wait_credit()
                continue
            if led.suspects:
                sw = self._pick_worker(suspect_free=True)
                if sw is not None:
                    ref = led.suspects.popleft()
                    self._hand(sw, ref, read_line_at(self.cfg.tasks_path, ref.offset, self.cfg.max_line_bytes))
                    await sw.pipe_room()
                    continue
            if self.exhausted and not led.redo:
                if led.settled():
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
            self._hand(w, *task)
            if w.out is not None and w.out.must_drain():
                await w.pipe_room()

    async def _drain_outstanding(self) -> None:
        while self.ledger.in_flight() and self.stopping != "now":
            await self._wait_credit()

    # ----- periodic work -----

    async def _ticker(self) -> None:
        cfg = self.cfg
        last_flush = last_cp = prev = time.monotonic()
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            missed = now - prev - 0.25
            prev = now
            if missed > 2.0:
                # the supervisor itself did not run (the tree was frozen: docker pause, SIGSTOP, a suspended
                # laptop): its workers could not beat either, and must not be taken for hung
                for w in self.workers:
                    w.last_beat += missed
                    w.started += missed
            try:
                if now - last_cp >= cfg.checkpoint_interval_s:
                    await self.checkpoint()
                    last_cp = last_flush = now
                elif now - last_flush >= cfg.flush_interval_s:
                    self.journal.flush()
                    last_flush = now
            except JournalError as e:
                self.stop(str(e), e.code, "now")
                return
            self._breaker_tick(now)
            for w in list(self.workers):
                if w.alive and w.state is not State.STARTING and now - w.last_beat > cfg.hang_timeout_s:
                    self.log(f"worker {w.pid} sent no heartbeat for {now - w.last_beat:.0f}s (hung); killing it")
                    w.kill(Exit.HUNG)
                elif w.state is State.STARTING and now - w.started > max(30.0, cfg.hang_timeout_s):
                    w.kill(Exit.HUNG)

    # ----- what a person sees -----

    def state(self) -> str:
        if self.stopping is not None:
            return "draining" if self.stopping == "drain" else "stopping"
        if self.endpoints.open:  # every endpoint down
            return "waiting for endpoint"
        if self.paused:
            return "throttled"
        return "running"

    def snapshot(self) -> dict[str, Any]:
        """The figures the bar, the log lines and --log-format json show (supervisor.progress.snapshot)."""
        return progress_snapshot(self, time.monotonic())

    # ----- stopping -----

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if signum == signal.SIGTERM and self._signals == 1:
            self.log(f"SIGTERM: finishing requests in flight (up to {self.cfg.grace_s:g}s), then checkpointing")
            self.stop("stopped by SIGTERM", ex.RESUMABLE, "drain", hand_back=True)
        else:
            self.stop("interrupted", ex.RESUMABLE, "now")
            self.stop_message, self.stop_code = "interrupted", ex.RESUMABLE

    async def _shutdown_workers(self) -> None:
        for w in self.workers:
            if self.stopping == "now":
                w.kill(Exit.STOPPED)
            else:
                w.close_input()
        procs = [w.proc for w in self.workers if w.proc is not None]
        if procs:
            _, pending = await asyncio.wait([asyncio.create_task(p.wait()) for p in procs], timeout=5)
            if pending:
                for w in self.workers:
                    w.kill(Exit.STOPPED)
                await asyncio.wait(pending, timeout=5)
        readers = [w.reader_task for w in list(self.workers) if w.reader_task is not None]
        if readers:
            await asyncio.wait(readers, timeout=5)

    # ----- the run -----

    async def _prepare(self) -> None:
        """Start the workers while the endpoint is checked (their interpreters take a moment to start); open
        the run directory only once the check has passed, so a wrong URL, key or model touches nothing."""
        check = asyncio.create_task(check_endpoints(self.cfg)) if self.cfg.check else None
        try:
            for slot in range(self.active):
                await self.spawn(slot)
            if check is not None:
                try:
                    found, failed = await check
                except CheckFailed as e:
                    raise RunRefused(str(e), ex.BAD_INPUT) from None
                if not self.cfg.quiet:
                    self.log("; ".join(found))
                self._leave_out(failed)  # endpoints that failed the check: reported, the run goes on without
            self._open()
        except BaseException:
            if check is not None:
                check.cancel()
            for w in self.workers:
                w.kill(Exit.STOPPED)
            raise

    def _start_watching(self) -> None:
        """memory.jsonl, events.jsonl, the line count and the metrics server, once the run directory is open."""
        cfg = self.cfg
        self.memory = MemoryControl(cfg, cfg.run_dir / MEMORY)
        self.events = EventLog(cfg.run_dir / EVENTS)
        self.counter.start()
        if cfg.metrics_port is not None:
            from evalsup.supervisor.metrics import Metrics

            self.metrics = Metrics()
            try:
                self.metrics.serve(cfg.metrics_host, cfg.metrics_port)
            except OSError as e:
                raise RunRefused(f"cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port}: "
                                 f"{e.strerror}", ex.BAD_INPUT) from None
            self.log(f"metrics on http://{cfg.metrics_host}:{cfg.metrics_port}/metrics")
            self._update_gauges()
        self.events("start", workers=self.active, max_workers=cfg.workers, concurrency=cfg.concurrency,
                    resumed=self.resumed_from is not None)
        if not cfg.quiet:
            self.log(self.memory.describe())
        if self.memory.cap < cfg.concurrency:
            self.log(f"memory: capping requests in flight at {self.memory.cap} of --concurrency {cfg.concurrency} "
                     "until response sizes are known (1 MiB each assumed); the cap follows what they turn out to be")
            for w in self.workers:  # started before the memory control existed
                w.send(FrameKind.LIMIT, {"inflight": self._worker_cap(w)})
        if self.resumed_from is not None:
            rs = self.resumed_from
            extra = f", cut a torn last line of {rs.torn_bytes} bytes" if rs.torn_bytes else ""
            self.log(f"resuming: {rs.done:,} done, {self.ledger.waiting():,} to redo, reading on from line "
                     f"{rs.checkpoint.line_no + 1:,}{extra}")

    async def run(self) -> int:
        await self._prepare()
        quiet_gc()
        self._start_watching()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        cfg = self.cfg
        try:
            try:
                await self.checkpoint()  # from the start, the run directory says where the run is
            except JournalError as e:
                self.stop(str(e), e.code, "now")
            loops = [asyncio.create_task(c) for c in (
                self._ticker(), self._monitor(),
                show_progress(cfg.quiet, cfg.log_format, cfg.log_interval_s, self.snapshot, self.log))]
            await self._dispatch()
            if self.stopping == "drain":
                try:
                    await asyncio.wait_for(self._drain_outstanding(), cfg.grace_s)
                except TimeoutError:
                    self.log(f"grace of {cfg.grace_s:g}s over; {self.ledger.in_flight()} task(s) left for the rerun")
                    self.stopping = "now"
            for t in loops:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self._shutdown_workers()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        self.finished = self.stopping is None and self.exhausted and self.ledger.settled()
        try:
            await self.checkpoint(finished=self.finished)
        except JournalError as e:
            if self.stop_code == 0 or not self.journal.broken:  # keep the first cause (the failed write) if any
                self.stop_message, self.stop_code = str(e), e.code
        self.events("end", finished=self.finished, done=self.stats.done, code=self.stop_code,
                    stopped=self.stop_message or None)  # why, for `evalsup status`
        self.journal.close()
        assert self.memory is not None
        self.memory.close()
        self.events.close()
        if self.reader is not None:
            self.reader.close()
        return self.stop_code

