"""Each batch's life, and the batches together: queued (``validating``), checked (``check.py``), run as an
evalsup run in a child process (``python -m evalsup run INPUT --out RUN_DIR --base-url ...``, the entry the CLI,
the Python API and the Ray shards use: the same supervisor, workers, journal and checkpoints), its live
request_counts read from the run directory (``tools.status``), then finalized into OpenAI's output and error files.

Crash-proof by construction: every state change is written (``store.py``) before it is acted on, and the run is
evalsup's, which resumes exactly once. After a kill -9 of the server, its children get SIGTERM (they drain and
checkpoint, ``common.child.die_with_parent``); on restart every batch not ended starts again from its state: a
queued one is queued, a running one reruns the same command (a resume: nothing answered is sent again; while the
old child still drains, the new one meets the directory's lock, exit 73, and is tried again a second later), a
finalizing one is finalized again (the output files' ids are derived from the batch's, so a second finalizing
writes the same files)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsup.common.child import child_env, die_with_parent, last_message
from evalsup.config.exitcodes import BAD_INPUT, LOCKED, OK
from evalsup.rundir.layout import CEILING
from evalsup.serve import shapes
from evalsup.serve.check import check_input
from evalsup.serve.fair import Live, Queued, Running, Seen, Share, next_batch, preempt, step
from evalsup.serve.results import split
from evalsup.serve.store import BatchRec, Store
from evalsup.tools.status import RunState, run_status

log = logging.getLogger("evalsup.serve")
POLL_S = 1.0  # how often a running batch's counts are read
INPUT, RUN, CHILD_ERR = "input.jsonl", "run", "child.err"
YIELDED = "yielded"  # _run's answer for a batch that gave its slot back (not an OpenAI state)


@dataclass(frozen=True)
class Settings:
    upstreams: tuple[str, ...]
    api_key_env: str
    max_running: int = 4
    concurrency: int = 256  # per upstream, shared live by the running batches (fair.step)
    retention_s: int = 30 * 86400
    run_args: tuple[str, ...] = ()  # more `evalsup run` options, as given


def derived_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same however many times it is finalized."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


class Batches:
    def __init__(self, store: Store, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.store, self.settings, self.clock = store, settings, clock
        self.queue: list[str] = []
        self.running: dict[str, asyncio.Task[None]] = {}
        self.children: dict[str, asyncio.subprocess.Process] = {}
        self.last_start: dict[str, float] = {}
        self.stopping = False
        self.wakes: dict[str, asyncio.Event] = {}  # a batch waiting to try its run again is woken by a cancel
        self.started: dict[str, float] = {}  # when each running batch got its slot
        self.yielding: set[str] = set()  # running batches asked to give their slot back (fair.preempt)
        self.shares: dict[str, Share] = {}  # each running batch's ceiling on the upstream (fair.step)
        self.seen: dict[str, Seen] = {}  # what each running batch's status said last

    # the API's verbs
    def create(self, owner: str, input_file_id: str, endpoint: str, window: str,
               metadata: dict[str, str] | None) -> dict[str, Any]:
        """Record a new batch (its input's bytes linked into its run home first), queue it; its object."""
        now = int(self.clock())
        bid = shapes.new_batch_id()
        home = self.store.run_home(bid)
        home.mkdir()
        self.store.link_input(input_file_id, home / INPUT)
        seconds = shapes.window_seconds(window) or 0
        batch = shapes.batch_object(bid, input_file_id=input_file_id, endpoint=endpoint, completion_window=window,
                                    created_at=now, expires_at=now + seconds, metadata=metadata)
        self.store.save_batch(bid, BatchRec(owner, batch))
        log.info("%s validating (key %s, input %s, %s)", bid, owner[:8] or "-", input_file_id, endpoint)
        self.queue.append(bid)
        self.schedule()
        return batch

    def cancel(self, bid: str) -> dict[str, Any]:
        rec = self.store.batches[bid]
        if rec.batch["status"] in shapes.ENDED or rec.batch["status"] in (shapes.CANCELLING, shapes.FINALIZING):
            return rec.batch
        was = rec.batch["status"]
        self._move(bid, shapes.CANCELLING)
        if bid in self.queue:
            self.queue.remove(bid)
            if was == shapes.VALIDATING:  # never started: nothing answered
                self._move(bid, shapes.CANCELLED)
            else:  # it yielded its slot: what its run answered goes to the output file
                self._start(bid)
        else:
            self._signal(bid)
        return rec.batch

    # the server's start and end
    def resume(self) -> None:
        """After a start: every batch not ended goes on from its state (see the module's doc)."""
        for bid, rec in sorted(self.store.batches.items(), key=lambda kv: kv[1].batch["created_at"]):
            status = rec.batch["status"]
            if status == shapes.VALIDATING:
                self.queue.append(bid)
            elif status not in shapes.ENDED:
                log.info("%s %s: resumed after a restart", bid, status)
                self._start(bid)
        self.schedule()

    async def drain(self) -> None:
        """SIGTERM: every run checkpoints and stops (their batches resume at the next start)."""
        self.stopping = True
        for bid in {*self.children, *self.wakes}:
            self._signal(bid)
        await asyncio.gather(*self.running.values(), return_exceptions=True)

    def schedule(self) -> None:
        while not self.stopping and self.queue and len(self.running) < self.settings.max_running:
            q = [Queued(b, self.store.batches[b].owner, self.store.batches[b].batch["created_at"]) for b in self.queue]
            bid = next_batch(q, self.last_start)
            if bid is None:
                return
            self.queue.remove(bid)
            self.last_start[self.store.batches[bid].owner] = self.clock()
            self._start(bid)
        if self.stopping or not self.queue:
            return
        victim = preempt([Running(b, self.store.batches[b].owner, self.started.get(b, 0.0))
                          for b in self.running if b not in self.yielding],
                         [Queued(b, self.store.batches[b].owner, 0) for b in self.queue],
                         self.settings.max_running - len(self.yielding))
        if victim is not None and self.store.batches[victim].batch["status"] == shapes.IN_PROGRESS:
            self.yielding.add(victim)
            log.info("%s yields its slot to another key's batch: it waits in line to resume", victim)
            self._signal(victim)

    def sweep(self) -> None:
        """Retention: files past their expires_at, and ended batches older than --retention-hours (their record
        and run directory), removed."""
        now = self.clock()
        for fid, f in list(self.store.files.items()):
            exp = f.file.get("expires_at")
            if exp is not None and exp <= now:
                self.store.delete_file(fid)
                log.info("%s removed: past its expires_at", fid)
        for bid, rec in list(self.store.batches.items()):
            b = rec.batch
            ended = b.get("completed_at") or b.get("failed_at") or b.get("expired_at") or b.get("cancelled_at")
            if b["status"] in shapes.ENDED and ended and ended + self.settings.retention_s <= now:
                self.store.delete_batch(bid)
                log.info("%s removed: ended more than the retention ago", bid)

    # the life of one batch
    def _start(self, bid: str) -> None:
        self.started[bid] = self.clock()
        task = asyncio.get_running_loop().create_task(self._life(bid), name=bid)
        self.running[bid] = task

    async def _life(self, bid: str) -> None:
        rec = self.store.batches[bid]
        try:
            if rec.batch["status"] == shapes.VALIDATING:
                home = self.store.run_home(bid)
                checked = await asyncio.to_thread(check_input, home / INPUT, rec.batch["endpoint"])
                if checked.errors:
                    rec.batch = {**rec.batch, "errors": shapes.batch_errors(checked.errors),
                                 "request_counts": {"total": checked.total, "completed": 0, "failed": 0}}
                    self._move(bid, shapes.FAILED, f"{len(checked.errors)} error(s), the first at line "
                                                   f"{checked.errors[0]['line']}")
                    return
                rec.total = checked.total
                rec.batch = {**rec.batch, "model": checked.model,
                             "request_counts": {"total": checked.total, "completed": 0, "failed": 0}}
                if rec.batch["status"] == shapes.VALIDATING:  # not cancelled meanwhile
                    self._move(bid, shapes.IN_PROGRESS, f"{checked.total:,} requests")
                else:
                    self.store.save_batch(bid, rec)
            ending = rec.ending
            if ending is None and rec.batch["status"] == shapes.CANCELLING:
                ending = shapes.CANCELLED
            if ending is None and rec.batch["status"] == shapes.FINALIZING:
                ending = shapes.COMPLETED
            if ending is None:
                try:
                    ending = await self._run(bid)
                finally:
                    self._leave(bid)  # its run is over: its share goes to the others
                if ending is None:  # the server is stopping: the batch resumes at the next start
                    return
                if ending == YIELDED:  # in line again, to resume where its run stopped
                    self.queue.append(bid)
                    return
            if ending == shapes.FAILED:
                return
            await self._finalize(bid, ending)
        except Exception:
            log.exception("%s: an internal error; the batch goes on at the next start", bid)
        finally:
            self.running.pop(bid, None)
            self.wakes.pop(bid, None)
            self.started.pop(bid, None)
            self.yielding.discard(bid)
            self.schedule()

    def _command(self, bid: str) -> list[str]:
        home = self.store.run_home(bid)
        s = self.settings
        cmd = [sys.executable, "-m", "evalsup", "run", str(home / INPUT), "--out", str(home / RUN)]
        if not self._env():
            for u in s.upstreams:
                cmd += ["--base-url", u]
        # --no-check: an upstream down when a run starts is waited for (the run's breaker, then serve's retries
        # until the window ends), never a failed batch; a model it does not serve is each line's error
        # --max-concurrency: the whole upstream limit; its share of it now is the ceiling in RUN_DIR/concurrency
        cmd += ["--api-key-env", s.api_key_env, "--max-concurrency", str(s.concurrency),
                "--no-check", *s.run_args, "--json", "--quiet"]
        return cmd

    def _env(self) -> dict[str, str]:
        """Upstreams holding user:password@ go to the run as OPENAI_BASE_URL, off its command line (which any
        process listing shows), as the Python API passes them."""
        ups = self.settings.upstreams
        if any("@" in urllib.parse.urlsplit(u).netloc for u in ups) and not any("," in u for u in ups):
            return {"OPENAI_BASE_URL": ",".join(ups)}
        return {}

    async def _run(self, bid: str) -> str | None:
        """Run the batch's evalsup run to its end; how the batch ends (None: the server stops; YIELDED: it gave
        its slot to another key's batch)."""
        rec = self.store.batches[bid]
        home = self.store.run_home(bid)
        if (home / RUN).exists():  # a resumed batch: its counts so far, before its run's first second
            await self._count(bid)
        failures, waited = 0, False
        while True:
            if self.stopping:
                return None
            if rec.batch["status"] == shapes.CANCELLING:
                return shapes.CANCELLED
            if self.clock() >= rec.batch["expires_at"]:
                return shapes.EXPIRED
            if bid in self.yielding:
                return YIELDED
            if not self._room(bid):  # every request the upstream takes is held by another batch: it gives some
                if not waited:  # back within seconds (fair.step)
                    waited = True
                    log.info("%s waits for room on the upstream: the running batches hold all %d requests of "
                             "--concurrency until they give some back", bid, self.settings.concurrency)
                await self._nap(bid, POLL_S)
                continue
            waited = False
            if not self._write_ceiling(bid):  # before the run starts: a stale file (a server before a crash) never
                self._leave(bid)  # rules it; one that cannot be written keeps the run from starting
                await self._nap(bid, 5 * POLL_S)
                continue
            with open(home / CHILD_ERR, "ab") as err, open(home / "child.out", "wb") as out:
                proc = await asyncio.create_subprocess_exec(
                    *self._command(bid), stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
                    env={**child_env(), **self._env()},
                    start_new_session=True, preexec_fn=die_with_parent if sys.platform == "linux" else None)
            self.children[bid] = proc
            signalled = False
            try:
                while proc.returncode is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(proc.wait(), POLL_S)
                    await self._count(bid)
                    self._share_out()
                    if not signalled and self.clock() >= rec.batch["expires_at"]:
                        signalled = self._signal(bid)
            finally:
                self.children.pop(bid, None)
            code = proc.returncode
            if code == OK and rec.batch["status"] != shapes.CANCELLING:
                return shapes.COMPLETED
            if self.stopping:
                return None
            if bid in self.yielding and rec.batch["status"] == shapes.IN_PROGRESS:
                return YIELDED
            if code == LOCKED:  # the run before a restart still drains
                await asyncio.sleep(1.0)
                continue
            if code == BAD_INPUT and rec.batch["status"] != shapes.CANCELLING:
                why = last_message(_tail(home / CHILD_ERR)) or "the run refused its input"
                rec.batch = {**rec.batch, "errors": shapes.batch_errors(
                    [{"code": "invalid_request", "message": why, "param": None, "line": None}])}
                self._move(bid, shapes.FAILED, why)
                return shapes.FAILED
            if rec.batch["status"] == shapes.CANCELLING or self.clock() >= rec.batch["expires_at"]:
                continue  # the loop's head says which
            failures += 1
            delay = min(60.0, 2.0 ** failures, max(0.0, rec.batch["expires_at"] - self.clock()))
            log.warning("%s: its run stopped (exit %s: %s); again in %.0fs", bid, code,
                        last_message(_tail(home / CHILD_ERR)) or "no message", delay)
            self._leave(bid)  # its share goes to the others meanwhile
            await self._nap(bid, delay)

    async def _nap(self, bid: str, delay: float) -> None:
        """Wait ``delay`` seconds; a cancel or the server's stop ends the wait (``_signal``)."""
        wake = self.wakes.setdefault(bid, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), delay)
        wake.clear()

    # the upstream's requests shared by the running batches (fair.step)
    def _room(self, bid: str) -> bool:
        """The batch takes part in the sharing; True once it has a ceiling of at least 1 to start its run with."""
        if bid not in self.shares:
            self.shares[bid] = Share()
            rec = self.store.batches[bid]
            counts = rec.batch.get("request_counts") or {}
            self.seen.setdefault(bid, Seen(max(0, rec.total - int(counts.get("completed") or 0)
                                               - int(counts.get("failed") or 0))))
        self._share_out()
        return self.shares[bid].ceiling > 0

    def _leave(self, bid: str) -> None:
        """The batch's run is over (or waits to be tried again): its share goes to the others."""
        self.shares.pop(bid, None)
        self.seen.pop(bid, None)
        self._share_out()

    def _share_out(self) -> None:
        """Every running batch's ceiling recomputed; each one changed written into its run directory."""
        if not self.shares:
            return
        live = [Live(b, self.store.batches[b].owner, self.seen.get(b, Seen(0)), sh) for b, sh in self.shares.items()]
        for bid, new in step(self.settings.concurrency, live, self.clock()).items():
            old = self.shares[bid]
            self.shares[bid] = new
            if new.ceiling != old.ceiling and new.ceiling > 0:  # (a run starting now reads it too)
                log.debug("%s: ceiling %d of --concurrency %d", bid, new.ceiling, self.settings.concurrency)
                self._write_ceiling(bid)

    def _write_ceiling(self, bid: str) -> bool:
        """RUN_DIR/concurrency, atomically (temp + rename): its run reads it at its next tick. False when it could
        not be written (said): a lowering not written is never seen applied, so its room stays counted."""
        run = self.store.run_home(bid) / RUN
        tmp = run / (CEILING + ".tmp")
        try:
            run.mkdir(exist_ok=True)
            tmp.write_text(f"{self.shares[bid].ceiling}\n")
            os.replace(tmp, run / CEILING)
        except OSError as e:
            log.warning("%s: cannot write its ceiling (%s): %s", bid, run / CEILING, e.strerror or e)
            return False
        return True

    async def _count(self, bid: str) -> None:
        rec = self.store.batches[bid]
        st = await asyncio.to_thread(run_status, self.store.run_home(bid) / RUN)
        rec.batch = {**rec.batch, "request_counts": {"total": rec.total, "completed": st.ok, "failed": st.failed}}
        if bid in self.shares:  # no run of it alive (ours, or one from before a restart holding the lock): none of
            # its requests in flight (a run starting, before its first checkpoint, may already have read its file)
            child = self.children.get(bid)
            stopped = (child is None or child.returncode is not None) and st.state is not RunState.RUNNING
            self.seen[bid] = Seen(max(0, rec.total - st.ok - st.failed), st.concurrency_limit, st.in_flight,
                                  st.ceiling, st.sampled_at, stopped)

    def _signal(self, bid: str) -> bool:
        """SIGTERM to the batch's run (it drains and checkpoints), or wake it from a wait to try again."""
        if (wake := self.wakes.get(bid)) is not None:
            wake.set()
        proc = self.children.get(bid)
        if proc is None or proc.returncode is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        return True

    async def _finalize(self, bid: str, ending: str) -> None:
        rec = self.store.batches[bid]
        if rec.ending != ending:
            rec.ending = ending
            if ending == shapes.COMPLETED:
                self._move(bid, shapes.FINALIZING)
            else:
                self.store.save_batch(bid, rec)
        home, tmp = self.store.run_home(bid), self.store.tmp_dir
        out_tmp, err_tmp = tmp / f"{bid}.output", tmp / f"{bid}.errors"
        s = await asyncio.to_thread(split, home / RUN / "results.jsonl", home / INPUT, out_tmp, err_tmp,
                                    ending == shapes.EXPIRED, bid)
        ids: dict[str, str | None] = {}
        for kind, path, n in (("output", out_tmp, s.answered), ("error", err_tmp, s.errors)):
            if n == 0:
                path.unlink(missing_ok=True)
                ids[kind] = None
                continue
            fid = derived_file_id(bid, kind)
            now = int(self.clock())
            self.store.add_file(rec.owner, shapes.file_object(
                fid, size=path.stat().st_size, created_at=now, filename=f"{bid}_{kind}.jsonl",
                purpose="batch_output", expires_at=now + self.settings.retention_s), path)
            ids[kind] = fid
        summary = _json(home / RUN / "summary.json")
        if isinstance(summary.get("latency_s"), dict):  # the upstream's latency, for /metrics
            rec.extra["latency_s"] = summary["latency_s"]
        rec.batch = {**rec.batch, "output_file_id": ids["output"], "error_file_id": ids["error"],
                     "request_counts": {"total": rec.total, "completed": s.answered, "failed": s.errors},
                     "usage": s.usage()}
        self._move(bid, ending, f"{s.answered:,} answered, {s.errors:,} in the error file")

    def _move(self, bid: str, status: str, note: str = "") -> None:
        rec = self.store.batches[bid]
        rec.batch = shapes.moved(rec.batch, status, int(self.clock()))
        self.store.save_batch(bid, rec)
        log.info("%s %s%s", bid, status, f": {note}" if note else "")


def _tail(path: Path, size: int = 1 << 16) -> list[str]:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode("utf-8", "replace").splitlines()


def _json(path: Path) -> dict[str, Any]:
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}
