"""What workers say: one handler per frame kind (``Inbox.handlers``), a worker's exit, and the endpoint's
breaker. Handlers update the ledger and the counts, and act only through the verbs of ``core``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from evalsup.config import exitcodes as ex  # exit codes in one module (issue 19)
from evalsup.config.run_config import RunConfig
from evalsup.ipc import FrameKind, decode_json, split_meta
from evalsup.ipc.frames import KEY, ProtocolError
from evalsup.ipc.messages import Auth, ResultMeta
from evalsup.ipc.ring import ring_size_from_env
from evalsup.rundir.journal import Journal
from evalsup.supervisor.core import RunRefused, SupervisorCore
from evalsup.supervisor.events import write_leaks
from evalsup.supervisor.policies import task_count_step
from evalsup.supervisor.workers import Exit, State, WorkerHandle

MIB = 1 << 20
Handler = Callable[[WorkerHandle, memoryview], None]

__all__ = ["Inbox", "RunRefused"]


class Inbox(SupervisorCore):
    def __init__(self, cfg: RunConfig, log: Any = None) -> None:
        super().__init__(cfg, log)
        if ring_size_from_env(cfg.workers):  # large results come through shared-memory rings (ipc.ring)
            self.journal.on_written = self._release_rings  # a ring's space is free once its lines are written
        self.journal.on_error = lambda message: self.stop(
            f"{message}; the run directory still describes what is safely on disk", ex.RESUMABLE, "now")
        self.journal.on_backlog_low = self._on_backlog_low
        self.handlers: dict[FrameKind, Handler] = {
            FrameKind.RESULT: self._on_result, FrameKind.RETURNED: self._on_returned,
            FrameKind.STARTED: self._on_started, FrameKind.HEARTBEAT: self._on_heartbeat, FrameKind.TRIP: self._on_trip,
            FrameKind.PROBE_RESULT: self._on_probe_result,
            FrameKind.READY: self._on_ready, FrameKind.FATAL: self._on_fatal, FrameKind.LEAKS: self._on_leaks,
            FrameKind.AUTH: self._on_auth,
        }

    # ----- what workers say -----

    async def _reap(self, w: WorkerHandle) -> None:
        assert w.proc is not None and w.stream is not None
        err = await w.stream.closed
        if err is not None:
            self.log(f"worker {w.pid}: broken pipe ({err})")
            w.kill(Exit.CRASHED)
        rc = await w.proc.wait()
        self._on_exit(w, rc)

    def _on_frame(self, w: WorkerHandle, kind: FrameKind, payload: memoryview) -> None:
        handler = self.handlers.get(kind)
        if handler is not None:
            handler(w, payload)

    def _on_result(self, w: WorkerHandle, payload: memoryview) -> None:
        raw, line = split_meta(payload)
        meta = cast(ResultMeta, raw)
        ref = self.ledger.finished(w.id, meta["k"])
        if ref is None:
            return  # not ours any more (cannot happen while one worker holds each task)
        sh = meta.get("sh")
        if sh is not None:  # the line is in the worker's ring: the journal writes it from there
            try:
                if w.ring is None:
                    raise ProtocolError("a result in a ring that was never made")
                line = w.ring.line(int(sh[0]), int(sh[1]), self.journal.appended + int(sh[1]))
            except (ProtocolError, TypeError, ValueError, IndexError) as e:
                # the task stays the worker's, so it is handed on with the others when the broken worker goes
                self.ledger.unfinish(w.id, ref)
                raise ProtocolError(f"bad ring reference {sh!r}") from e
            self.stats.ring_results += 1
        self.journal.append(line)
        self.stats.on_result(meta)
        if self.metrics is not None:
            self.metrics.on_result(meta["ok"], float(meta["lat"]), meta.get("ttft"), int(meta["rt"]))
        if self.memory is not None and meta["ok"]:
            self.memory.budget.observe(int(meta.get("rb", 0)))
        w.done += 1
        if w.credits >= w.refill or self.exhausted or self.ledger.suspects or self.stopping is not None:
            self.credit.set()  # wake the dispatcher only when it has something to do: a refill, the end
        step = task_count_step(w.done, w.task_limit, w.window) if not w.recycling else None
        if step == "recycle":
            self.recycle(w, "tasks")
        elif step == "warm":
            self.replace(w)  # warm up its successor, so the recycle costs no throughput
        if self.journal.backlog > Journal.BACKLOG_HIGH and not self._backlogged:
            self.journal.flush()  # the writer's progress is what releases the hold: give it all there is
            self._backlogged = True  # the disk is behind: read no more results until it catches up
            self.events("disk_behind", backlog=self.journal.backlog)
            for x in self.workers:
                if x.stream is not None:
                    x.stream.hold("backlog")

    def _on_returned(self, w: WorkerHandle, payload: memoryview) -> None:
        self.ledger.returned(w.id, decode_json(payload).get("keys", []))
        self.credit.set()

    def _on_started(self, w: WorkerHandle, payload: memoryview) -> None:
        for (k,) in KEY.iter_unpack(payload):
            self.ledger.started(w.id, k)

    def _on_heartbeat(self, w: WorkerHandle, payload: memoryview) -> None:
        beat = decode_json(payload)
        w.last_beat = time.monotonic()
        w.parked = int(beat.get("parked", 0))
        w.wire = int(beat.get("wire", 0))
        w.conc_limit = int(beat.get("limit") or 0)  # the adaptive limit, summed for display (issue 21)
        w.ep_load = beat.get("eps")  # and each endpoint's, with several

    def _on_ready(self, w: WorkerHandle, payload: memoryview) -> None:
        w.ready()
        self.credit.set()

    def _on_fatal(self, w: WorkerHandle, payload: memoryview) -> None:
        w.fatal = str(decode_json(payload).get("message"))

    def _on_leaks(self, w: WorkerHandle, payload: memoryview) -> None:
        self.log(write_leaks(self.cfg.run_dir, w.pid, str(decode_json(payload).get("text", ""))))

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

    def _on_exit(self, w: WorkerHandle, rc: int) -> None:
        how = w.exited()
        if w in self.workers:
            self.workers.remove(w)
        for ref in self.ledger.gone(w.id, died=how.died):
            self.poison(ref)
        self.credit.set()
        self._send_rates()
        if w.fatal and self.stopping is None:
            self.stop(f"worker could not start: {w.fatal}", ex.BAD_INPUT, "now")
            return
        if self.stopping is not None or how.planned:
            return
        cause = "hung" if how is Exit.HUNG else "crashed"
        self.stats.restarts[cause] += 1
        self.events("restart", cause=cause, pid=w.pid, exit=rc)
        if self.metrics is not None:
            self.metrics.restarts.labels(cause).inc()
        if self.intensity.record(time.monotonic()):
            self.stop(f"more than {self.cfg.max_restarts} unplanned worker restarts within 60s (last: worker "
                      f"{w.pid} {cause}, exit {rc}); stopping instead of crash-looping", ex.RESUMABLE, "now")
            return
        self.log(f"worker {w.pid} {'hung' if cause == 'hung' else f'exited ({rc})'}; "
                 f"{self.ledger.waiting()} task(s) handed on; "
                 + ("its successor was already starting" if w.replaced else "starting a new one"))
        self.replace(w)

    # ----- the endpoints: a breaker each (supervisor.endpoints, issue 21) -----

    def _leave_out(self, failed: dict[int, str]) -> None:
        """Endpoints that failed the connection check or refused the key: a line each, and the run goes on
        without them."""
        eps = self.endpoints
        for e, why in failed.items():
            was_open = eps.open
            eps.leave_out(e, why, time.monotonic())
            self.log(f"{eps.name(e)} left out of this run: {why}")
            self._broadcast(FrameKind.BREAKER_OPEN, {"e": e, "out": True})
            if eps.open and not was_open:  # the others left are all ejected just now
                self._all_down(eps.reason)

    def _on_trip(self, w: WorkerHandle, payload: memoryview) -> None:
        t = decode_json(payload)
        reason, e = str(t.get("reason", "")), int(t.get("e", 0))
        eps = self.endpoints
        if eps.trip(e, time.monotonic(), reason):
            self._broadcast(FrameKind.BREAKER_OPEN, {"e": e})
            if eps.open:
                self._all_down(reason)
            else:
                self.log(f"{eps.name(e)} looks down ({reason}); ejected: the others take its requests, it is "
                         f"probed on its own ({len(eps.up())} of {len(eps.urls)} up)")
            if eps.many:
                self.events("endpoint_out", endpoint=e, reason=reason)
        elif 0 <= e < len(eps.breakers) and eps.breakers[e].open:
            w.send(FrameKind.BREAKER_OPEN, {"e": e})

    def _all_down(self, reason: str) -> None:
        every = "every endpoint is down" if self.endpoints.many else "endpoint looks down"
        self.log(f"{every} ({reason}); pausing dispatch and probing, no task is failed meanwhile "
                 f"(gives up after --max-wait-down {self.cfg.max_wait_down_s:g}s)")
        self.events("breaker_open", reason=reason)

    def _on_probe_result(self, w: WorkerHandle, payload: memoryview) -> None:
        r = decode_json(payload)
        ok, detail, e = bool(r.get("ok")), str(r.get("detail", "")), int(r.get("e", 0))
        now = time.monotonic()
        eps = self.endpoints
        paused, since = eps.open, eps.opened_at
        if eps.probe_result(e, ok, now):
            b = eps.breakers[e]
            if b.was_down:
                self.log(f"{eps.name(e)} is back after {now - b.opened_at:.1f}s; "
                         + ("resuming" if paused else "it rejoins"))
            else:
                self.log(f"{eps.name(e)} answers ({detail}): the failures were those tasks' own; they use up their "
                         "attempts (--max-attempts)")
            if paused:
                self.events("breaker_close", down_s=round(now - since, 3), was_down=b.was_down)
            if eps.many:
                self.events("endpoint_back", endpoint=e, down_s=round(now - b.opened_at, 3), was_down=b.was_down)
            self._broadcast(FrameKind.BREAKER_CLOSE, {"was_down": b.was_down, "e": e})
            self.credit.set()
        elif 0 <= e < len(eps.breakers) and eps.breakers[e].open and not ok:
            self.log(f"{eps.name(e)} still down ({detail}); next probe in {eps.breakers[e].interval:g}s")

    def _on_auth(self, w: WorkerHandle, payload: memoryview) -> None:
        """A worker judged the key lost at endpoint e: with others still in the run it is left out (its refused
        requests go to them); else the run stops, resumably, and fails no task for it."""
        m = cast(Auth, decode_json(payload))
        said, e, eps = str(m.get("message", ""))[:200], int(m.get("e", 0)), self.endpoints
        if e in eps.left_out:
            return  # another worker said so first
        self.events("auth_refused", pid=w.pid, **({"endpoint": e} if eps.many else {}))
        if any(i != e for i in eps.live()):
            self._leave_out({e: f"it refused the API key ({said}); the others take its requests"})
            return
        what = "no endpoint left in the run takes" if eps.many else "the endpoint refused"
        self.stop(f"{what} the API key ({said}); no task was failed for it: fix the key "
                  "(OPENAI_API_KEY or --api-key-file)", ex.RESUMABLE, "now")

    def _breaker_tick(self, now: float) -> None:
        eps = self.endpoints
        if eps.down_too_long(now):
            what = "every endpoint has" if eps.many else "the endpoint has"
            self.stop(f"{what} been down for more than --max-wait-down {self.cfg.max_wait_down_s:g}s "
                      f"({eps.reason})", ex.RESUMABLE, "now")
            return
        for e in eps.probes_due(now):
            ready = [w for w in self.workers if w.state is State.READY]
            if ready:
                max(ready, key=lambda x: x.parked).send(FrameKind.PROBE, {"e": e})
                eps.probe_sent(e, now)
