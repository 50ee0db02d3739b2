"""The supervisor's arbiter: one loop that reads tasks, hands them to workers by credit, writes results, and
spawns, reaps and replaces workers (after gunicorn's arbiter); the rooms decide, it only acts (after tenacity:
a policy returns what to do, the loop does it).

Only the verbs send a worker a frame, spawn or kill one, hold its pipe, or append to the journal: ``spawn``,
``replace``, ``add_worker``, ``recycle``, ``kill``, ``hand``, ``send``, ``broadcast``, ``release_rings``,
``hold_results``, ``release_results``, ``append``, ``append_invalid``, ``poison``, ``flush``, ``checkpoint``,
``stop``, ``shutdown_workers``, ``close`` (tests/test_verbs.py reads this file to keep it so). Everything else here
is the loop (dispatch, the ticker, the memory monitor, the run's start and end) and the frame handlers (one
table, ``{FrameKind: handler}``), which decide nothing of their own beyond bookkeeping and call the verbs.

What is decided, and where:
- who holds which task, the redo and suspect queues: ``ledger.TaskLedger``;
- a worker's life: ``workers.WorkerHandle`` (states and their moves, ``Exit``);
- which workers are hung: ``hang.HangWatch``; whether the run has stalled on its oldest requests: ``stall.StallWatch``;
- may a worker be added: ``scaling.ScaleUp.may_add`` with a ``scaling.ScaleGate``;
- what a RESULT changes (wake the dispatcher, warm or recycle the worker, hold the pipes): ``after_result``;
- what a worker's exit leads to (stop, nothing, a restart counted against the intensity): ``after_exit``;
- memory (throttle, in-flight cap, recycles): ``memory.MemoryControl`` and ``policies``; the endpoints' breakers:
  ``endpoints.Endpoints``; restart intensity: ``policies.RestartIntensity``;
- what a person sees: ``progress.snapshot`` and ``summary.build_summary``, from a ``view.RunView``; which
  state lines to say and when (once per change, a repeat at most once a minute): ``log_gate.LogGate``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import random
import signal
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, cast

import orjson

from evalsup.cache.feed import CacheFeed
from evalsup.cache.key import KeyMaker, key_headers, schema_in_key
from evalsup.cache.known import CachedTally, KnownAnswers, Pending, request_key
from evalsup.common.process import quiet_gc
from evalsup.common.text import fmt_duration
from evalsup.config import exitcodes as ex  # exit codes in one module (issue 19)
from evalsup.config.prices import Price, load_prices
from evalsup.config.ratelimits import rate_share
from evalsup.config.run_config import RunConfig
from evalsup.ipc import FrameKind, decode_json, split_meta
from evalsup.ipc.frames import KEY, BufferPool, ProtocolError
from evalsup.ipc.messages import WIRE_TOP, Auth, ResultMeta
from evalsup.ipc.ring import ring_size
from evalsup.rundir.checkpoint import Checkpoint, JournalError, load_checkpoint, previous_fingerprint
from evalsup.rundir.journal import Journal
from evalsup.rundir.layout import CEILING, EVENTS, MEMORY, RESULTS
from evalsup.rundir.results_file import ResumeState
from evalsup.rundir.usage import Usage, usage_of_results
from evalsup.rundir.writer import cached_tail
from evalsup.scoring.groups import GroupedScores
from evalsup.scoring.selection import FIELD
from evalsup.scoring.selection import check as check_scorers
from evalsup.supervisor.after_exit import after_exit
from evalsup.supervisor.after_result import after_result
from evalsup.supervisor.breaker import PAUSED_PROBE_S
from evalsup.supervisor.budget import Amount, Budget, Learned, TaskCosts, Verdict, carried, unasked_in
from evalsup.supervisor.ceiling import Ceiling
from evalsup.supervisor.check import CheckFailed, check_endpoints
from evalsup.supervisor.endpoints import Endpoints
from evalsup.supervisor.events import EventLog, write_leaks
from evalsup.supervisor.first_line import first_line
from evalsup.supervisor.hang import HangWatch
from evalsup.supervisor.input_check import bad_input, judge
from evalsup.supervisor.ledger import TaskLedger
from evalsup.supervisor.limits import endpoint_loads, limit_reason, limit_total
from evalsup.supervisor.log_gate import LogGate
from evalsup.supervisor.memory import MemoryControl
from evalsup.supervisor.policies import RecycleCause, RestartIntensity
from evalsup.supervisor.progress import LineCounter, RateWindow, show_progress
from evalsup.supervisor.progress import snapshot as progress_snapshot
from evalsup.supervisor.scaling import ScaleGate, ScaleUp, cpu_seconds
from evalsup.supervisor.stall import OnWire, StallWatch, on_wire
from evalsup.supervisor.stats import RunStats
from evalsup.supervisor.view import RunView
from evalsup.supervisor.workers import Exit, Launched, State, WorkerHandle, launch, worker_module
from evalsup.tasks.anthropic import task_params
from evalsup.tasks.fingerprint import fingerprint, grew_at_line_end, same_input
from evalsup.tasks.idindex import IdIndex, IndexBuilder
from evalsup.tasks.prescan import prescan
from evalsup.tasks.reader import TaskError, TaskReader, TaskRef, read_line_at
from evalsup.tasks.records import output_line
from evalsup.tasks.requests import RequestDefaults, to_request
from evalsup.tasks.response_schema import task_schemas
from evalsup.tasks.tokens import Tally, figures, start_line

MIB = 1 << 20
TICK_S = 0.25  # the ticker's period: checkpoints, flushes, the breaker's probes, hang detection
# A trip is said once a probe fails: one the first probe clears was a false alarm, said apart (at most once a
# minute). A trip no probe has answered within this long is said as down all the same (a probe may hang).
CONFIRM_S = 2.0
Handler = Callable[[WorkerHandle, memoryview], None]

__all__ = ["RunRefused", "StopMode", "Supervisor"]


class StopMode(enum.Enum):
    """How the run stops (``Supervisor.stop``): a NOW stop is never softened into a DRAIN."""

    DRAIN = "drain"  # dispatch no more; the workers finish what they hold, within --grace (then NOW)
    NOW = "now"  # the workers are killed; what they held is outstanding for the rerun


class RunRefused(Exception):
    """The run ended early; ``code`` is the exit code and the message says why and what to do."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Supervisor:
    def __init__(self, cfg: RunConfig, log: Any = None) -> None:
        self.cfg = cfg
        self.log: Callable[..., None] = log or (lambda msg, level="info": None)  # (message, level)
        self.journal = Journal(cfg.run_dir, cached_tail(cfg.memory_bytes))
        self.stats = RunStats(groups=GroupedScores(cfg.worker.group_by) if cfg.worker.group_by else None)
        self.ledger = TaskLedger(cfg.max_task_crashes)
        self.frame_buffers = BufferPool()  # large results from the pipe are read into these, reused once written
        self.workers: list[WorkerHandle] = []
        self.active = cfg.first_workers  # worker slots in use (grows with autoscale, see supervisor.scaling)
        self.scaler = ScaleUp()
        self.hang = HangWatch(cfg.hang_timeout_s, TICK_S)
        self.stall = StallWatch(cfg.stall_after_s, time.monotonic())  # its clock starts again with the run
        self.reader: TaskReader | None = None
        self._scanned: tuple[tuple[int, int, int], IdIndex] | None = None  # the pre-scan's start and id index
        self.ids: IdIndex | None = None  # the reader's id index (temporary files, closed with the reader)
        self.fp: dict[str, Any] = {}
        self.credit = asyncio.Event()  # set when a credit returns or the set of workers changes
        self.stopping: StopMode | None = None  # None until the run stops
        self.stop_code = 0
        self.stop_message = ""
        self.exhausted = False
        self.paused = False  # dispatch gate (memory throttle)
        self.resumed_from: ResumeState | None = None
        self._signals = 0
        self.finished = False
        self.memory: MemoryControl | None = None
        self.ceiling = Ceiling(cfg.run_dir / CEILING, cfg.concurrency)  # RUN_DIR/concurrency, read each tick
        self.intensity = RestartIntensity(cfg.max_restarts, 60.0)
        self.endpoints = Endpoints(cfg.worker.endpoints, cfg.max_wait_down_s)  # a breaker each (issue 21)
        self.gate = LogGate()  # state lines: once per change, a repeat at most once a minute (issue 28)
        self.events: Any = lambda kind, **fields: None
        self.counter = LineCounter(cfg.tasks_path, cfg.shard[1] if cfg.shard else 1)
        self.rate = RateWindow(time.monotonic())  # results a second, for the progress (supervisor.progress)
        self.metrics: Any = None
        self.cache: CacheFeed | None = None  # the answer cache's writes (issue 30), set by supervisor.run
        # issue 30: the prices (the estimate at the start, --max-cost), and the budget when a cap is given
        self.prices = load_prices(cfg.prices_file, cfg.self_hosted, batch=cfg.worker.batch is not None)
        # each task's own JSON schema, compiled once per distinct schema: the pre-scan's and the reader's check
        self.schemas = task_schemas(cfg.worker.validate_schema, cfg.worker.response_schema)
        self.defaults = RequestDefaults(model=cfg.worker.model, max_tokens=cfg.worker.max_tokens)
        self.budget: Budget | None = None  # the caps' room (supervisor.budget); dispatch asks it through _afford
        self.costs: TaskCosts | None = None  # what a task may cost, all of it, when a cap is given
        # what the run's answers taught the reservations (the budget's, when a cap is given); kept with no cap too,
        # so the checkpoint carries what an earlier session learned to the next one (``budget.unasked_in``)
        self.learned = Learned()
        self.stop_reason: str | None = None  # "budget" when a cap stopped the run (summary.json's exit_reason)
        self._start_notes: list[str] = []  # the estimate and the budget, said once the checks have passed
        self._first: tuple[dict[str, Any] | None, int | None] = (None, None)  # the start line's estimate, hits
        self._scan_total: int | None = None  # the input's tasks as the pre-scan counted them (status's total)
        self._bg: set[asyncio.Task[Any]] = set()
        self._backlogged = False  # reading results is held until the journal's writer catches up
        if cfg.ring_bytes:  # large results come through shared-memory rings (ipc.ring)
            self.journal.on_written = self.release_rings  # a ring's space is free once its lines are written
        self.journal.on_error = lambda message: self.stop(
            f"{message}; the run directory still describes what is safely on disk", ex.RESUMABLE, StopMode.NOW)
        self.journal.on_backlog_low = self.release_results
        self.handlers: dict[FrameKind, Handler] = {
            FrameKind.RESULT: self._on_result, FrameKind.RETURNED: self._on_returned,
            FrameKind.STARTED: self._on_started, FrameKind.HEARTBEAT: self._on_heartbeat, FrameKind.TRIP: self._on_trip,
            FrameKind.PROBE_RESULT: self._on_probe_result, FrameKind.READY: self._on_ready,
            FrameKind.FATAL: self._on_fatal, FrameKind.LEAKS: self._on_leaks, FrameKind.AUTH: self._on_auth,
        }

    # ----- set-up -----

    async def _scan_input(self) -> None:
        """The pre-scan (issue 28): every line not yet read is checked before the endpoint check, before any
        worker starts, before the run directory is touched; a bad line (or an input with no task) refuses the
        run with one line, exit 2. The scan builds the id set the run's reader reads on with. A resume scans
        only from the checkpoint's frontier (what the run read before it was checked then; its ids are loaded
        from ids.bin). A run directory that is not the same input's is left to ``_open`` to refuse."""
        cfg = self.cfg
        if not cfg.tasks_path.is_file():
            raise RunRefused(f"{cfg.tasks_path}: no such file", ex.BAD_INPUT)
        try:
            cp = load_checkpoint(cfg.run_dir)
        except (JournalError, OSError):
            return  # damaged or unreadable: _open says so (and refuses)
        self.fp = fingerprint(cfg.tasks_path, cp.fingerprint if cp is not None else None)  # hash only if written
        if cfg.shard is not None:
            self.fp["shard"] = list(cfg.shard)
        ids = IndexBuilder(cfg.run_dir)  # its temporary files go beside the run directory, unlinked
        start = (0, 0, 0)
        if cp is not None:
            how = same_input(cp.fingerprint, self.fp, cfg.tasks_path)
            if how == "changed" or (how == "grown" and not grew_at_line_end(cfg.tasks_path,
                                                                           int(cp.fingerprint["size"]))):
                self._scanned = None  # _open refuses it in its words
                return
            start = (cp.frontier, cp.line_no, cp.index)
            if cp.ids_len:
                try:
                    await asyncio.to_thread(ids.add_logged, self.journal.read_ids_at, cp.ids_len)
                except OSError:
                    ids.close()
                    return  # unreadable ids.bin: _open reads it again and says so
        skip = cfg.on_invalid == "skip"
        tally = Tally()
        look = self._cache_tally(tally)
        try:
            scan = await asyncio.to_thread(prescan, cfg.tasks_path, cfg.max_line_bytes, ids, start=start,
                                           keep_going=skip, should_stop=lambda: self.stopping is not None,
                                           each=self._estimator(tally, look),
                                           schemas=self.schemas)
            hits = None
            if look is not None:
                await asyncio.to_thread(look.finish)
                hits = look.hits
        finally:
            ids.close()
            if look is not None:
                look.known.close()
        assert scan.index is not None
        verdict = judge(scan, str(cfg.tasks_path), skip)
        if not verdict.go:
            scan.index.close()
            assert verdict.say is not None
            if cp is not None:  # the run directory says why this session ended (evalsup status)
                log = EventLog(cfg.run_dir / EVENTS)
                log("end", finished=False, done=cp.succeeded + cp.failed, code=ex.BAD_INPUT, stopped=verdict.reason)
                log.close()
            raise RunRefused(verdict.say, ex.BAD_INPUT)
        if verdict.say:
            self.log(verdict.say, "warning")  # bad lines skipped: --quiet says it too (results will lack them)
        await self._start_budget(tally, cp is not None, hits)
        self._scanned = (start, scan.index)
        if cfg.shard is None and not scan.stopped:  # every non-blank line counted: the total, exact (issue 44)
            self._scan_total = (cp.index if cp is not None else 0) + scan.tasks + scan.invalid

    def _cache_tally(self, tally: Tally) -> CachedTally | None:
        """With a cache that is read (--cache, mode rw or ro): the estimate at the start counts the requests it
        already answers as free, and their answers' lengths as seen (cache.known)."""
        w = self.cfg.worker
        if w.cache_dir is None or w.cache_mode not in ("rw", "ro"):
            return None
        return CachedTally(KnownAnswers(Path(w.cache_dir), w.cache_length), tally)

    def _estimator(self, tally: Tally, look: CachedTally | None = None) -> Callable[[dict[str, Any], int], None]:
        """The pre-scan's eye for the estimate at the start (issue 30): each of this shard's lines counted (with
        a cache, looked up in it first, in batches)."""
        shard, lookup, defaults, w = self.cfg.shard, self.prices.lookup, self.defaults, self.cfg.worker
        keys = KeyMaker(w.cache_model_id, tuple(w.endpoints), w.cache_salt,
                        schema_in_key(w.response_schema, w.validate_schema), key_headers(w.headers))
        anthropic = w.batch is not None and w.batch.get("provider") == "anthropic"
        sent = RequestDefaults(w.model, w.max_tokens, w.temperature)  # what the batch driver fills in

        def each(obj: dict[str, Any], index: int) -> None:
            if FIELD in obj or (isinstance(obj.get("metadata"), dict) and FIELD in obj["metadata"]):
                check_scorers(to_request(obj, sent)[2], w.scorers)  # a task's own scorers (issue 43)
            if anthropic:  # --batch-provider anthropic: a request with no Anthropic form is refused now, by line
                task_params(obj, sent)  # raises Untranslatable (a ValueError): the pre-scan names the line
            if shard is None or index % shard[1] == shard[0]:
                f = figures(obj, defaults)
                price = lookup(f.model)
                model_max = price.completion_bound if price is not None else None
                if look is None:
                    tally.add(f, model_max)
                else:
                    look.offer(Pending(f, model_max, request_key(keys, obj, defaults)[0]))
        return each

    async def _start_budget(self, tally: Tally, resumed: bool, hits: int | None = None) -> None:
        """The estimate's line (not under --quiet); --max-cost with a model that has no price is refused here,
        before any request; with a cap, the budget starts from what results.jsonl says was spent (right after
        any kill: the results file is the source of truth); what the checkpoint says an earlier session learned
        beyond it (cache writes no request asked for) is ``self.learned``'s, which ``_open`` restores and the
        budget shares."""
        cfg = self.cfg
        if tally.requests and cfg.caps.cost is not None:
            unpriced = [m for m in tally.models if self.prices.lookup(m if m != "(no model)" else None) is None]
            if unpriced:
                raise RunRefused(f"--max-cost: no price for model {unpriced[0]!r}"
                                 + (f" (nor {len(unpriced) - 1} other(s))" if len(unpriced) > 1 else "")
                                 + "; give its price with --prices FILE, or --self-hosted for your own endpoint "
                                 "(no request was sent)", ex.BAD_INPUT)
        # the judge's call (--scorer judge) is reserved and spent at its model's price (issue 40): refused
        # without one under --max-cost, as a task's model is
        w = cfg.worker
        judging = "judge" in w.scorers and w.judge_model is not None
        judge_price = self.prices.lookup(w.judge_model) if judging else None
        if judging and cfg.caps.cost is not None and judge_price is None:
            raise RunRefused(f"--max-cost: no price for the judge's model {w.judge_model!r}; give its price with "
                             "--prices FILE, or --self-hosted for your own endpoint (no request was sent)",
                             ex.BAD_INPUT)
        spent: Amount | None = None
        unpriced_results = 0
        read_back: Usage | None = None
        if (cfg.caps.any or (resumed and not cfg.quiet)) and (cfg.run_dir / RESULTS).exists():  # (issue 40: said)
            try:
                # an unpriced judge (token caps only): its tokens still count, at no known cost
                read_judge = judge_price if judge_price is not None or not judging else Price(input=0.0, output=0.0)
                u = await asyncio.to_thread(usage_of_results, cfg.run_dir / RESULTS, self.prices.lookup,
                                            cfg.worker.model, read_judge)
            except JournalError as e:  # a damaged results.jsonl: refused as _open refuses it (evalsup repair)
                raise RunRefused(str(e), e.code) from None
            except OSError as e:
                raise RunRefused(f"cannot read {cfg.run_dir / RESULTS}: {e.strerror}", ex.BAD_INPUT) from None
            spent, unpriced_results = Amount(u.prompt_tokens, u.completion_tokens, u.cost), u.unpriced
            read_back = u
            tally.seen = tally.seen or u.seen
            if resumed and cfg.verbose and not cfg.quiet:
                self._start_notes.append(u.said())
            if u.unpriced and cfg.caps.cost is not None:
                self.log(f"--max-cost: {u.unpriced:,} earlier answer(s) of a model with no price "
                         f"({', '.join(sorted(u.unpriced_models or ()))}): their cost is not counted", "warning")
        self._first = (tally.summary(self.prices.lookup) if tally.requests or hits else None, hits)  # (issue 44)
        if (tally.requests or hits) and cfg.verbose and not cfg.quiet:  # -v: the whole estimate, and the rest
            what = "the lines not yet read" if resumed else "this run"
            cached = "" if hits is None else f"; {hits:,} answered from the cache (free, not counted)"
            self._start_notes.append(start_line(tally.summary(self.prices.lookup), what, self.prices.describe(), cached)
                                     if tally.requests else f"estimate for {what}: all {hits:,} requests answered "
                                     "from the cache: no request, no cost")
        if cfg.caps.any:
            # under --batch-api a first answer takes hours: its tasks do not wait for one (docs/paid-apis.md)
            self.budget = Budget(cfg.caps, spent, unpriced_results, judge_price, self.prices.lookup,
                                 first_answer=w.batch is None, learned=self.learned)
            if read_back is not None:  # the snapshots the models answered as, so far: reserved at from the start
                self.budget.learn(read_back.answered_as, read_back.answered)
            await asyncio.to_thread(self.prices.snapshots, w.model)  # (the names' index, built once: not on the loop)
            self.costs = TaskCosts(self.defaults, self.prices.lookup, hedge=w.hedge, max_reasks=w.max_reasks,
                                   run_schema=w.response_schema is not None, validate_schema=w.validate_schema,
                                   judge=judging, judge_price=judge_price, judge_template=w.judge_template,
                                   judge_max_tokens=w.judge_max_tokens, learned=self.budget.learned,
                                   snapshots=self.prices.snapshots)
            if not cfg.quiet:
                self._start_notes.append(f"budget: {self.budget.text()}"
                                         + (" (spent so far, from results.jsonl)" if resumed else ""))

    def _open(self) -> None:
        cfg = self.cfg
        if not cfg.tasks_path.is_file():
            raise RunRefused(f"{cfg.tasks_path}: no such file", ex.BAD_INPUT)
        if not self.fp:  # not taken by the pre-scan (a damaged checkpoint, or a test that opens directly)
            self.fp = fingerprint(cfg.tasks_path, previous_fingerprint(cfg.run_dir))  # resume: hash only if written
            if cfg.shard is not None:
                self.fp["shard"] = list(cfg.shard)
        try:
            state = self.journal.prepare(self.fp, str(cfg.tasks_path))
        except JournalError as e:
            raise RunRefused(str(e), e.code) from None  # 2: changed input/settings, damaged; EXIT_DISK: disk
        cp = state.checkpoint if state is not None else None
        start = (cp.frontier, cp.line_no, cp.index) if cp is not None else (0, 0, 0)
        scanned = self._scanned
        if scanned is not None and scanned[0] == start:  # the pre-scan's id index: every id up to its end
            self.ids = scanned[1]
        else:  # no pre-scan from here: ids up to the frontier in memory, the rest checked as read
            if scanned is not None:
                scanned[1].close()
            self.ids = IdIndex.empty()
            if cp is not None and cp.ids_len:
                self.ids.load(self.journal.read_ids(cp.ids_len))
        self.reader = TaskReader(cfg.tasks_path, cfg.max_line_bytes, *start, ids=self.ids,
                                 check=None if self.schemas is None else self.schemas.problem)
        self._scanned = None
        if state is None or cp is None:
            return
        self.resumed_from = state
        self.stats.succeeded = cp.succeeded + state.succeeded_after
        self.stats.failed = cp.failed + state.failed_after
        self.stats.invalid = cp.invalid
        self.stats.restore(cp.counters)
        if unasked_in(cp.counters):  # an earlier session's answer was billed writes no request asked for
            self.learned.unasked_writes = True  # (before any dispatch: the budget's reservations read it)
        self.ledger.restore(cp.outstanding, state.done_after)

    # ----- verbs: the only code that spawns, kills, sends frames, holds pipes or writes the journal -----

    async def spawn(self, slot: int, started: Launched | None = None) -> WorkerHandle:
        share = self.cfg.per_worker_concurrency(self.active)[slot]
        # with autoscale, a worker can take all of --concurrency: its share shrinks as workers are added
        conc = self.cfg.concurrency if self.cfg.autoscale else share
        w = WorkerHandle(slot, conc, self.cfg.window_for(share), {}, share)
        w.held = self.ledger.open(w.id)
        # a replacement starts from its predecessor's adaptive limit, not from scratch (issue 21)
        start = max((x.conc_limit for x in self.workers if x.slot == slot), default=0)
        config = self.cfg.worker.to_wire() | {"concurrency": conc, "limit": self._worker_cap(w),
                                              "adaptive_start": start}
        if self.cfg.worker.judge_base_url is not None:  # its share of --judge-concurrency among the workers running
            config["judge_concurrency"] = self.cfg.judge_share(self.active)[slot]
        await w.spawn(config, lambda kind, payload: self._on_frame(w, kind, payload), self.frame_buffers,
                      self._ring_size(), started)
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
        self._in_background(self.spawn(w.slot))

    def add_worker(self, takers: list[WorkerHandle], loads: list[float]) -> None:
        """One more worker slot (autoscale): the workers taking tasks get their smaller shares at once."""
        self.active += 1
        assert self.memory is not None
        self.memory.set_workers(self.active)
        shares = self.cfg.per_worker_concurrency(self.active)
        for w in takers:
            w.share = shares[w.slot]
            w.window = self.cfg.window_for(w.share)
        self._send_limits(takers)
        self.events("scale", workers=self.active, loads=loads)
        self.log(f"workers: each one busy ({', '.join(f'{v:.0%}' for v in loads)} of a core); adding worker "
                 f"{self.active} of at most {self.cfg.workers}")
        self._in_background(self.spawn(self.active - 1))

    def recycle(self, w: WorkerHandle, cause: RecycleCause) -> None:
        """Past the hard RSS limit a worker is killed at once; otherwise it gets no new task and is drained
        (finishes what it holds, then exits). Its replacement starts at once, if not already."""
        if self.stopping is not None or not w.alive or (w.recycling and cause is not RecycleCause.HARD_KILL):
            return
        w.recycling = True
        self.stats.recycles[cause] += 1
        self.events("recycle", cause=cause, pid=w.pid, rss=w.rss, done=w.done)
        if self.metrics is not None:
            self.metrics.recycles.labels(cause).inc()
        now = time.monotonic()
        say = self.gate.note(("recycle", cause), "recycling", now)  # a line a minute at most
        more = "" if say is None or say.changed else \
            f" ({say.times} recycles for this in the last {fmt_duration(now - say.last)})"
        if cause is RecycleCause.HARD_KILL:
            if say is not None:
                self.log(f"worker {w.pid}: RSS {w.rss / MIB:,.0f} MiB past the hard limit; killing and replacing it"
                         + more)
            self.kill(w, Exit.HARD_KILL)
        else:
            why = f"RSS {w.rss / MIB:,.0f} MiB" if cause is RecycleCause.RSS else f"{w.done} tasks done"
            if say is not None:
                self.log(f"worker {w.pid}: {why}; recycling it (drain, a fresh one takes its place){more}")
            w.drain(report=cause is RecycleCause.RSS and self.cfg.worker.trace_memory)
        self.replace(w)
        self.credit.set()

    def kill(self, w: WorkerHandle, cause: Exit) -> None:
        """SIGKILL; what it held is handed on when its process is reaped (``_on_exit``)."""
        w.kill(cause)

    def hand(self, w: WorkerHandle, ref: TaskRef, line: bytes) -> None:
        """Give w a task: the ledger records who holds it, then the TASK frame goes (in the next write)."""
        self.ledger.assign(w.id, ref)
        w.send_task(ref, line)

    def send(self, w: WorkerHandle, kind: FrameKind, obj: Any = None) -> None:
        w.send(kind, obj)

    def broadcast(self, kind: FrameKind, obj: Any = None) -> None:
        for w in self.workers:
            w.send(kind, obj)

    def release_rings(self) -> None:
        """After each write of the journal (``on_written``), the only time ``written`` moves: tell each worker
        which part of its ring is free."""
        written = self.journal.written
        for w in self.workers:
            w.release_ring(written)

    def hold_results(self) -> None:
        """The disk is behind: give the writer all there is (its progress is what releases the hold), and read
        no more results until it catches up."""
        self.journal.flush()
        self._backlogged = True
        self.events("disk_behind", backlog=self.journal.backlog)
        for x in self.workers:
            if x.stream is not None:
                x.stream.hold("backlog")

    def release_results(self) -> None:
        """The journal's backlog fell low (``on_backlog_low``): read results again."""
        if self._backlogged:
            self._backlogged = False
            for x in self.workers:
                if x.stream is not None:
                    x.stream.release("backlog")

    def append(self, line: bytes | memoryview, meta: ResultMeta | None = None) -> None:
        """A task's record, to results.jsonl (through the journal's writer); with its RESULT ``meta``, the
        cache hears of an answer to keep (written once a checkpoint covers the line) or of a hit."""
        cache = self.cache
        if cache is not None and meta is not None:
            if "ck" in meta:
                cache.note(self.journal.base + self.journal.appended, len(line), meta["ck"], int(meta.get("pt") or 0),
                           int(meta.get("ct") or 0))
            elif "ch" in meta:
                cache.touch(meta["ch"])
        self.journal.append(line, ring=meta is not None and "sh" in meta)

    def append_invalid(self, e: TaskError) -> None:
        """A bad input line skipped (--on-invalid skip), to invalid.jsonl."""
        self.stats.invalid += 1
        self.journal.append_invalid(orjson.dumps({"line": e.line_no, "offset": e.offset, "error": e.reason},
                                                 option=orjson.OPT_APPEND_NEWLINE))

    def poison(self, ref: TaskRef) -> None:
        """A task that killed its worker --max-task-crashes times is written as failed (worker_crashed)."""
        msg = f"the worker died {ref.crashes} times while holding this task (line {ref.line_no})"
        line = output_line(ref.id, status=None, request_id=None, body=None,
                           error={"code": "worker_crashed", "message": msg},
                           metrics={"latency_s": None, "attempts": ref.crashes, "worker": None}, metadata=None)
        self.append(line)
        self.stats.on_poisoned(ref.id)
        self.log(f"task {ref.id!r} (line {ref.line_no}) killed its worker {ref.crashes} times; "
                 "written as failed (worker_crashed)")

    def flush(self) -> None:
        """Hand the writer what is buffered (between checkpoints)."""
        self.journal.flush()

    async def checkpoint(self, finished: bool = False) -> None:
        """Snapshot F/O and the counts with no await in between; the journal's writer makes every result
        handed over before it durable and writes checkpoint.json with the results length that covers them."""
        assert self.reader is not None
        led = self.ledger
        self.journal.append_ids(self.reader.ids.take_log())
        cp = Checkpoint(
            fingerprint=self.fp, frontier=self.reader.offset, line_no=self.reader.line_no, index=self.reader.index,
            outstanding=list(led.outstanding()), ids_len=self.journal.ids_length(),
            invalid_len=self.journal.invalid_length(), succeeded=self.stats.succeeded, failed=self.stats.failed,
            invalid=self.stats.invalid, counters=self._counters(),
            finished=finished, done_ahead=sorted(led.done_ahead), pid=os.getpid(),
        )
        self.events("progress", **self.stats.progress())  # the report's time series (tokens, errors by code)
        await self.journal.checkpoint(cp)
        if self.cache is not None:  # the answers whose records are now durable may be kept
            self.cache.committed(cp.results_len)

    def _counters(self) -> dict[str, Any]:
        """The checkpoint's counters: the stats', the budget's figures (evalsup status shows them), and what the
        run learned that every later session must know, with a cap or without (``budget.carried``)."""
        out = self.stats.counters()
        if self.budget is not None:
            out["budget"] = self.budget.to_json(self._left())
        out |= carried(self.learned)
        if self.cache is not None:  # --cache: this session's hits and misses (evalsup status)
            out["cache"] = {"hits": self.stats.cache_hits, "misses": self.stats.cache_misses}
        return out

    def _left(self) -> int | None:
        total = self.counter.total
        return None if total is None else max(0, total - self.stats.done - self.stats.invalid)

    def stop(self, message: str, code: int, mode: StopMode, hand_back: bool = False) -> None:
        """Stop dispatching: NOW ends the workers; DRAIN lets them finish what they hold (within --grace),
        or with ``hand_back`` (SIGTERM) only the requests on the wire: the tasks queued in them and requests
        parked for an outage come back at once, outstanding for the rerun."""
        if self.stopping is StopMode.NOW or (self.stopping is StopMode.DRAIN and mode is StopMode.DRAIN):
            return
        if self.stopping is None:
            self.stop_message, self.stop_code = message, code
        self.stopping = mode
        if mode is StopMode.DRAIN and hand_back:
            for w in self.workers:
                w.drain()
        self.credit.set()

    async def shutdown_workers(self) -> None:
        """At the end: a NOW stop kills the workers; otherwise their input is closed and they exit when done (killed
        after 5 s)."""
        for w in self.workers:
            if self.stopping is StopMode.NOW:
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

    def close(self) -> None:
        """The run's files, after the last checkpoint."""
        self.journal.close()
        if self.cache is not None:
            self.cache.close()
        assert self.memory is not None
        self.memory.close()
        self.events.close()
        if self.reader is not None:
            self.reader.close()
        if self.ids is not None:
            self.ids.close()  # the pre-scan's temporary files: their disk is freed
        if self._scanned is not None:
            self._scanned[1].close()

    # helpers of the verbs (they act only through them)

    def _send_rates(self) -> None:
        """Split the rate limits, global and per endpoint, among the live workers: together they never exceed
        them (evalsup.config.ratelimits)."""
        cfg = self.cfg
        live = [w for w in self.workers if w.alive]
        share = rate_share(cfg.max_requests_per_s, cfg.max_tokens_per_min, cfg.endpoint_rates, cfg.arrivals, len(live))
        if share is None:
            return
        for w in live:
            self.send(w, FrameKind.RATE, share)

    def _send_limits(self, workers: Iterable[WorkerHandle]) -> None:
        judge = self.cfg.judge_share(self.active) if self.cfg.worker.judge_base_url is not None else None
        for w in workers:
            limit: dict[str, int] = {"inflight": self._worker_cap(w)}
            if judge is not None and w.slot < len(judge):  # --scorer judge: its share among the workers running
                limit["judge"] = judge[w.slot]
            self.send(w, FrameKind.LIMIT, limit)

    def _worker_cap(self, w: WorkerHandle) -> int:
        """Requests w may have in flight: its share, less under the memory control's cap or the run's ceiling."""
        cap = min(self.cfg.concurrency if self.memory is None else self.memory.cap, self.ceiling.value)
        return max(1, min(w.share, cap * w.share // self.cfg.concurrency))

    def _in_background(self, spawning: Coroutine[Any, Any, WorkerHandle]) -> None:
        """A worker started off the loop's path; the dispatcher looks again once it is up (or failed)."""
        t = asyncio.create_task(spawning)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)
        t.add_done_callback(lambda _: self.credit.set())

    # ----- the run -----

    async def run(self) -> int:
        await self._prepare()
        quiet_gc()
        self._start_watching()
        self.stall.result(time.monotonic())  # the quiet clock starts with the run, not with the endpoint check
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_signal, sig)
        cfg = self.cfg
        try:
            try:
                await self.checkpoint()  # from the start, the run directory says where the run is
            except JournalError as e:
                self.stop(str(e), e.code, StopMode.NOW)
            loops = [asyncio.create_task(c) for c in (
                self._ticker(), self._monitor(),
                show_progress(cfg.quiet, cfg.log_format, cfg.log_interval_s, self.snapshot, self.log))]
            await self._dispatch()
            if self.stopping is StopMode.DRAIN:
                try:
                    await asyncio.wait_for(self._drain_outstanding(), cfg.grace_s)
                except TimeoutError:
                    self.log(f"grace of {cfg.grace_s:g}s over; {self.ledger.in_flight()} task(s) left for the rerun")
                    self.stopping = StopMode.NOW
            for t in loops:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self.shutdown_workers()
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
                    stopped=self.stop_message or None,  # why, for `evalsup status`
                    **({"reason": self.stop_reason} if self.stop_reason else {}))
        self.close()
        return self.stop_code

    async def _prepare(self) -> None:
        """Start the workers' processes while the input is read and the endpoint checked (their interpreters
        take a moment to start; they send nothing before their settings); open the run directory only once the
        check has passed, so a wrong URL, key or model touches nothing."""
        module = worker_module(bool(self.cfg.worker.batch))
        first = [asyncio.create_task(launch(module, self._ring_size())) for _ in range(self.active)]
        check: asyncio.Task[tuple[list[str], dict[int, str]]] | None = None
        try:
            await self._scan_input()  # before the endpoint check and the workers' settings: bad input sends nothing
            check = asyncio.create_task(check_endpoints(self.cfg)) if self.cfg.check else None
            if (ceiling := self.ceiling.poll()) is not None:  # RUN_DIR/concurrency from the first request on
                self._start_notes.append(ceiling)
            for slot, launching in enumerate(first):
                await self.spawn(slot, await launching)
            if check is not None:
                try:
                    found, failed = await check
                except CheckFailed as e:
                    raise RunRefused(str(e), ex.BAD_INPUT) from None
                if self.cfg.verbose and not self.cfg.quiet:
                    self.log("; ".join(found))
                self._leave_out(failed)  # endpoints that failed the check: reported, the run goes on without
            self._open()
            for note in self._start_notes:  # said once the run goes ahead: a refused run says only why
                self.log(note)
        except BaseException:
            if check is not None:
                check.cancel()
            for w in self.workers:
                self.kill(w, Exit.STOPPED)
            await self._discard(first)
            raise

    async def _discard(self, first: list[asyncio.Task[Launched]]) -> None:
        """The processes launched ahead that no worker took (the run was refused or stopped): killed, reaped.
        A launch is a fork and an exec: awaited to its end, not cancelled, so that no process is left unknown."""
        taken = {w.pid for w in self.workers}
        for started in await asyncio.gather(*first, return_exceptions=True):
            if isinstance(started, Launched) and started.proc.pid not in taken:
                started.discard()
                await started.proc.wait()

    def _ring_size(self) -> int:
        """Each worker's ring: a first worker alone gets all of the rings' budget."""
        return ring_size(self.active, self.cfg.ring_bytes)

    def _start_watching(self) -> None:
        """memory.jsonl, events.jsonl, the line count and the metrics server, once the run directory is open."""
        cfg = self.cfg
        self.memory = MemoryControl(cfg, cfg.run_dir / MEMORY)
        self.events = EventLog(cfg.run_dir / EVENTS, cfg.scrub)
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
                    resumed=self.resumed_from is not None,
                    **({} if self._scan_total is None else {"total": self._scan_total}))
        if not cfg.quiet:  # one start line (supervisor.first_line); -v: the check's, the estimate's, the sizing's
            self.log(self.memory.describe() if cfg.verbose else first_line(cfg, *self._first,
                                                                             resumed=self.resumed_from is not None))
        if self.memory.cap < cfg.concurrency:
            self.log(f"memory: capping requests in flight at {self.memory.cap} of --concurrency {cfg.concurrency} "
                     "until response sizes are known (1 MiB each assumed); the cap follows what they turn out to be")
            self._send_limits(self.workers)  # started before the memory control existed
        if self.resumed_from is not None:
            rs = self.resumed_from
            extra = f", cut a torn last line of {rs.torn_bytes} bytes" if rs.torn_bytes else ""
            self.log(f"resuming: {rs.done:,} done, {self.ledger.waiting():,} to redo, reading on from line "
                     f"{rs.checkpoint.line_no + 1:,}{extra}")

    # ----- dispatch -----

    def _next_task(self) -> tuple[TaskRef, bytes, dict[str, Any] | None] | None:
        """The next task to hand out: (its ref, its line, the line parsed when the reader has just parsed it)."""
        cfg = self.cfg
        assert self.reader is not None
        ref = self.ledger.take_redo()
        if ref is not None:
            return ref, read_line_at(cfg.tasks_path, ref.offset, cfg.max_line_bytes), None
        while not self.exhausted:
            try:
                got = self.reader.next()
            except TaskError as e:
                if cfg.on_invalid == "skip":
                    self.append_invalid(e)
                    continue
                self.reader.unread()  # a rerun must meet this line again, not read on past it
                self.stop(bad_input(e), ex.BAD_INPUT, StopMode.DRAIN)  # a line appended while the run went
                return None
            if got is None:
                self.exhausted = True
                return None
            ref, line, index = got
            if cfg.shard is not None and index % cfg.shard[1] != cfg.shard[0]:
                continue  # another shard's line (still validated, and its id still counts for duplicates)
            if self.ledger.skip(ref.id):
                continue
            return ref, line, self.reader.last_obj
        return None

    def _afford(self, ref: TaskRef, line: bytes, obj: dict[str, Any] | None) -> bool:
        """With a cap (issues 30, 40): the budget decides whether this task goes (reserving all it may cost:
        ``budget.TaskCosts``); a task that may not is put back first in line, and the run waits or stops as the
        budget says (exit 75, exit_reason budget; a model with no price under --max-cost: exit 2)."""
        b, costs = self.budget, self.costs
        if b is None or costs is None:
            return True
        d = b.afford(ref.offset, *costs.worst(orjson.loads(line) if obj is None else obj))
        if d.verdict is Verdict.GO:
            return True
        self.ledger.put_back(ref)
        if d.verdict is Verdict.UNPRICED:
            self.stop(f"{d.say} (task {ref.id!r}, line {ref.line_no}); give its price with --prices FILE, or "
                      "--self-hosted", ex.BAD_INPUT, StopMode.DRAIN)
        elif d.verdict is Verdict.STOP:
            self.stop_reason = "budget"
            self.events("budget", cap=d.cap, **b.to_json())
            self.stop(d.say, ex.RESUMABLE, StopMode.DRAIN)
        return False

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
        return self.stopping is None and not self.paused and not self.endpoints.open and \
            not (self.budget is not None and self.budget.waiting)

    async def _dispatch(self) -> None:
        """Hand out tasks until the input is done and nothing is outstanding, or a stop is asked."""
        led = self.ledger
        while self.stopping is None:
            if not self._may_dispatch():
                await self._wait_credit()
                continue
            if led.has_suspects():
                sw = self._pick_worker(suspect_free=True)
                if sw is not None:
                    ref = led.take_suspect()
                    assert ref is not None
                    line = read_line_at(self.cfg.tasks_path, ref.offset, self.cfg.max_line_bytes)
                    if not self._afford(ref, line, None):
                        continue
                    self.hand(sw, ref, line)
                    await sw.pipe_room()
                    continue
            if self.exhausted and not led.has_redo():
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
            if not self._afford(*task):
                return
            self.hand(w, task[0], task[1])
            if w.out is not None and w.out.must_drain():
                await w.pipe_room()

    async def _drain_outstanding(self) -> None:
        while self.ledger.in_flight() and self.stopping is not StopMode.NOW:
            await self._wait_credit()

    # ----- periodic work -----

    async def _ticker(self) -> None:
        cfg = self.cfg
        last_flush = last_cp = prev = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            frozen = self.hang.frozen_for(prev, now)
            prev = now
            if frozen:
                # the supervisor itself did not run (the tree was frozen): its workers could not beat either
                for w in self.workers:
                    w.last_beat += frozen
                    w.started += frozen
            try:
                if now - last_cp >= cfg.checkpoint_interval_s:
                    await self.checkpoint()
                    last_cp = last_flush = now
                elif now - last_flush >= cfg.flush_interval_s:
                    self.flush()
                    last_flush = now
            except JournalError as e:
                self.stop(str(e), e.code, StopMode.NOW)
                return
            self._breaker_tick(now)
            by_id = {w.id: w for w in self.workers}
            for hung in self.hang.hung(self.workers, now):
                w = by_id[hung.id]
                if not hung.starting:
                    self.log(f"worker {w.pid} sent no heartbeat for {hung.silent_s:.0f}s (hung); killing it")
                self.kill(w, Exit.HUNG)
            self._stall_tick(now)

    def _on_wire(self, now: float) -> list[OnWire]:
        """The requests the live workers' last heartbeats name, oldest first (supervisor.stall)."""
        # a row of a task answered since the heartbeat was sent is stale: its task is no longer held (issue 44)
        return on_wire(((w.id, w.last_beat, [r for r in w.old or () if int(r[0]) in w.held])
                        for w in self.workers if w.alive), now)

    def _name_wire(self, x: OnWire) -> dict[str, Any]:
        """A request on the wire as memory.jsonl and the stall line name it: the task's id, not its key."""
        w = next((w for w in self.workers if w.id == x.worker), None)
        ref = w.held.get(x.key) if w is not None else None
        urls = self.endpoints.urls
        return {"id": ref.id if ref is not None else None, "endpoint": urls[x.endpoint] if 0 <= x.endpoint < len(urls)
                else None, "age_s": round(x.age_s, 1), "attempt": x.attempt, "bytes": x.got} | (
                    {"hedge": True} if x.hedge else {})  # the second copy of a hedged task (one id on the wire twice)

    def _stall_tick(self, now: float) -> None:
        """``StallWatch`` decides whether the run has stalled on its oldest requests; STALL goes to their workers."""
        got = self.stall.check(now, self._on_wire(now), paused=self.endpoints.open or self.stopping is StopMode.NOW)
        if got is None:
            return
        named = [self._name_wire(x) for x in got.oldest]
        self.events("stall", quiet_s=round(got.quiet_s, 1), requests=named)
        self.log(f"stalled: no result for {got.quiet_s:.0f}s (--stall-after {got.age_s:g}s); abandoning and retrying "
                 f"what has been on the wire that long (timeout_stall): " + "; ".join(
                     f"{n['id']!r}{' (hedge)' if n.get('hedge') else ''} at {n['endpoint']}, {n['age_s']:.0f}s, "
                     f"attempt {n['attempt']}, {n['bytes']:,} bytes"
                     for n in named))
        by_id = {w.id: w for w in self.workers}
        for wid in got.workers:
            if (w := by_id.get(wid)) is not None and w.alive:
                self.send(w, FrameKind.STALL, {"age": got.age_s})

    async def _monitor(self) -> None:
        """Every --monitor-interval: the memory control decides (``MemoryControl.tick``), this applies it."""
        assert self.memory is not None
        mem = self.memory
        while True:
            await asyncio.sleep(self.cfg.monitor_interval_s)
            if (ceiling := self.ceiling.poll()) is not None:  # RUN_DIR/concurrency changed (supervisor.ceiling)
                self.log(ceiling)
            mem.ceiling = self.ceiling.shown
            mem.concurrency_limit = limit_total(self.workers)  # into memory.jsonl (issue 21)
            mem.limit_why = limit_reason(self.workers)  # and why it is low (issue 41), for status
            mem.on_wire = sum(w.wire for w in self.workers if w.alive)
            mem.oldest = [self._name_wire(x) for x in self._on_wire(time.monotonic())[:WIRE_TOP]]  # for status
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
                self.broadcast(FrameKind.PAUSE)
            elif dec.throttle == "resume":
                self.paused = False
                self.events("resume", working_set=mem.last_ws)
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use, below the low mark; resuming")
                self.broadcast(FrameKind.RESUME)
                self.credit.set()
            if dec.inflight_cap is not None or ceiling is not None:
                self._send_limits(self.workers)
            for wid, cause in dec.recycle:
                if (w := by_id.get(wid)) is not None:
                    self.recycle(w, cause)
            big = mem.give_back(time.monotonic(), self.paused and self.stopping is None, self.ledger.any_started(),
                                self.workers)
            if big is not None:
                self.log(f"memory: {mem.last_ws / MIB:,.0f} MiB in use with nothing in flight (above the low mark); "
                         f"recycling the largest worker ({big.rss / MIB:,.0f} MiB) to give memory back")
                self.recycle(by_id[big.id], RecycleCause.RSS)
            if self.cfg.autoscale:
                self._maybe_scale(mem)

    def _update_gauges(self) -> None:
        mem = self.memory
        assert self.metrics is not None and mem is not None
        self.metrics.update(sum(w.wire for w in self.workers if w.alive), self.paused, self.endpoints.open,
                            {w.slot: w.rss for w in self.workers if w.alive}, mem.last_supervisor_rss, mem.last_ws,
                            mem.limit, limit_total(self.workers), endpoint_loads(self.workers, self.endpoints))
        self.metrics.scores(self.stats.scores, self.stats.groups)
        if self.budget is not None:
            self.metrics.update_budget(self.budget.to_json(self._left()))

    def _maybe_scale(self, mem: MemoryControl) -> None:
        """Automatic worker count: the workers' CPU is sampled here, ``ScaleUp.may_add`` decides."""
        now = time.monotonic()
        takers = [w for w in self.workers if w.state is State.READY and not w.recycling]
        self.scaler.observe(now, ((w.pid, c) for w in takers if (c := cpu_seconds(w.pid)) is not None))
        gate = ScaleGate(active=self.active, max_workers=self.cfg.workers, paused=self.paused,
                         stopping=self.stopping is not None, input_done=self.exhausted,
                         starting=any(w.state is State.STARTING for w in self.workers), memory_cap=mem.cap,
                         concurrency=self.cfg.concurrency)
        if self.scaler.may_add(now, gate):
            loads = [round(v, 3) for v in self.scaler.loads.values()]
            self.scaler.changed(now)  # measure afresh from here
            self.add_worker(takers, loads)

    # ----- what workers say -----

    async def _reap(self, w: WorkerHandle) -> None:
        assert w.proc is not None and w.stream is not None
        err = await w.stream.closed
        if err is not None:
            self.log(f"worker {w.pid}: broken pipe ({err})")
            self.kill(w, Exit.CRASHED)
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
        self.append(line, meta)
        if (note := self.stats.on_result(meta)) is not None:
            self.log(note, "warning")
        if self.budget is not None and self.budget.settle_result(ref.offset, meta):
            self.credit.set()  # dispatch waited on the budget: what settled may leave room
        if self.metrics is not None and "ca" in meta:  # --cache: hits and misses (Prometheus)
            self.metrics.on_cache(meta["ca"])
        self.stall.result(time.monotonic())
        if self.metrics is not None:
            self.metrics.on_result(meta)
        if self.memory is not None and meta["ok"]:
            self.memory.budget.observe(int(meta.get("rb", 0)))
        w.done += 1
        then = after_result(w, input_done=self.exhausted, suspects_waiting=self.ledger.has_suspects(),
                            stopping=self.stopping is not None, backlog=self.journal.backlog,
                            backlog_high=Journal.BACKLOG_HIGH, held=self._backlogged)
        if then.wake:
            self.credit.set()  # wake the dispatcher only when it has something to do: a refill, the end
        if then.step == "recycle":
            self.recycle(w, RecycleCause.TASKS)
        elif then.step == "warm":
            self.replace(w)  # warm up its successor, so the recycle costs no throughput
        if then.hold:
            self.hold_results()

    def _on_returned(self, w: WorkerHandle, payload: memoryview) -> None:
        keys = decode_json(payload).get("keys", [])
        self.ledger.returned(w.id, keys)
        self._release(keys)
        self.credit.set()

    def _release(self, keys: Iterable[int]) -> None:
        """Tasks handed back unanswered: their reservations go (nothing spent), and dispatch may look again."""
        if self.budget is None:
            return
        if any([self.budget.release(int(k)) for k in keys]):
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
        w.limit_why = beat.get("why")  # why a low limit is low (issue 41)
        w.old = beat.get("old")  # its oldest requests on the wire (supervisor.stall; memory.jsonl for status)

    def _on_ready(self, w: WorkerHandle, payload: memoryview) -> None:
        w.ready()
        self.credit.set()

    def _on_fatal(self, w: WorkerHandle, payload: memoryview) -> None:
        """FATAL: a worker cannot go on. Before READY its settings are wrong (the stop comes with its exit); once
        running, a request could not be sent at all (issue 34): a setting is wrong, not the endpoint, so the run
        stops at once (exit 2), its tasks outstanding for the rerun, and nothing waits for the endpoint."""
        got = decode_json(payload)
        w.fatal = str(got.get("message"))
        if w.state is not State.STARTING:  # the batch driver names its own code (75: `evalsup cancel`)
            self.stop(w.fatal, int(got.get("code") or ex.BAD_INPUT), StopMode.NOW)

    def _on_leaks(self, w: WorkerHandle, payload: memoryview) -> None:
        self.log(write_leaks(self.cfg.run_dir, w.pid, str(decode_json(payload).get("text", ""))))

    def _on_exit(self, w: WorkerHandle, rc: int) -> None:
        how = w.exited()
        if w in self.workers:
            self.workers.remove(w)
        self._release(list(w.held))
        for ref in self.ledger.gone(w.id, died=how.died):
            self.poison(ref)
        self.credit.set()
        self._send_rates()
        then = after_exit(how, fatal=bool(w.fatal), stopping=self.stopping is not None, intensity=self.intensity,
                          now=time.monotonic())
        if then.step == "stop_fatal":
            self.stop(f"worker could not start: {w.fatal}", ex.BAD_INPUT, StopMode.NOW)
            return
        cause = then.cause
        if cause is None:
            return
        self.stats.restarts[cause] += 1
        self.events("restart", cause=cause, pid=w.pid, exit=rc)
        if self.metrics is not None:
            self.metrics.restarts.labels(cause).inc()
        if then.step == "stop_crash_loop":
            self.stop(f"more than {self.cfg.max_restarts} unplanned worker restarts within 60s (last: worker "
                      f"{w.pid} {cause}, exit {rc}); stopping instead of crash-looping", ex.RESUMABLE, StopMode.NOW)
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
            now = time.monotonic()
            eps.leave_out(e, why, now)
            self.gate.note(("endpoint", e), "out", now)
            self.log(f"{eps.name(e)} left out of this run: {why}")
            self.broadcast(FrameKind.BREAKER_OPEN, {"e": e, "out": True})
            if eps.open and not was_open:  # the others left are all ejected just now
                self.events("breaker_open", reason=eps.reason)
                self._say_paused(now)

    def _on_trip(self, w: WorkerHandle, payload: memoryview) -> None:
        t = decode_json(payload)
        reason, e = str(t.get("reason", "")), int(t.get("e", 0))
        eps = self.endpoints
        if eps.trip(e, time.monotonic(), reason):
            self.broadcast(FrameKind.BREAKER_OPEN, {"e": e})
            if eps.open:
                self.events("breaker_open", reason=reason)
            if eps.many:
                self.events("endpoint_out", endpoint=e, reason=reason)
            # said when a probe fails (``_say_down``): a trip the first probe clears is a false alarm
        elif 0 <= e < len(eps.breakers) and eps.breakers[e].open:
            self.send(w, FrameKind.BREAKER_OPEN, {"e": e})

    def _say_down(self, e: int, now: float, detail: str) -> None:
        """Endpoint e is down (a probe failed, or none answered within CONFIRM_S): a line when it goes down,
        then at most one a minute while it stays down (with several all down at once, one for them all)."""
        eps, gate, key = self.endpoints, self.gate, ("endpoint", e)
        b = eps.breakers[e]
        if gate.state(key) != "down":
            gate.note(key, "down", now)
            if not self._say_paused(now) and eps.many:
                self.log(f"{eps.name(e)} looks down ({b.reason}); ejected: the others take its requests, it is "
                         f"probed on its own ({len(eps.up())} of {len(eps.urls)} up)")
            return
        if eps.many and gate.state(("run",)) == "paused":  # the whole run waits: one line for every endpoint
            say = gate.note(("run",), "paused", now)
            if say is not None:
                probes = sum(eps.breakers[i].probes_failed for i in eps.live())
                self.log(f"every endpoint still down after {fmt_duration(now - eps.opened_at)} "
                         f"({probes} probes failed); probing each every {b.paused_probe_s:g}s")
            return
        say = gate.note(key, "down", now)
        if say is not None:
            self.log(f"{eps.name(e)} still down after {fmt_duration(now - b.opened_at)} ({b.probes_failed} probes "
                     f"failed, the last: {detail}); next probe in {max(0.0, b.next_probe_at - now):.0f}s")

    def _say_paused(self, now: float) -> bool:
        """Every endpoint left is down, each said so: the run's pause, said once (True when said now)."""
        eps, gate = self.endpoints, self.gate
        if not eps.open or gate.state(("run",)) == "paused" or \
                any(gate.state(("endpoint", i)) != "down" for i in eps.live()):
            return False
        gate.note(("run",), "paused", now)
        every = "every endpoint is down" if eps.many else "endpoint looks down"
        self.log(f"{every} ({eps.reason}); pausing dispatch and probing (every {PAUSED_PROBE_S:g}s at most), no "
                 f"task is failed meanwhile (gives up after --max-wait-down {self.cfg.max_wait_down_s:g}s)")
        return True

    def _on_probe_result(self, w: WorkerHandle, payload: memoryview) -> None:
        r = decode_json(payload)
        ok, detail, e = bool(r.get("ok")), str(r.get("detail", "")), int(r.get("e", 0))
        now = time.monotonic()
        eps = self.endpoints
        paused, since = eps.open, eps.opened_at
        if eps.probe_result(e, ok, now):
            b = eps.breakers[e]
            if paused:
                self.events("breaker_close", down_s=round(now - since, 3), was_down=b.was_down)
            if eps.many:
                self.events("endpoint_back", endpoint=e, down_s=round(now - b.opened_at, 3), was_down=b.was_down)
            self._say_up(e, now, detail, paused)
            self.broadcast(FrameKind.BREAKER_CLOSE, {"was_down": b.was_down, "e": e})
            self.credit.set()
        elif 0 <= e < len(eps.breakers) and eps.breakers[e].open and not ok:
            self._say_down(e, now, detail)

    def _say_up(self, e: int, now: float, detail: str, paused: bool) -> None:
        """Endpoint e's breaker closed: "back" when it had been said down; else the trip was a false alarm,
        said once and then at most once a minute with a count."""
        eps, gate = self.endpoints, self.gate
        b = eps.breakers[e]
        if paused:
            gate.forget(("run",))
        if gate.state(("endpoint", e)) == "down":
            gate.note(("endpoint", e), "up", now)
            if b.was_down:
                self.log(f"{eps.name(e)} is back after {now - b.opened_at:.1f}s ({b.probes_failed} probes failed); "
                         + ("resuming" if paused else "it rejoins"))
                return
        say = gate.note(("false alarm", e), "answers", now)
        if say is not None:
            more = "" if say.changed else f" ({say.times} such trips in the last {fmt_duration(now - say.last)})"
            self.log(f"{eps.name(e)} answers ({detail}): the failures were those tasks' own; they use up their "
                     f"attempts (--max-attempts){more}")

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
                  "(OPENAI_API_KEY or --api-key-file)", ex.RESUMABLE, StopMode.NOW)

    def _breaker_tick(self, now: float) -> None:
        eps = self.endpoints
        if eps.down_too_long(now):
            what = "every endpoint has" if eps.many else "the endpoint has"
            self.stop(f"{what} been down for more than --max-wait-down {self.cfg.max_wait_down_s:g}s "
                      f"({eps.reason})", ex.RESUMABLE, StopMode.NOW)
            return
        for e in eps.probes_due(now):
            ready = [w for w in self.workers if w.state is State.READY]
            if ready:
                self.send(max(ready, key=lambda x: x.parked), FrameKind.PROBE, {"e": e})
                eps.probe_sent(e, now)
        for e in eps.live():  # a trip no probe has answered yet (a probe may hang): said as down all the same
            b = eps.breakers[e]
            if b.open and now - b.opened_at >= CONFIRM_S and self.gate.state(("endpoint", e)) != "down":
                self._say_down(e, now, f"no probe answered within {CONFIRM_S:g}s")

    # ----- what a person sees -----

    def state(self) -> str:
        if self.stopping is not None:
            return "draining" if self.stopping is StopMode.DRAIN else "stopping"
        if self.endpoints.open:  # every endpoint down
            return "waiting for endpoint"
        if self.paused:
            return "throttled"
        if self.budget is not None and self.budget.waiting:  # the next task would pass a cap: the tasks out settle
            # first (issues 30, 40); or a model's first answer is awaited under --max-cost (its billed price)
            return "waiting for a first answer's price" if self.budget.first_pending else "waiting for budget"
        return "running"

    def view(self) -> RunView:
        """The run as progress and the summary read it."""
        cfg = self.cfg
        return RunView(state=self.state(), stats=self.stats, rate=self.rate, in_flight=self.ledger.in_flight(),
                       total=self.counter.total, workers=tuple(self.workers), memory=self.memory,
                       endpoints=self.endpoints, active=self.active, first_workers=cfg.first_workers,
                       max_workers=cfg.workers, autoscale=cfg.autoscale, concurrency=cfg.concurrency,
                       adaptive=cfg.adaptive, run_dir=cfg.run_dir, finished=self.finished,
                       stop_message=self.stop_message,
                       cache=self.cache.summary() if self.cache is not None else None,
                       budget=None if self.budget is None else self.budget.to_json(self._left()),
                       price_of=self.prices.lookup, prices=self.prices.to_json())

    def snapshot(self) -> dict[str, Any]:
        """The figures the bar, the log lines and --log-format json show (supervisor.progress.snapshot)."""
        return progress_snapshot(self.view(), time.monotonic())

    # ----- signals -----

    def on_signal(self, signum: int) -> None:
        self._signals += 1
        if signum == signal.SIGTERM and self._signals == 1:
            self.log(f"SIGTERM: finishing requests in flight (up to {self.cfg.grace_s:g}s), then checkpointing")
            self.stop("stopped by SIGTERM", ex.RESUMABLE, StopMode.DRAIN, hand_back=True)
        else:
            self.stop("interrupted", ex.RESUMABLE, StopMode.NOW)
            self.stop_message, self.stop_code = "interrupted", ex.RESUMABLE
