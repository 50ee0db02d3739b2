"""Entry point of a run: the event loop, the supervisor, and the summary at the end."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import uvloop

from evalsup.cache.feed import CacheFeed
from evalsup.cache.mounts import network_problem
from evalsup.cache.store import CacheError, Store
from evalsup.config import exitcodes
from evalsup.config.run_config import RunConfig
from evalsup.config.shards import shard_mismatch
from evalsup.rundir.checkpoint import EXIT_DISK, JournalError, load_checkpoint, write_atomic
from evalsup.rundir.journal import OpenOptions
from evalsup.rundir.layout import CHECKPOINT, RESULTS, SUMMARY
from evalsup.rundir.lock import RunDirBusy, RunDirError, RunDirLock
from evalsup.supervisor import early_signals as earlysignals
from evalsup.supervisor.arbiter import RunRefused, Supervisor
from evalsup.supervisor.summary import build_summary, print_summary, summary_line
from evalsup.tasks.requests import public_url


def _logger(cfg: RunConfig) -> Any:
    """The run's one way to stderr: ``log(msg, level)``. "info" is what happened on the way (hidden by
    --quiet); "warning" and "error" are what stops the run or refuses it, which --quiet still prints. Every line
    without the run's secrets (a worker's message may quote what an endpoint echoed; issue 39)."""
    quiet, scrub = cfg.quiet, cfg.scrub.text

    if cfg.log_format == "json":
        def log_json(msg: str, level: str = "info") -> None:
            if quiet and level == "info":
                return
            sys.stderr.write(orjson.dumps({"t": round(time.time(), 3), "level": level, "msg": scrub(msg)}).decode()
                             + "\n")
            sys.stderr.flush()

        return log_json

    def log(msg: str, level: str = "info") -> None:
        if quiet and level == "info":
            return
        print(f"evalsup: {scrub(msg)}", file=sys.stderr, flush=True)

    return log


def run(cfg: RunConfig, notes: Sequence[str] = ()) -> int:
    """Run a job to its end (or a stop); returns the process exit code (evalsup.config.exitcodes). With
    ``cfg.retry_failed``, the records of those error codes are taken out and their tasks sent again (see
    evalsup.rundir.rewrite).

    The run directory's lock is taken before anything else (before the endpoint check, whose request a second,
    refused run must not send) and held until the end; a run refused for any reason leaves no directory of
    its own making behind. ``notes``: the command's lines for the start (the settings taken from a file or from
    run.json), said once the lock is held and the run's settings pass: a refused run says only why (issue 44)."""
    from evalsup.rundir.run_json import refusal, request_settings

    log = _logger(cfg)
    lock = RunDirLock(cfg.run_dir)
    try:
        lock.acquire()
    except RunDirBusy as e:
        return _refused(cfg, log, str(e), exitcodes.LOCKED)
    except RunDirError as e:
        return _refused(cfg, log, str(e), exitcodes.BAD_INPUT)
    try:
        why = _wrong_shard(cfg)
        if why is None and _resuming(cfg.run_dir):  # changed request settings: before the endpoint check's request
            why = refusal(cfg.run_dir, request_settings(cfg), cfg.accept_changed_settings)
        if why is not None:
            return _refused(cfg, log, why, exitcodes.BAD_INPUT)
        for note in notes:
            log(note)
        cfg, feed = _open_cache(cfg, log)
        if isinstance(feed, str):
            return _refused(cfg, log, feed, exitcodes.BAD_INPUT)
        settings = OpenOptions(settings=request_settings(cfg), accept_changed_settings=cfg.accept_changed_settings,
                               endpoints=[public_url(u) for u in cfg.worker.endpoints],
                               retry_failed=cfg.retry_failed, max_line_bytes=cfg.max_line_bytes, log=log)
        try:
            return _run_locked(cfg, log, settings, feed)
        finally:
            if feed is not None:
                feed.close()
    finally:
        lock.release(tidy=True)


def _open_cache(cfg: RunConfig, log: Any) -> tuple[RunConfig, CacheFeed | str | None]:
    """The answer cache's writer (issue 30), or the one line that refuses the run (a cache on a network file
    system), or None (no cache; a cache that cannot be opened is one warning and the run goes on without it)."""
    w = cfg.worker
    if w.cache_dir is None:
        return cfg, None
    where = Path(w.cache_dir)
    problem = network_problem(where)
    if problem is not None:
        return cfg, problem
    try:
        store = Store(where)
    except CacheError as e:
        log(f"warning: {e}; the run goes on without the cache (every request is sent)", "warning")
        return dataclasses.replace(cfg, worker=dataclasses.replace(w, cache_dir=None)), None
    return cfg, CacheFeed(store, cfg.run_dir / RESULTS, w.cache_mode, cfg.cache_max_bytes, log)


def _resuming(run_dir: Path) -> bool:
    """As the journal tells a resume: a checkpoint, or results (rundir.journal.Journal.prepare)."""
    results = run_dir / RESULTS
    return (run_dir / CHECKPOINT).exists() or (results.exists() and results.stat().st_size > 0)


def _wrong_shard(cfg: RunConfig) -> str | None:
    try:
        cp = load_checkpoint(cfg.run_dir)
    except JournalError:
        return None  # the journal says what is wrong with it
    return None if cp is None else shard_mismatch(cp.fingerprint, cfg.shard, str(cfg.run_dir))


def _refused(cfg: RunConfig, log: Any, message: str, code: int) -> int:
    log(message, "error")
    if cfg.json_summary:
        out = {**exitcodes.describe(code), "stopped": cfg.scrub.text(message), "run_dir": str(cfg.run_dir)}
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    return code


async def _with_early_signals(sup: Supervisor) -> int:
    """A SIGTERM/SIGINT while workers start and the endpoint is checked (before the supervisor installs its
    own handlers) is handed to the supervisor too, so the run still ends with a checkpoint and exit 75 rather
    than dying of the signal (143)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, sup.on_signal, sig)  # replaced by the supervisor's own in Supervisor.run
    for early in earlysignals.take():  # came in before the loop ran (evalsup.supervisor.early_signals)
        sup.on_signal(early)
    return await sup.run()


def _run_locked(cfg: RunConfig, log: Any, options: OpenOptions, cache: CacheFeed | None = None) -> int:
    sup = Supervisor(cfg, log)
    sup.cache = cache
    sup.journal.options = options
    start = time.monotonic()
    try:
        code = uvloop.run(_with_early_signals(sup))
    except RunRefused as e:
        return _refused(cfg, log, str(e), e.code)
    except OSError as e:  # a write of the run directory's side files (events, memory samples) on a full disk
        where = f" {e.filename}" if e.filename else ""
        return _refused(cfg, log, f"cannot write{where}: {e.strerror}; the run directory still describes what is "
                        "safely on disk; rerun the same command to resume", EXIT_DISK)
    if sup.journal.broken:
        _counts_from_disk(sup, log)
    if code == exitcodes.OK and not sup.finished:  # 0 only when every task has its record
        code = exitcodes.RESUMABLE
    wall = time.monotonic() - start
    summary = build_summary(sup.view(), wall)
    summary.update(exitcodes.describe(code))
    if sup.stop_reason is not None and code == exitcodes.RESUMABLE:
        summary["exit_reason"] = sup.stop_reason  # "budget": a cap stopped it (issue 30)
    summary = cfg.scrub.json(summary)  # its messages (what stopped the run) may quote an endpoint
    try:
        write_atomic(cfg.run_dir / SUMMARY, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    except OSError as e:
        if not sup.journal.broken:  # after a failed write of the results, that one line says it all
            log(f"cannot write summary.json: {e.strerror}", "error")
    if cfg.json_summary:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif cfg.quiet:
        print(summary_line(summary), flush=True)  # -q: one line
        if code == exitcodes.OK:
            return code  # the line says it all
    else:
        from rich.console import Console

        print_summary(summary, Console())
    if sup.stop_message:
        again = "with a higher cap" if sup.stop_reason == "budget" else "the same command"
        how = f"; rerun {again} to resume ({summary['total']:,} done so far)" \
            if code == exitcodes.RESUMABLE else ""
        # what stopped the run: said in every mode (a resumable stop is a warning: rerun to go on)
        log(f"{sup.stop_message}{how} (exit {code})", "error" if code != exitcodes.RESUMABLE else "warning")
    return code


def _counts_from_disk(sup: Supervisor, log: Any) -> None:
    """After a failed write some results counted were never written: count what a rerun will find instead."""
    from evalsup.rundir.checkpoint import JournalError
    from evalsup.rundir.results_file import counts_on_disk

    try:
        before = sup.stats.done
        sup.stats.succeeded, sup.stats.failed = counts_on_disk(sup.cfg.run_dir)
        sup.stats.session_done = max(0, sup.stats.session_done - (before - sup.stats.done))
    except (JournalError, OSError) as e:
        log(f"cannot count the results on disk: {e}", "error")
