"""Entry point of a run: the event loop, the supervisor, and the summary at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson
import uvloop

from evalsup.config import RunConfig
from evalsup.journal import EXIT_DISK, OpenOptions, write_atomic
from evalsup.supervisor.arbiter import RunStopped, Supervisor
from evalsup.supervisor.summary import build_summary, print_summary


def _logger(cfg: RunConfig) -> Any:
    if cfg.log_format == "json":
        def log_json(msg: str, level: str = "info") -> None:
            sys.stderr.write(orjson.dumps({"t": round(time.time(), 3), "level": level, "msg": msg}).decode() + "\n")
            sys.stderr.flush()

        return log_json

    def log(msg: str, level: str = "info") -> None:
        print(f"evalsup: {msg}", file=sys.stderr, flush=True)

    return log


def run(cfg: RunConfig, accept_changed_settings: bool = False, retry_failed: frozenset[str] | None = None) -> int:
    """Run a job to its end (or a stop); returns the process exit code. ``retry_failed``: error codes whose
    records are taken out and their tasks sent again (empty: every error), see evalsup.rebuild."""
    from evalsup.settings import request_settings

    log = _logger(cfg)
    sup = Supervisor(cfg, log)
    sup.journal.options = OpenOptions(settings=request_settings(cfg), accept_changed_settings=accept_changed_settings,
                                      retry_failed=retry_failed, max_line_bytes=cfg.max_line_bytes, log=log)
    start = time.monotonic()
    try:
        code = uvloop.run(sup.run())
    except RunStopped as e:
        log(str(e), "error")
        return e.code
    except OSError as e:  # a write of the run directory's side files (events, memory samples) on a full disk
        where = f" {e.filename}" if e.filename else ""
        log(f"cannot write{where}: {e.strerror}; the run directory still describes what is safely on disk; "
            "rerun the same command to resume", "error")
        return EXIT_DISK
    if sup.journal.broken:
        _counts_from_disk(sup, log)
    wall = time.monotonic() - start
    summary = build_summary(sup, wall)
    try:
        write_atomic(cfg.run_dir / "summary.json", orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    except OSError as e:
        if not sup.journal.broken:  # after a failed write of the results, that one line says it all
            log(f"cannot write summary.json: {e.strerror}")
    if cfg.json_summary:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        from rich.console import Console

        print_summary(summary, Console())
    if sup.stop_message:
        how = "" if code == 2 else f"; rerun the same command to resume ({summary['total']:,} done so far)"
        log(f"{sup.stop_message}{how}", "error" if code not in (0, 130, 143) else "info")
    return code


def _counts_from_disk(sup: Supervisor, log: Any) -> None:
    """After a failed write some results counted were never written: count what a rerun will find instead."""
    from evalsup.journal import JournalError
    from evalsup.results_file import counts_on_disk

    try:
        before = sup.stats.done
        sup.stats.succeeded, sup.stats.failed = counts_on_disk(sup.cfg.run_dir)
        sup.stats.session_done = max(0, sup.stats.session_done - (before - sup.stats.done))
    except (JournalError, OSError) as e:
        log(f"cannot count the results on disk: {e}")
