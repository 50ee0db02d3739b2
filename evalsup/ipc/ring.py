"""A shared-memory ring per worker for large results: the pipe carries where a line is, not the line.

Through a pipe, a large result is copied four times between the worker's buffer and the page cache: into the
pipe, out of it into the supervisor, and into the file (with the pipe's page allocation and release around
each). Through the ring it is copied into shared memory by the worker and from there into the file by the
journal's writer: the supervisor never touches its bytes.

The supervisor makes the ring (a memfd) and hands the descriptor to the worker, which maps it read-write; the
supervisor does not map it (its pages would count in its RSS too): the journal's writer copies a line from the
descriptor into results.jsonl with sendfile. Positions count bytes ever reserved (offset = position % size),
so "free" is ``size - (head - tail)``. A line is placed whole (the end of the ring is skipped when it would
not fit there); the worker sends RESULT with meta ``"sh": [position, length]`` and no line. The supervisor
appends that slice of the ring to the journal and, once the writer has written past it, sends RELEASE with
the position everything before which is free. A line that does not fit goes through the pipe as before, so
a slow release never stalls a worker.

Crash safety is the pipe's: a line is referenced only by a RESULT frame sent after it was complete, a worker
that dies leaves nothing referenced, and the supervisor's descriptor outlives the worker while slices of the
ring wait for the writer.
"""

from __future__ import annotations

import collections
import mmap
import os
import struct
import weakref
from collections.abc import Sequence

from evalsup.ipc.frames import ProtocolError

RING_MIN = 1 << 16  # lines at least this large go through the ring (below it, copies are cheap, syscalls not)
POS = struct.Struct("<Q")  # RELEASE payload: everything before this position is free


def ring_size_from_env(workers: int) -> int:
    """Bytes of each worker's ring: EVALSUP_RING_MB (default 16) shared by the workers, at least 4 MiB each;
    0 sends every result through the pipe. (3,000 x 1 MB results: 93 % of them through a 16 MiB ring with
    one worker, 85 % through 4 MiB rings with four; the rest take the pipe. The ring's pages count in the
    workers' RSS, so it is kept small.)"""
    try:
        mb = float(os.environ.get("EVALSUP_RING_MB", "16"))
    except ValueError:
        mb = 16.0
    if mb <= 0:
        return 0
    each = max(4 << 20, int(mb * (1 << 20)) // max(1, workers))
    return each // mmap.PAGESIZE * mmap.PAGESIZE


class WorkerRing:
    """The worker's side: ``put(parts)`` copies one line in and returns its position, or None when it does
    not fit now (the caller sends it through the pipe). ``release(pos)`` frees everything before ``pos``."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self._mm = mmap.mmap(fd, size)  # MAP_SHARED, read and write
        os.close(fd)
        self._view = memoryview(self._mm)
        self.head = 0
        self.tail = 0

    def put(self, parts: Sequence[bytes | memoryview]) -> int | None:
        n = sum(map(len, parts))
        off = self.head % self.size
        skip = self.size - off if off + n > self.size else 0
        if n == 0 or self.head + skip + n - self.tail > self.size:
            return None
        pos = self.head + skip
        o = pos % self.size
        for p in parts:
            self._view[o : o + len(p)] = p
            o += len(p)
        self.head = pos + n
        return pos

    def release(self, pos: int) -> None:
        if pos > self.tail:
            self.tail = min(pos, self.head)


class SupervisorRing:
    """The supervisor's side: makes the memfd (``fd``: passed to the worker, and kept, for the journal's writer
    to copy lines from with sendfile; closed when this object goes), says where a referenced line lies, and
    tracks when the writer is past it (``releasable``). The supervisor never maps the ring: its bytes count
    in no process's RSS but the worker's."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("evalsup-results", os.MFD_CLOEXEC)
        weakref.finalize(self, os.close, self.fd)
        os.ftruncate(self.fd, size)
        self._pending: collections.deque[tuple[int, int]] = collections.deque()  # (journal end, ring end)
        self.told = 0  # the last position sent in a RELEASE

    @classmethod
    def make(cls, size: int) -> SupervisorRing | None:
        """A ring of ``size`` bytes, or None (size 0, or no memfd on this system: results use the pipe)."""
        if size <= 0 or not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(size)
        except OSError:
            return None

    def locate(self, pos: int, n: int, journal_end: int) -> int:
        """The offset in ``fd`` of the line at ``pos``; ``journal_end`` is where it ends in the journal's
        stream of appended bytes (it can be released once the writer is there)."""
        if n <= 0 or n > self.size or pos < self.told:
            raise ProtocolError(f"ring reference {pos}+{n} outside the ring")
        o = pos % self.size
        if o + n > self.size:
            raise ProtocolError(f"ring reference {pos}+{n} crosses the ring's end")
        self._pending.append((journal_end, pos + n))
        return o

    def releasable(self, written: int) -> int | None:
        """The position to send in a RELEASE now that the journal has written ``written`` bytes (None: nothing
        new is free). Sent at once, not saved up: a ring of a few lines fills in a burst of results."""
        upto = None
        while self._pending and self._pending[0][0] <= written:
            upto = self._pending.popleft()[1]
        if upto is None:
            return None
        self.told = upto
        return upto
