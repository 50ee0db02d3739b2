"""The results file, the checkpoint and the resume scan: the crash-safety core.

A task is done exactly when its line is in ``results.jsonl``. The checkpoint never claims more than
what is fsynced: results are flushed and fsynced first, then ``checkpoint.json`` is written atomically
(temp file, fsync, rename, fsync of the directory). It holds the dispatch frontier ``F`` (every line
before it was dispatched), the outstanding tasks ``O`` (dispatched, not yet in the covered results) and
``L``, the covered length of ``results.jsonl`` with its line count and CRC-32. On resume the covered lines
are checked in one read, the results after ``L`` are parsed for the ids ``D`` that finished since; ``O - D``
is redone and reading goes on from ``F`` skipping ``D``. See docs/architecture.md.

The parts, all in evalsup/rundir/: checkpoint.py (the file), writer.py (the writer threads), results_file.py
(checked reading, the scan), rewrite.py (repair and --retry-failed), run_json.py (run.json).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from evalsup.rundir import layout
from evalsup.rundir.checkpoint import (
    EXIT_DISK,
    Checkpoint,
    JournalError,
    load_checkpoint,
)
from evalsup.rundir.results_file import (
    ResumeState,
    complete_length,
    prefix_sums,
    scan_results,
    second_record,
    verify_covered,
)
from evalsup.rundir.rewrite import finish_pending, reconcile, rewrite
from evalsup.rundir.writer import BACKLOG_HIGH, CACHED_MOST, Writer
from evalsup.tasks.fingerprint import grew_at_line_end, same_input


@dataclass
class OpenOptions:
    """How a run opens its directory (set by supervisor.run from the command line)."""

    settings: dict[str, Any] | None = None  # the request settings, for run.json (None: not guarded)
    endpoints: list[str] | None = None  # the endpoints' public URLs, for run.json (a note when they change)
    accept_changed_settings: bool = False
    retry_failed: frozenset[str] | None = None  # error codes to send again (empty: every error); None: no
    max_line_bytes: int = 16 << 20
    log: Callable[[str], None] = lambda msg: None


def _disk(what: str, e: OSError) -> JournalError:
    return JournalError(f"cannot {what}: {e.strerror}", EXIT_DISK)


class Journal:
    """Owns the run directory's results file, ids.bin, invalid.jsonl and checkpoint.

    A thread of its own (``_Writer``) does every write to ``results.jsonl``, in the order asked for, and a
    second one the fsyncs, so the event loop never waits for the disk: page-cache copies and fsyncs of a run
    of large results take most of a core. Lines are ``append``ed and handed over by ``flush`` at the end of the
    loop's iteration (issue 40: a kill -9 then loses no answer that reached the supervisor); ``checkpoint``
    fsyncs what was handed over before it and then writes ``checkpoint.json``. Errors and
    completions come back on the event loop.
    """

    BACKLOG_HIGH = BACKLOG_HIGH  # past this many bytes not yet written, the supervisor stops reading results

    def __init__(self, run_dir: Path, cached: int = CACHED_MOST) -> None:
        self.run_dir = run_dir
        self.cached = cached  # results.jsonl's tail left in the page cache (writer.cached_tail)
        self.results_path = run_dir / layout.RESULTS
        self.checkpoint_path = run_dir / layout.CHECKPOINT
        self.ids_path = run_dir / layout.IDS
        self.invalid_path = run_dir / layout.INVALID
        self._buf: list[bytes | memoryview] = []
        self._buf_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_due = False  # a flush is scheduled for the end of this loop iteration
        self._buf_ring = False  # the buffered lines include one in a worker's ring (``on_written`` after them)
        self.appended = 0  # bytes handed to append() this session
        self.base = 0  # the length results.jsonl had when this session opened it: a line goes at base + appended
        self._results: IO[bytes] | None = None
        self._ids: IO[bytes] | None = None
        self._invalid: IO[bytes] | None = None
        self._writer: Writer | None = None
        self.options = OpenOptions()
        self._broken: str | None = None  # a failed write of ids.bin or invalid.jsonl
        self.last_checkpoint = 0.0
        # called on the event loop when a write fails (the message says what failed) and when the backlog
        # falls back below a quarter of BACKLOG_HIGH
        self.on_error: Callable[[str], None] = lambda msg: None
        self.on_backlog_low: Callable[[], None] = lambda: None
        self.on_written: Callable[[], None] | None = None  # after each write, on the loop, if set

    @property
    def broken(self) -> str | None:
        """After a failed write the file may hold part of what was lost; no checkpoint may be written after
        that (it would drop the lost tasks from O), so the last good one stands and a rerun redoes them."""
        return self._broken or (self._writer.broken if self._writer is not None else None)

    @property
    def written(self) -> int:
        """Bytes of this session's appended lines the writer has written (a line ending at ``appended`` after
        its append is in the file, and its buffer is let go, once ``written`` reaches that)."""
        return self._writer.written if self._writer is not None else 0

    @property
    def backlog(self) -> int:
        """Bytes handed to the writer (or buffered) and not yet written."""
        return self._buf_bytes + (self._writer.backlog if self._writer is not None else 0)

    # ----- opening -----

    def prepare(self, fingerprint: dict[str, Any], input_name: str) -> ResumeState | None:
        """Create the run directory, or check and repair it for a resume; None means a fresh start. Refuses
        (JournalError, nothing changed) a changed input, changed request settings or a damaged results file."""
        opt = self.options
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            finish_pending(self.run_dir)  # a repair or --retry-failed that a crash interrupted
        except OSError as e:
            raise _disk(f"prepare run directory {self.run_dir}", e) from None
        cp = load_checkpoint(self.run_dir)
        has_results = self.results_path.exists() and self.results_path.stat().st_size > 0
        resuming = cp is not None or has_results
        if cp is not None:
            how = same_input(cp.fingerprint, fingerprint, Path(input_name))
            if how == "grown" and not grew_at_line_end(Path(input_name), int(cp.fingerprint["size"])):
                how = "changed"
            if how == "changed":
                raise JournalError(
                    f"{input_name} changed since the run in {self.run_dir} started (its content differs; lines "
                    "appended at the end are fine); rerun with --fresh to start over (the old run directory is "
                    "moved aside), or use --out for a new one")
            if how == "grown":
                opt.log(f"{input_name} grew by {int(fingerprint['size']) - int(cp.fingerprint['size']):,} bytes "
                        "since the run started: its new lines run too")
        self._guard_settings(resuming)
        if not resuming:
            self._open(0, 0, 0)
            return None
        if cp is None:  # crashed before the first checkpoint: everything in results counts as D
            cp = Checkpoint(fingerprint=fingerprint)
        keep = complete_length(self.results_path)
        verify_covered(self.results_path, cp, keep)  # every line L covers, in one read
        scan_results(self.results_path, cp.results_len, (cp.results_lines or 0) + 1)  # each line after, parsed
        twice = second_record(self.results_path, cp) if cp.results_len else None  # an id of a line before L again
        if twice is not None:
            raise twice
        if opt.retry_failed is not None:
            cp = self._retry_failed(opt.retry_failed, cp)
            keep = complete_length(self.results_path)
        if cp.reconcile:
            cp = reconcile(self.run_dir, cp, Path(input_name), opt.max_line_bytes)
        size = self.results_path.stat().st_size if self.results_path.exists() else 0
        torn = size - keep
        if torn:
            try:
                with open(self.results_path, "r+b") as f:
                    f.truncate(keep)
                    os.fsync(f.fileno())
            except OSError as e:
                raise _disk(f"repair {self.results_path} (cut its torn last line)", e) from None
        d, ok, bad = scan_results(self.results_path, cp.results_len) if keep else (set(), 0, 0)
        d.update(cp.done_ahead)  # finished before an earlier resume, still ahead of F
        self._open(keep, cp.ids_len, cp.invalid_len, cp)
        return ResumeState(cp, d, ok, bad, torn)

    def _guard_settings(self, resuming: bool) -> None:
        from evalsup.rundir.run_json import guard, note_endpoints

        opt = self.options
        if opt.settings is None:
            return
        try:
            diff = guard(self.run_dir, opt.settings, resuming, opt.accept_changed_settings)
        except OSError as e:
            raise _disk(f"write {self.run_dir / 'run.json'}", e) from None
        for d in diff:
            opt.log(f"--accept-changed-settings: {d} (recorded in run.json)")
        if opt.endpoints is not None:
            try:
                note_endpoints(self.run_dir, opt.endpoints, opt.log)
            except OSError as e:
                raise _disk(f"write {self.run_dir / 'run.json'}", e) from None

    def _retry_failed(self, codes: frozenset[str], cp: Checkpoint) -> Checkpoint:
        def drop(rec: dict[str, Any]) -> bool:
            err = rec.get("error")
            if err is None:
                return False
            return not codes or (isinstance(err, dict) and err.get("code") in codes)

        try:
            rep = rewrite(self.run_dir, drop, fingerprint=cp.fingerprint)
        except OSError as e:
            raise _disk(f"rewrite {self.results_path} for --retry-failed", e) from None
        what = "failed" if not codes else "/".join(sorted(codes))
        self.options.log(f"--retry-failed: {rep.replaced:,} {what} record(s) taken out of results.jsonl (kept in "
                         "replaced.jsonl); their tasks are sent again")
        new = load_checkpoint(self.run_dir)
        return new if new is not None else cp

    def _open(self, results_len: int, ids_len: int, invalid_len: int, cp: Checkpoint | None = None) -> None:
        try:
            # positional writes (pwritev at the writer's position): a resume cuts the file back to what it trusts
            fd = os.open(self.results_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._results = open(fd, "wb", buffering=0, closefd=True)  # noqa: SIM115 - closed in close()
            self._ids = self._open_truncated(self.ids_path, ids_len)
            self._invalid = self._open_truncated(self.invalid_path, invalid_len)
        except OSError as e:
            raise JournalError(f"cannot write in run directory {self.run_dir}: {e.strerror}", EXIT_DISK) from None
        lines = crc = 0
        if results_len:  # the writer carries the line count and CRC of everything before its position on
            base = cp is not None and cp.results_crc is not None and cp.results_lines is not None
            start = cp.results_len if cp is not None and base else 0
            lines, crc = (cp.results_lines or 0, cp.results_crc or 0) if cp is not None and base else (0, 0)
            lines, crc = prefix_sums(self.results_path, results_len, start, lines, crc)
        self.base = results_len
        self._loop = asyncio.get_running_loop()
        self._writer = Writer(self, fd, results_len, self._loop, lines, crc, self.cached)
        self._writer.start()

    @staticmethod
    def _open_truncated(path: Path, length: int) -> IO[bytes]:
        f = open(path, "ab")  # noqa: SIM115 - closed in close()
        if f.tell() > length:
            f.truncate(length)
            # truncate() leaves the position where it was: tell() would count the cut bytes on, and a later
            # checkpoint's ids_len would claim ids written after it (a false "duplicate id" on the next resume)
            f.seek(0, os.SEEK_END)
        return f

    def read_ids(self, length: int) -> bytes:
        with open(self.ids_path, "rb") as f:
            return f.read(length)

    def read_ids_at(self, offset: int, size: int) -> bytes:
        """``size`` bytes of ids.bin from ``offset`` (a resume reads it a chunk at a time)."""
        with open(self.ids_path, "rb") as f:
            f.seek(offset)
            return f.read(size)

    # ----- writing (event loop side) -----

    def append(self, line: bytes | memoryview, ring: bool = False) -> None:
        """Queue one output line (newline included). The lines appended in one iteration of the event loop go
        to the writer together as soon as the iteration's callbacks have run (one ``pwritev``, no fsync), so a
        kill -9 of the supervisor loses no answer that reached it (DESIGN invariant 13); 1 MiB goes at once.
        ``ring``: the line is a view of a worker's ring, whose space ``on_written`` gives back once it is written
        (a write of none calls no one: the loop is not woken for it)."""
        self._buf_ring = self._buf_ring or ring
        self._buf.append(line)
        self._buf_bytes += len(line)
        self.appended += len(line)
        if self._buf_bytes >= 1 << 20:
            self.flush()
        elif not self._flush_due and self._loop is not None:
            self._flush_due = True
            self._loop.call_soon(self.flush)

    def append_invalid(self, line: bytes) -> None:
        assert self._invalid is not None
        try:
            self._invalid.write(line)
        except OSError as e:
            self._side_failed(self.invalid_path, e)

    def append_ids(self, data: bytes) -> None:
        assert self._ids is not None
        if data:
            try:
                self._ids.write(data)
            except OSError as e:
                self._side_failed(self.ids_path, e)

    def _side_failed(self, path: Path, e: OSError) -> None:
        """ids.bin or invalid.jsonl could not be written: no checkpoint may cover them any more (as for results)."""
        if self.broken is None:
            self._broken = f"cannot write {path}: {e.strerror}"
            self.on_error(self._broken)

    def flush(self) -> None:
        """Hand the buffered lines to the writer."""
        self._flush_due = False
        if self._buf and self._writer is not None:
            bufs, n, ring = self._buf, self._buf_bytes, self._buf_ring
            self._buf = []
            self._buf_bytes = 0
            self._buf_ring = False
            self._writer.put(("write", bufs, n, ring), n)

    async def checkpoint(self, cp: Checkpoint) -> None:
        """Make durable everything handed over so far, then write ``cp`` (atomically) with the results length
        that covers it. Raises JournalError if it cannot."""
        assert self._writer is not None and self._ids is not None and self._invalid is not None
        if self.broken:
            raise JournalError(self.broken, EXIT_DISK)
        self.flush()
        try:
            self._ids.flush()
            self._invalid.flush()
        except OSError as e:
            self._side_failed(self.ids_path, e)
            raise JournalError(self.broken or str(e), EXIT_DISK) from None
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._writer.put(("checkpoint", cp, (self._ids.fileno(), self._invalid.fileno()), fut), 0)
        err = await fut
        if err is not None:
            raise JournalError(err, EXIT_DISK)
        self.last_checkpoint = time.monotonic()

    def ids_length(self) -> int:
        assert self._ids is not None
        return self._ids.tell()

    def invalid_length(self) -> int:
        assert self._invalid is not None
        return self._invalid.tell()

    def close(self) -> None:
        """Stop the writer (after what it was handed) and close the files."""
        if self._writer is not None:
            self._writer.stop()
        for f in (self._results, self._ids, self._invalid):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()  # a buffered ids/invalid tail that cannot be written is past the last checkpoint
        self._results = self._ids = self._invalid = None
