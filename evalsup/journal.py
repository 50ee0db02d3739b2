"""The results file, the checkpoint and the resume scan: the crash-safety core.

A task is done exactly when its line is in ``results.jsonl``. The checkpoint never claims more than
what is fsynced: results are flushed and fsynced first, then ``checkpoint.json`` is written atomically
(temp file, fsync, rename, fsync of the directory). It holds the dispatch frontier ``F`` (every line
before it was dispatched), the outstanding tasks ``O`` (dispatched, not yet in the covered results) and
``L``, the covered length of ``results.jsonl``. On resume the results after ``L`` are scanned for the
ids ``D`` that finished since; ``O - D`` is redone and reading goes on from ``F`` skipping ``D``.
See docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.tasks import TaskRef

CHECKPOINT_VERSION = 1


class JournalError(Exception):
    """The run directory cannot be used (disk full, unwritable, changed input...)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


_IOV_MAX = 512


def _write_all(fd: int, bufs: list[bytes | memoryview], offset: int) -> None:
    """pwritev() the buffers in order at ``offset``, without joining them first; partial writes are carried on."""
    i = 0
    while i < len(bufs):
        batch = bufs[i : i + _IOV_MAX]
        n = os.pwritev(fd, batch, offset)
        offset += n
        for b in batch:
            if n >= len(b):
                n -= len(b)
                i += 1
            else:
                bufs[i] = memoryview(b)[n:]
                break


@dataclass
class Checkpoint:
    fingerprint: dict[str, Any]
    frontier: int = 0  # F: input byte offset; every line before it was dispatched
    line_no: int = 0  # physical lines before F
    index: int = 0  # non-blank lines before F (shard numbering)
    outstanding: list[TaskRef] = field(default_factory=list)  # O
    results_len: int = 0  # L
    ids_len: int = 0  # bytes of ids.bin covering every id before F
    invalid_len: int = 0  # bytes of invalid.jsonl covered
    succeeded: int = 0  # records in results[:L] without error
    failed: int = 0  # records in results[:L] with an error
    invalid: int = 0  # lines skipped as invalid before F
    counters: dict[str, Any] = field(default_factory=dict)  # restarts, recycles...: carried across resumes
    done_ahead: list[str] = field(default_factory=list)  # ids at or past F already in results[:L] (an earlier D)
    pid: int = 0  # the supervisor that wrote it (for `evalsup status`)
    finished: bool = False
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
            "ids_len": self.ids_len,
            "invalid_len": self.invalid_len,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "invalid": self.invalid,
            "counters": self.counters,
            "done_ahead": self.done_ahead,
            "pid": self.pid,
            "finished": self.finished,
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
            results_len=d["results_len"], ids_len=d["ids_len"], invalid_len=d["invalid_len"],
            succeeded=d["succeeded"], failed=d["failed"], invalid=d["invalid"], counters=d.get("counters", {}),
            done_ahead=list(d.get("done_ahead", [])), pid=int(d.get("pid", 0)),
            finished=d.get("finished", False), time=d.get("time", 0.0),
        )


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    p = run_dir / "checkpoint.json"
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return Checkpoint.from_json(data)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise JournalError(f"{p}: unreadable checkpoint ({e})") from None


def complete_length(path: Path) -> int:
    """Length of the file up to and including its last newline (where a torn last line starts)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            chunk = f.read(step)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return pos - step + i + 1
            pos -= step
    return 0


@dataclass
class ResumeState:
    checkpoint: Checkpoint
    done_after: set[str]  # D: ids whose records lie after L
    succeeded_after: int
    failed_after: int
    torn_bytes: int  # bytes of a torn final line that were cut

    @property
    def done(self) -> int:
        cp = self.checkpoint
        return cp.succeeded + cp.failed + self.succeeded_after + self.failed_after


def scan_results(path: Path, start: int) -> tuple[set[str], int, int]:
    """Ids and success/failure counts of the complete records from ``start`` on."""
    ids: set[str] = set()
    ok = bad = 0
    with open(path, "rb") as f:
        f.seek(start)
        for line in f:
            if not line.endswith(b"\n"):
                break
            rec = orjson.loads(line)
            ids.add(rec["custom_id"])
            if rec.get("error") is None:
                ok += 1
            else:
                bad += 1
    return ids, ok, bad


class Journal:
    """Owns the run directory's results file, ids.bin, invalid.jsonl and checkpoint.

    A thread of its own (``_Writer``) does every write to ``results.jsonl``, in the order asked for, and a
    second one the fsyncs, so the event loop never waits for the disk: page-cache copies and fsyncs of a run
    of large results take most of a core. Lines are ``append``ed (buffered, handed over by ``flush``);
    ``checkpoint`` fsyncs what was handed over before it and then writes ``checkpoint.json``. Errors and
    completions come back on the event loop.
    """

    # past this many bytes handed over and not yet written, the supervisor stops reading results
    # (EVALSUP_BACKLOG_MB: smaller for a small container, or to watch the hold work)
    BACKLOG_HIGH = int(float(os.environ.get("EVALSUP_BACKLOG_MB", "32")) * (1 << 20))

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.results_path = run_dir / "results.jsonl"
        self.checkpoint_path = run_dir / "checkpoint.json"
        self.ids_path = run_dir / "ids.bin"
        self.invalid_path = run_dir / "invalid.jsonl"
        self._buf: list[bytes | memoryview] = []
        self._buf_bytes = 0
        self.appended = 0  # bytes handed to append() this session
        self._results: IO[bytes] | None = None
        self._ids: IO[bytes] | None = None
        self._invalid: IO[bytes] | None = None
        self._writer: _Writer | None = None
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
        return self._writer.broken if self._writer is not None else None

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
        """Create the run directory, or check and repair it for a resume; None means a fresh start."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JournalError(f"cannot create run directory {self.run_dir}: {e.strerror}") from None
        cp = load_checkpoint(self.run_dir)
        has_results = self.results_path.exists() and self.results_path.stat().st_size > 0
        if cp is None and not has_results:
            self._open(0, 0, 0)
            return None
        if cp is not None and cp.fingerprint != fingerprint:
            raise JournalError(
                f"{input_name} changed since the run in {self.run_dir} started (size, time or content differ); "
                "rerun with --fresh to start over (the old run directory is moved aside), or use --out for a new one"
            )
        if cp is None:  # crashed before the first checkpoint: everything in results counts as D
            cp = Checkpoint(fingerprint=fingerprint)
        keep = complete_length(self.results_path)
        size = self.results_path.stat().st_size if self.results_path.exists() else 0
        if keep < cp.results_len:
            raise JournalError(f"{self.results_path} is shorter than its checkpoint says ({keep} < "
                               f"{cp.results_len} bytes): it was edited or truncated; rerun with --fresh")
        torn = size - keep
        if torn:
            try:
                with open(self.results_path, "r+b") as f:
                    f.truncate(keep)
                    os.fsync(f.fileno())
            except OSError as e:
                raise JournalError(f"cannot repair {self.results_path} (cut its torn last line): "
                                   f"{e.strerror}") from None
        d, ok, bad = scan_results(self.results_path, cp.results_len) if keep else (set(), 0, 0)
        d.update(cp.done_ahead)  # finished before an earlier resume, still ahead of F
        self._open(keep, cp.ids_len, cp.invalid_len)
        return ResumeState(cp, d, ok, bad, torn)

    def _open(self, results_len: int, ids_len: int, invalid_len: int) -> None:
        try:
            # positional writes (pwritev at the writer's position): a resume cuts the file back to what it trusts
            fd = os.open(self.results_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._results = open(fd, "wb", buffering=0, closefd=True)  # noqa: SIM115 - closed in close()
            self._ids = self._open_truncated(self.ids_path, ids_len)
            self._invalid = self._open_truncated(self.invalid_path, invalid_len)
        except OSError as e:
            raise JournalError(f"cannot write in run directory {self.run_dir}: {e.strerror}") from None
        self._writer = _Writer(self, fd, results_len, asyncio.get_running_loop())
        self._writer.start()

    @staticmethod
    def _open_truncated(path: Path, length: int) -> IO[bytes]:
        f = open(path, "ab")  # noqa: SIM115 - closed in close()
        if f.tell() > length:
            f.truncate(length)
        return f

    def read_ids(self, length: int) -> bytes:
        with open(self.ids_path, "rb") as f:
            return f.read(length)

    # ----- writing (event loop side) -----

    def append(self, line: bytes | memoryview) -> None:
        """Queue one output line (newline included); handed to the writer by flush(), within a second."""
        self._buf.append(line)
        self._buf_bytes += len(line)
        self.appended += len(line)
        if self._buf_bytes >= 1 << 20:
            self.flush()

    def append_invalid(self, line: bytes) -> None:
        assert self._invalid is not None
        self._invalid.write(line)

    def append_ids(self, data: bytes) -> None:
        assert self._ids is not None
        if data:
            self._ids.write(data)

    def flush(self) -> None:
        """Hand the buffered lines to the writer."""
        if self._buf and self._writer is not None:
            bufs, n = self._buf, self._buf_bytes
            self._buf = []
            self._buf_bytes = 0
            self._writer.put(("write", bufs, n), n)

    async def checkpoint(self, cp: Checkpoint) -> None:
        """Make durable everything handed over so far, then write ``cp`` (atomically) with the results length
        that covers it. Raises JournalError if it cannot."""
        assert self._writer is not None and self._ids is not None and self._invalid is not None
        if self.broken:
            raise JournalError(self.broken)
        self.flush()
        self._ids.flush()
        self._invalid.flush()
        fut: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._writer.put(("checkpoint", cp, (self._ids.fileno(), self._invalid.fileno()), fut), 0)
        err = await fut
        if err is not None:
            raise JournalError(err)
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
                    f.close()
        self._results = self._ids = self._invalid = None


class _Writer(threading.Thread):
    """Does the journal's jobs in order: ("write", bufs, n), ("checkpoint", cp, fds, future), None to stop;
    a checkpoint's fsync and file go to a second thread. ``pos`` is the length of results.jsonl written."""

    def __init__(self, journal: Journal, fd: int, pos: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="evalsup-journal", daemon=True)
        self.journal = journal
        self.fd = fd
        self.pos = pos
        self.written = 0  # bytes written by this writer (pos - the length it started at)
        self.loop = loop
        self.jobs: collections.deque[tuple[Any, ...] | None] = collections.deque()
        self.cv = threading.Condition()
        self.backlog = 0  # bytes of the queued jobs
        self.broken: str | None = None
        # fsync takes as long as the disk needs for what is dirty (seconds, for gigabytes): a second thread
        # does it, and writes the checkpoint after, while this one goes on writing the lines that follow
        self.syncer: queue.SimpleQueue[tuple[Checkpoint, tuple[int, ...], asyncio.Future[str | None]] | None] = \
            queue.SimpleQueue()
        self._syncing = threading.Thread(target=self._sync_loop, name="evalsup-fsync", daemon=True)

    def start(self) -> None:
        super().start()
        self._syncing.start()

    def put(self, job: tuple[Any, ...] | None, nbytes: int) -> None:
        with self.cv:
            self.jobs.append(job)
            self.backlog += nbytes
            self.cv.notify()

    def stop(self) -> None:
        if self.is_alive():
            self.put(None, 0)
            self.join()

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(fn, *args)

    def run(self) -> None:
        while True:
            with self.cv:
                while not self.jobs:
                    self.cv.wait()
                job = self.jobs.popleft()
            if job is None:
                self.syncer.put(None)
                self._syncing.join()
                return
            kind, nbytes = job[0], 0
            if kind == "write":
                nbytes = job[2]
                self._write(job[1], nbytes)
                job = None  # let go of the lines' buffers before anyone hears they are written
                if self.journal.on_written is not None:
                    self._call(self.journal.on_written)
            elif kind == "checkpoint":
                self._checkpoint(*job[1:])
            with self.cv:
                before = self.backlog
                self.backlog -= nbytes
                low = before >= Journal.BACKLOG_HIGH // 4 > self.backlog
            if low:
                self._call(self.journal.on_backlog_low)

    def _fail(self, what: str, e: OSError) -> None:
        if self.broken is None:
            # Whatever part reached the file lies past the last checkpoint: a rerun keeps its complete lines
            # (as finished since) and cuts a torn tail; the rest is redone (in O or past F).
            self.broken = f"cannot {what} {self.journal.results_path}: {e.strerror}"
            self._call(self.journal.on_error, self.broken)

    def _write(self, bufs: list[bytes | memoryview], n: int) -> None:
        if self.broken:
            return
        try:
            _write_all(self.fd, bufs, self.pos)
        except OSError as e:
            self._fail("write", e)
            return
        self.pos += n
        self.written += n

    def _checkpoint(self, cp: Checkpoint, fds: tuple[int, ...], fut: asyncio.Future[str | None]) -> None:
        """Take the results length for cp; the syncer fsyncs and writes it while writing goes on after it."""
        if self.broken:
            self._resolve(fut, self.broken)
        else:
            cp.results_len = self.pos
            self.syncer.put((cp, fds, fut))

    def _resolve(self, fut: asyncio.Future[str | None], err: str | None) -> None:
        self._call(lambda f, e: f.done() or f.set_result(e), fut, err)

    def _sync_loop(self) -> None:
        """The syncer thread: fsync (data written before cp.results_len at least), then write cp."""
        while True:
            item = self.syncer.get()
            if item is None:
                return
            cp, fds, fut = item
            err: str | None = None
            try:
                for fd in (self.fd, *fds):
                    os.fsync(fd)
            except OSError as e:
                self._fail("sync", e)
                err = self.broken
            if err is None:
                cp.time = time.time()
                try:
                    write_atomic(self.journal.checkpoint_path, cp.to_json())
                except OSError as e:
                    err = f"cannot write {self.journal.checkpoint_path}: {e.strerror}"
                except Exception as e:  # a bug: the run must stop with it, not wait for this checkpoint forever
                    err = f"cannot write {self.journal.checkpoint_path}: {type(e).__name__}: {e}"
            self._resolve(fut, err)
