"""``checkpoint.json``: what it holds, how it is written (atomically) and read. Part of the journal.

The checkpoint never claims more than what is fsynced. Besides the dispatch frontier ``F``, the outstanding
set ``O`` and the covered length ``L`` of ``results.jsonl``, it holds the line count and a running CRC-32 of
``results[:L]``, so a resume checks every covered line in one read (see evalsup.rundir.results_file).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.config.exitcodes import RESUMABLE
from evalsup.rundir.layout import CHECKPOINT
from evalsup.tasks.reader import TaskRef

CHECKPOINT_VERSION = 1

# The exit code of a run that stopped because the run directory could not be written (disk full, read-only):
# resumable once the cause is fixed (evalsup.config.exitcodes.RESUMABLE, as issue 19 asks of every resumable stop).
EXIT_DISK = RESUMABLE


class JournalError(Exception):
    """The run directory cannot be used (disk full, unwritable, changed input...). ``code`` is the exit code:
    2 for what the user must decide (changed input or settings, a damaged file), EXIT_DISK for a disk that
    could not be written."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class RunDirDamaged(JournalError):
    """A line of results.jsonl is not a record, or the file does not match its checkpoint: exit 2, the message
    names ``results.jsonl:LINE`` and the way out (``evalsup repair``)."""


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a disk full: leave no half file behind (the old one stands)
        raise
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass
class Checkpoint:
    fingerprint: dict[str, Any]
    frontier: int = 0  # F: input byte offset; every line before it was dispatched
    line_no: int = 0  # physical lines before F
    index: int = 0  # non-blank lines before F (shard numbering)
    outstanding: list[TaskRef] = field(default_factory=list)  # O
    results_len: int = 0  # L
    results_lines: int | None = None  # lines in results[:L] (None: a checkpoint from before this was kept)
    results_crc: int | None = None  # CRC-32 of results[:L]
    ids_len: int = 0  # bytes of ids.bin covering every id before F
    invalid_len: int = 0  # bytes of invalid.jsonl covered
    succeeded: int = 0  # records in results[:L] without error
    failed: int = 0  # records in results[:L] with an error
    invalid: int = 0  # lines skipped as invalid before F
    counters: dict[str, Any] = field(default_factory=dict)  # restarts, recycles...: carried across resumes
    done_ahead: list[str] = field(default_factory=list)  # ids at or past F already in results[:L] (an earlier D)
    pid: int = 0  # the supervisor that wrote it (for `evalsup status`)
    finished: bool = False
    # results.jsonl was rewritten (`evalsup repair`, --retry-failed): O and done_ahead are to be worked out
    # again from the task file and the records (evalsup.rundir.rewrite.reconcile) when the run next opens
    reconcile: bool = False
    time: float = 0.0

    def to_json(self) -> bytes:
        d = {
            "version": CHECKPOINT_VERSION,
            "fingerprint": self.fingerprint,
            "frontier": self.frontier,
            "line_no": self.line_no,
            "index": self.index,
            "outstanding": [[t.offset, t.line_no, t.id, t.crashes] for t in self.outstanding],
            "results_len": self.results_len,
            "results_lines": self.results_lines,
            "results_crc": self.results_crc,
            "ids_len": self.ids_len,
            "invalid_len": self.invalid_len,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "invalid": self.invalid,
            "counters": self.counters,
            "done_ahead": self.done_ahead,
            "pid": self.pid,
            "finished": self.finished,
            "reconcile": self.reconcile,
            "time": self.time,
        }
        return orjson.dumps(d, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes) -> Checkpoint:
        d = orjson.loads(data)
        if d.get("version") != CHECKPOINT_VERSION:
            raise JournalError(f"checkpoint version {d.get('version')} is not {CHECKPOINT_VERSION}")
        return cls(
            fingerprint=d["fingerprint"], frontier=d["frontier"], line_no=d["line_no"], index=d["index"],
            outstanding=[TaskRef(o, n, i, c) for o, n, i, c in d["outstanding"]],
            results_len=d["results_len"], results_lines=d.get("results_lines"), results_crc=d.get("results_crc"),
            ids_len=d["ids_len"], invalid_len=d["invalid_len"],
            succeeded=d["succeeded"], failed=d["failed"], invalid=d["invalid"], counters=d.get("counters", {}),
            done_ahead=list(d.get("done_ahead", [])), pid=int(d.get("pid", 0)),
            finished=d.get("finished", False), reconcile=bool(d.get("reconcile", False)), time=d.get("time", 0.0),
        )


def read_checkpoint(p: Path) -> Checkpoint | None:
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Checkpoint.from_json(data)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise JournalError(f"{p}: unreadable checkpoint ({e})") from None


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    return read_checkpoint(run_dir / CHECKPOINT)


def previous_fingerprint(run_dir: Path) -> dict[str, Any] | None:
    """The input fingerprint the run directory's checkpoint records (None if none or unreadable): lets
    tasks.fingerprint skip hashing a file not written since."""
    try:
        cp = load_checkpoint(run_dir)
    except (JournalError, OSError):
        return None
    return cp.fingerprint if cp is not None else None
