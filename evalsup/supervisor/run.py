"""Entry point of a run: the event loop, the supervisor, and the summary at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson
import uvloop

from evalsup.config import RunConfig
from evalsup.journal import write_atomic
from evalsup.supervisor.arbiter import RunStopped, Supervisor
from evalsup.supervisor.summary import build_summary, print_summary, summary_line


def _logger(cfg: RunConfig) -> Any:
    if cfg.log_format == "json":
        def log_json(msg: str, level: str = "info") -> None:
            sys.stderr.write(orjson.dumps({"t": round(time.time(), 3), "level": level, "msg": msg}).decode() + "\n")
            sys.stderr.flush()

        return log_json

    def log(msg: str, level: str = "info") -> None:
        print(f"evalsup: {msg}", file=sys.stderr, flush=True)

    return log


def run(cfg: RunConfig) -> int:
    """Run a job to its end (or a stop); returns the process exit code."""
    log = _logger(cfg)
    sup = Supervisor(cfg, log)
    start = time.monotonic()
    try:
        code = uvloop.run(sup.run())
    except RunStopped as e:
        log(str(e), "error")
        return e.code
    wall = time.monotonic() - start
    summary = build_summary(sup, wall)
    try:
        write_atomic(cfg.run_dir / "summary.json", orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    except OSError as e:
        log(f"cannot write summary.json: {e.strerror}")
    if cfg.json_summary:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif cfg.quiet:
        print(summary_line(summary), flush=True)  # -q: one line
        if code in (0, 130, 143):
            return code  # the line says it all
    else:
        from rich.console import Console

        print_summary(summary, Console())
    if sup.stop_message:
        how = "" if code == 2 else f"; rerun the same command to resume ({summary['total']:,} done so far)"
        log(f"{sup.stop_message}{how}", "error" if code not in (0, 130, 143) else "info")
    return code
