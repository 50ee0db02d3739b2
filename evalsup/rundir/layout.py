"""The run directory's layout: the name of every file in it, the shard directory name, what makes a directory a
run directory, and whether a writer holds one now. Each is defined here once; the rest of evalsup asks here.

    RUN_DIR/
      results.jsonl         one record a task, in completion order (the journal)
      checkpoint.json       what the journal has fsynced: frontier, outstanding tasks, covered length
      checkpoint.next.json  a rewrite's commit point, present only while one is being finished (rewrite.py)
      ids.bin, invalid.jsonl  the ids seen past the checkpoint; the task lines that were not tasks
      run.json              the settings the run was made with (run_json.py)
      events.jsonl, memory.jsonl  what happened (sessions, restarts, breaker...); memory samples
      concurrency           optional: one integer, the run's ceiling on requests in flight, read while it runs
                            (written by a person or `evalsup serve`, temp + rename; supervisor/ceiling.py)
      summary.json          the last session's summary
      input.json, tasks.jsonl  where the input came from; the run's own copy of a non-plain input (inputs.py)
      damaged.jsonl, replaced.jsonl  lines `repair` and `run --retry-failed` took out of results.jsonl
      report.html, results.scored.jsonl, scores.json  `evalsup report` and `evalsup score`
      evalsup.lock          the writer's lock (lock.py)

A run sharded with ``--shard K/N`` writes into ``TASKS.run/shard-K-of-N/`` (shard_dir_name, parse_shard_dir);
``run --fresh`` moves a run directory aside as ``NAME.old-TIME``, which no tool counts as part of the run any more.
Names defined elsewhere because the package table wants it (config may not import rundir; the lock names its own
file) are imported here, so this module is still the one to ask.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from evalsup.config.run_config import RUN_DIR_SUFFIX
from evalsup.config.shards import parse_shard_dir, shard_dir_name
from evalsup.rundir.lock import LOCK_NAME, MOVED_ASIDE, holder_info

__all__ = ["CEILING", "CHECKPOINT", "CHECKPOINT_NEXT", "DAMAGED", "EVENTS", "IDS", "INPUT_COPY", "INPUT_INFO",
           "INVALID", "LOCK", "MEMORY", "MOVED_ASIDE", "REPLACED", "REPORT", "RESULTS", "RUN_DIR_MARKS",
           "RUN_DIR_SUFFIX", "RUN_JSON", "SCORED", "SCORES", "SUMMARY", "is_moved_aside", "is_run_dir", "lock_holder",
           "parse_shard_dir", "shard_dir_name", "writer_alive"]

RESULTS = "results.jsonl"
CHECKPOINT = "checkpoint.json"
CHECKPOINT_NEXT = "checkpoint.next.json"
IDS = "ids.bin"
INVALID = "invalid.jsonl"
RUN_JSON = "run.json"
EVENTS = "events.jsonl"
MEMORY = "memory.jsonl"
CEILING = "concurrency"  # the ceiling on requests in flight, changed while the run runs (supervisor.ceiling)
SUMMARY = "summary.json"
INPUT_INFO = "input.json"
INPUT_COPY = "tasks.jsonl"
DAMAGED = "damaged.jsonl"
REPLACED = "replaced.jsonl"
REPORT = "report.html"
SCORED = "results.scored.jsonl"
SCORES = "scores.json"
BATCHES = "batches.jsonl"  # the Batch API's intent journal (evalsup.batch.journal, issue 31)
BATCH_FILES = "batches"  # the chunks' input, output and error files
LOCK = LOCK_NAME  # defined by lock.py, which creates it
# Defined where the package table needs them (config may not import rundir), used from here:
# RUN_DIR_SUFFIX, the default run directory's ending (TASKS.jsonl -> TASKS.run, config.run_config.default_run_dir);
# shard_dir_name and parse_shard_dir (config.shards), the shard directory's name and its one parser.

# A directory holding any of these is a run directory (a run writes all three from its first moments on).
RUN_DIR_MARKS = (CHECKPOINT, RESULTS, EVENTS)

def is_moved_aside(path: Path) -> bool:
    """``run --fresh`` moved it aside (``NAME.old-TIME``): it is no part of the run any more."""
    return MOVED_ASIDE in path.name


def is_run_dir(path: Path) -> bool:
    """A run directory: a directory holding a checkpoint, results or events (see RUN_DIR_MARKS)."""
    return any((path / n).exists() for n in RUN_DIR_MARKS)


def lock_holder(run_dir: Path) -> dict[str, object] | None:
    """Who holds the run directory's lock, as it wrote of itself (host, pid, started, command; {} while it is
    just starting), or None when nobody does (lock.holder_info)."""
    return holder_info(run_dir)


def writer_alive(run_dir: Path, command: str | None = None) -> bool:
    """Is another process writing the run directory now? Its lock is held, and not by this process. The kernel
    drops the lock however its holder ends (kill -9 included), so a dead writer never counts. With ``command``
    ("run"), only a holder doing that counts (`evalsup score` holding a stopped run's directory is no run); a
    holder still starting has not written what it does yet and counts."""
    info = holder_info(run_dir)
    if info is None:
        return False
    if command is not None and info.get("command", command) != command:
        return False
    return not (info.get("pid") == os.getpid() and info.get("host") == socket.gethostname())
