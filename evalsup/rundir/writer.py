"""The journal's writer threads: one writes ``results.jsonl`` in the order asked for, a second fsyncs it and
writes the checkpoint after, so the event loop never waits for the disk. Part of the journal (evalsup.rundir.journal).

The writer keeps, with the results length ``pos``, the number of lines and the running CRC-32 of everything
before ``pos``; a checkpoint takes the three together, so a resume can check ``results[:L]`` in one read.

Once a checkpoint's fsync has made them clean, the file's pages but its last ``cached_tail`` bytes are dropped
from the page cache (``posix_fadvise(DONTNEED)``): a run writing gigabytes of answers leaves the machine's (or the
container's) page cache as it found it, rather than growing it by the output's size and making every later
allocation, its own included, reclaim what it filled. Nothing is lost by it (the pages are on disk); a reader of
the file reads them from there. 10,000 x 1 MB against the raw bounded queue (scripts/bench.py, quiet machine):
1.20x its throughput at 1.12x its CPU, against 0.88x and 1.50x with the results kept (docs/benchmarks.md).
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
from pathlib import Path
from typing import Any, Protocol

from evalsup.rundir.checkpoint import Checkpoint, write_atomic
from evalsup.rundir.crc import crc32

# past this many bytes handed over and not yet written, the supervisor stops reading results
# (EVALSUP_BACKLOG_MB: smaller for a small container, or to watch the hold work)
BACKLOG_HIGH = int(float(os.environ.get("EVALSUP_BACKLOG_MB", "32")) * (1 << 20))


#: The results file's tail kept in the page cache: 1/16 of the memory the run may use, between 16 and 256 MiB;
#: EVALSUP_RESULTS_CACHED_MB decides when set (a run whose results stay below it is not touched at all).
CACHED_LEAST, CACHED_MOST = 16 << 20, 256 << 20
DROP_LEAST = 1 << 20  # less than this to drop: left for the next checkpoint (no call for a few lines)


def cached_tail(memory_bytes: int | None) -> int:
    """Bytes at the end of results.jsonl left in the page cache after each checkpoint (see the module's doc)."""
    raw = os.environ.get("EVALSUP_RESULTS_CACHED_MB")
    if raw is not None:
        with contextlib.suppress(ValueError, OverflowError):
            return max(0, int(float(raw) * (1 << 20)))
    if not memory_bytes:
        return CACHED_LEAST * 4
    return min(CACHED_MOST, max(CACHED_LEAST, memory_bytes // 16))


class Owner(Protocol):
    """What the writer reads of the journal it writes for: the two paths, and the callbacks it calls on the loop."""

    results_path: Path
    checkpoint_path: Path
    on_error: Callable[[str], None]
    on_backlog_low: Callable[[], None]
    on_written: Callable[[], None] | None

_IOV_MAX = 512


def write_all(fd: int, bufs: list[bytes | memoryview], offset: int) -> None:
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


class Writer(threading.Thread):
    """Does the journal's jobs in order: ("write", bufs, n, ring: any line in a worker's ring: ``on_written``
    after it), ("checkpoint", cp, fds, future), None to stop;
    a checkpoint's fsync and file go to a second thread. ``pos`` is the length of results.jsonl written,
    ``lines`` and ``crc`` the line count and CRC-32 of those ``pos`` bytes. Each buffer is one line."""

    def __init__(self, journal: Owner, fd: int, pos: int, loop: asyncio.AbstractEventLoop,
                 lines: int = 0, crc: int = 0, cached: int = CACHED_MOST) -> None:
        super().__init__(name="evalsup-journal", daemon=True)
        self.journal = journal
        self.fd = fd
        self.pos = pos
        self.lines = lines
        self.crc = crc
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
        self.cached = cached  # the tail left in the page cache (cached_tail)
        self.dropped = 0  # the file's bytes before this were dropped from the page cache
        self.synced = 0  # the length the last checkpoint's fsync covered
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
                self._drop(self.synced - self.cached)  # the end: the last checkpoint's part too
                return
            kind, nbytes = job[0], 0
            if kind == "write":
                nbytes, ring = job[2], job[3]
                self._write(job[1], nbytes)
                job = None  # let go of the lines' buffers before anyone hears they are written
                if ring and self.journal.on_written is not None:  # a ring's space to give back
                    self._call(self.journal.on_written)
            elif kind == "checkpoint":
                self._checkpoint(*job[1:])
            with self.cv:
                before = self.backlog
                self.backlog -= nbytes
                low = before >= BACKLOG_HIGH // 4 > self.backlog
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
        crc, lines = self.crc, len(bufs)
        for b in bufs:  # before write_all, which may cut a buffer it wrote in part
            crc = crc32(b, crc)
        try:
            write_all(self.fd, bufs, self.pos)
        except OSError as e:
            self._fail("write", e)
            return
        self.pos += n
        self.lines += lines
        self.crc = crc
        self.written += n

    def _checkpoint(self, cp: Checkpoint, fds: tuple[int, ...], fut: asyncio.Future[str | None]) -> None:
        """Take the results length for cp; the syncer fsyncs and writes it while writing goes on after it."""
        if self.broken:
            self._resolve(fut, self.broken)
        else:
            cp.results_len, cp.results_lines, cp.results_crc = self.pos, self.lines, self.crc
            self.syncer.put((cp, fds, fut))

    def _drop_behind(self, synced: int) -> None:
        """A checkpoint's fsync made the file clean up to ``synced``: out of the page cache goes what the one
        before it made clean, but the last ``cached`` bytes. One checkpoint behind, so that the answer cache's
        feed (cache.feed), which reads the bodies a checkpoint covers back from the file, finds them there."""
        self._drop(min(self.synced, synced - self.cached))
        self.synced = synced

    def _drop(self, upto: int) -> None:
        """Clean pages before ``upto`` out of the page cache. Advice: where the system takes none (no
        posix_fadvise, a file system that ignores it), the pages simply stay."""
        if upto - self.dropped < DROP_LEAST or not hasattr(os, "posix_fadvise"):
            return
        with contextlib.suppress(OSError):
            os.posix_fadvise(self.fd, self.dropped, upto - self.dropped, os.POSIX_FADV_DONTNEED)
        self.dropped = upto

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
                self._drop_behind(cp.results_len)
                cp.time = time.time()
                try:
                    write_atomic(self.journal.checkpoint_path, cp.to_json())
                except OSError as e:
                    err = f"cannot write {self.journal.checkpoint_path}: {e.strerror}"
                except Exception as e:  # a bug: the run must stop with it, not wait for this checkpoint forever
                    err = f"cannot write {self.journal.checkpoint_path}: {type(e).__name__}: {e}"
            self._resolve(fut, err)
