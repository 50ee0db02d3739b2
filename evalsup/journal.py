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

import contextlib
import os
import select
import time
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
    """Owns the run directory's results file, ids.bin, invalid.jsonl and checkpoint."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.results_path = run_dir / "results.jsonl"
        self.checkpoint_path = run_dir / "checkpoint.json"
        self.ids_path = run_dir / "ids.bin"
        self.invalid_path = run_dir / "invalid.jsonl"
        self._buf: list[bytes | memoryview] = []
        self._buf_bytes = 0
        self._results: IO[bytes] | None = None
        self._ids: IO[bytes] | None = None
        self._invalid: IO[bytes] | None = None
        self.written = 0  # bytes of results.jsonl handed to the OS (flushed)
        self.last_checkpoint = 0.0
        # After a failed write the file may hold part of what was lost; no checkpoint may be written after
        # that (it would drop the lost tasks from O), so the last good one stands and a rerun redoes them.
        self.broken: str | None = None

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
            # positional writes (pwritev, splice at an offset: splice refuses O_APPEND files) at self.written
            fd = os.open(self.results_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self._results = open(fd, "wb", buffering=0, closefd=True)  # noqa: SIM115 - closed in close()
            self._ids = self._open_truncated(self.ids_path, ids_len)
            self._invalid = self._open_truncated(self.invalid_path, invalid_len)
        except OSError as e:
            raise JournalError(f"cannot write in run directory {self.run_dir}: {e.strerror}") from None
        self.written = results_len

    @staticmethod
    def _open_truncated(path: Path, length: int) -> IO[bytes]:
        f = open(path, "ab")  # noqa: SIM115 - closed in close()
        if f.tell() > length:
            f.truncate(length)
        return f

    def read_ids(self, length: int) -> bytes:
        with open(self.ids_path, "rb") as f:
            return f.read(length)

    # ----- writing -----

    def append(self, line: bytes | memoryview) -> None:
        """Queue one output line (newline included); written by flush(), at the latest within a second."""
        self._buf.append(line)
        self._buf_bytes += len(line)
        if self._buf_bytes >= 1 << 20:
            self.flush()

    def append_invalid(self, line: bytes) -> None:
        assert self._invalid is not None
        self._invalid.write(line)

    def append_ids(self, data: bytes) -> None:
        assert self._ids is not None
        if data:
            self._ids.write(data)

    def flush(self) -> int:
        """Hand buffered results to the OS; returns the results length now written."""
        if self._buf and self._results is not None:
            bufs, total = self._buf, self._buf_bytes
            self._buf = []
            self._buf_bytes = 0
            if self.broken:
                raise JournalError(self.broken)
            try:
                _write_all(self._results.fileno(), bufs, self.written)
            except OSError as e:
                # Whatever part of data reached the file lies past the last checkpoint: a rerun keeps its
                # complete lines (as finished since) and cuts a torn tail; the rest is redone (in O or past F).
                self.broken = f"cannot write {self.results_path}: {e.strerror}"
                raise JournalError(self.broken) from None
            self.written += total
        return self.written

    def append_spliced(self, head: memoryview, src: int, missing: int, timeout_s: float) -> bool:
        """Write one output line whose start is ``head`` and whose last ``missing`` bytes are still in the pipe
        ``src``: they are moved into the file by splice(2), never copied through Python. False (and nothing
        written) when the pipe ends or stalls before the line is complete (its worker died mid-result)."""
        if self._results is None:
            return False
        self.flush()  # whatever was queued before this line goes first
        if self.broken:
            raise JournalError(self.broken)
        fd = self._results.fileno()
        start = self.written
        pos = start + len(head)
        try:
            _write_all(fd, [head], start)
            left = missing
            while left:
                try:
                    n = os.splice(src, fd, left, offset_dst=pos)
                except BlockingIOError:
                    if not select.select([src], [], [], timeout_s)[0]:
                        break
                    continue
                if n == 0:
                    break
                left -= n
                pos += n
            if left:
                os.ftruncate(fd, start)
                return False
        except OSError as e:
            self.broken = f"cannot write {self.results_path}: {e.strerror}"
            raise JournalError(self.broken) from None
        self.written = pos
        return True

    def sync(self) -> int:
        """flush() and fsync results, ids and invalid lines; returns the results length made durable."""
        n = self.flush()
        try:
            for f in (self._results, self._ids, self._invalid):
                if f is not None:
                    f.flush()
                    os.fsync(f.fileno())
        except OSError as e:
            self.broken = f"cannot sync {self.run_dir}: {e.strerror}"
            raise JournalError(self.broken) from None
        return n

    def ids_length(self) -> int:
        assert self._ids is not None
        return self._ids.tell()

    def invalid_length(self) -> int:
        assert self._invalid is not None
        return self._invalid.tell()

    def write_checkpoint(self, cp: Checkpoint) -> None:
        """Write cp atomically. Its lengths must already be durable (sync() first)."""
        if self.broken:
            raise JournalError(self.broken)
        cp.time = time.time()
        try:
            write_atomic(self.checkpoint_path, cp.to_json())
        except OSError as e:
            raise JournalError(f"cannot write {self.checkpoint_path}: {e.strerror}") from None
        self.last_checkpoint = time.monotonic()

    def close(self) -> None:
        for f in (self._results, self._ids, self._invalid):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._results = self._ids = self._invalid = None
