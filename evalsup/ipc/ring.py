"""A shared-memory ring per worker for large results: the pipe carries where a line is, not the line.

Through a pipe, a large result is copied four times between the worker's buffer and the page cache: into the
pipe, out of it into the supervisor, and into the file (with the pipe's page allocation and release around
each). Through the ring it is copied into shared memory by the worker and from there into the file by the
journal's writer: the supervisor never touches its bytes.

The supervisor makes the ring (a memfd), maps it read-only and hands the descriptor to the worker, which maps
it too and copies lines into the mapping (``memcpy``: 49-85 us a megabyte in a loop against 106-199 us for
``pwritev`` into the memfd and its page-cache walk and page locks; for 3,000 x 1 MB results, the workers' CPU
in ``put`` 0.44-0.45 s against 0.73-0.79 s on a loaded machine). A page the worker's mapping has not touched
yet is written the first time by ``pwritev``, whose allocation can fail as an error (the line then takes the
pipe) where a store into the mapping could only fault; after that the page exists (the memfd is never
truncated, and without swap never reclaimed), and only the copy is left. The ring's pages count in the worker's
RSS too: the supervisor's memory control takes a worker's shared-memory pages out of its figure
(``supervisor.rss.own_rss_bytes``), as they are the supervisor's, counted in its RSS.

Positions count bytes ever reserved (offset = position % size), so "free" is ``size - (head - tail)``. A
line is placed whole (the end of the ring is skipped when it would not fit there); the worker sends RESULT
with meta ``"sh": [position, length]`` and no line. The supervisor appends a view of the ring to the journal
and, once the writer has written past it, sends RELEASE with the position everything before which is free.
A line that does not fit goes through the pipe as before, so a slow release never stalls a worker.

Crash safety is the pipe's: a line is referenced only by a RESULT frame sent after it was complete, a worker
that dies leaves nothing referenced, and the supervisor's mapping outlives the worker while views of it wait
for the writer.
"""

from __future__ import annotations

import collections
import math
import mmap
import os
import struct
from collections.abc import Sequence

from evalsup.ipc.frames import ProtocolError

# Lines at least this large go through the ring. Below it the pipe is cheaper: 3,000 x 100 KB, 4 workers, tree
# CPU 2.6-2.7 s by pipe against 2.7-3.0 s by ring (the ring's write, frame and RELEASE per line cost more than
# the copies they save); at 1 MB the ring wins (see docs/benchmarks.md). Measured again at 10,000 x 100 KB (sixth
# round): from 64 KiB, the supervisor's CPU fell by 0.15-0.2 s and the workers' rose as much (four workers: 8 %
# more tree CPU), and the ring's 16 MiB showed in the tree's RSS (89 against 76 MB).
RING_MIN = 1 << 18
POS = struct.Struct("<Q")  # RELEASE payload: everything before this position is free


RING_LEAST_MB, RING_MOST_MB = 16, 64  # the rings' budget without EVALSUP_RING_MB: 1/64 of memory, within these
RING_LARGEST_MB = 4096  # EVALSUP_RING_MB past this is taken as this


def ring_budget(memory_bytes: int | None) -> int:
    """Bytes of rings a run may make, all workers together: EVALSUP_RING_MB if set (0: every result through
    the pipe), else 1/64 of the memory the run may use (``memory_bytes``: --memory-limit, else the container's
    limit, else the machine's memory), between 16 and 64 MiB: 16 in a container of 1 GiB or less (the memory
    tests' 96 MiB cgroups), 64 on a machine of 4 GiB or more. Ring pages are touched only by results of
    RING_MIN or more, so runs with small results never pay them. With 1 MB results a larger ring keeps more
    of them off the pipe (a line's space comes back only once the writer has written it): 3,000 x 1 MB, 84 %
    by the ring with 64 MiB against 37-57 % with 16, a third fewer page faults, ~1 s less of the supervisor's
    CPU (docs/benchmarks.md)."""
    raw = os.environ.get("EVALSUP_RING_MB")
    if raw is not None:
        try:
            mb = float(raw)
        except ValueError:
            mb = float(RING_LEAST_MB)
        if not math.isfinite(mb):  # nan, inf: not a size
            mb = float(RING_LEAST_MB)
        mb = min(mb, RING_LARGEST_MB)
    else:
        mb = RING_LEAST_MB if not memory_bytes else min(RING_MOST_MB, max(RING_LEAST_MB, memory_bytes / 64 / (1 << 20)))
    return 0 if mb <= 0 else int(mb * (1 << 20))


def ring_size(workers: int, budget: int) -> int:
    """Bytes of one worker's ring: its share of ``budget`` (``ring_budget``) among ``workers``, at least 4 MiB;
    0 (no rings) when the budget is 0. (3,000 x 1 MB results: 93 % of them through a 16 MiB ring with one
    worker, 85 % through 4 MiB rings with four, on a quiet machine; the rest take the pipe. The rings count in
    the supervisor's RSS.)"""
    if budget <= 0:
        return 0
    each = max(4 << 20, budget // max(1, workers))
    return each // mmap.PAGESIZE * mmap.PAGESIZE


class WorkerRing:
    """The worker's side: ``put(parts)`` writes one line in and returns its position, or None when it does
    not fit now (the caller sends it through the pipe). ``release(pos)`` frees everything before ``pos``.
    Lines are copied into a shared mapping of the ring where its pages exist (``touched``), and written by
    ``pwritev`` where they do not yet (see the module's docstring)."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.head = 0
        self.tail = 0
        self.touched = 0  # the ring's first ``touched`` bytes have pages: a copy into the mapping cannot fault
        try:
            self._mm: mmap.mmap | None = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                                   prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError):
            self._mm = None  # every line by pwritev: dearer, never wrong

    def put(self, parts: Sequence[bytes | memoryview]) -> int | None:
        n = sum(map(len, parts))
        off = self.head % self.size
        skip = self.size - off if off + n > self.size else 0
        if n == 0 or self.head + skip + n - self.tail > self.size:
            return None
        pos = self.head + skip
        off = pos % self.size
        if self._mm is not None and off + n <= self.touched:
            mm = self._mm
            for part in parts:
                k = len(part)
                mm[off : off + k] = part
                off += k
        else:
            try:
                written = os.pwritev(self.fd, parts, off)
            except OSError:
                return None  # (ENOMEM, say): this line takes the pipe
            if written != n:
                return None  # a short write into memory (out of it): the space stays free, the line takes the pipe
            self.touched = max(self.touched, off + n)
        self.head = pos + n
        return pos

    def release(self, pos: int) -> None:
        if pos > self.tail:
            self.tail = min(pos, self.head)


class SupervisorRing:
    """The supervisor's side: makes the memfd (``fd``, for the worker; ``close_fd()`` once it is passed), maps
    it read-only, hands out views of the lines the worker references, and tracks when the journal's writer is
    past them (``releasable``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd: int | None = os.memfd_create("evalsup-results", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self._mm = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)
        self._view = memoryview(self._mm)
        self._pending: collections.deque[tuple[int, int]] = collections.deque()  # (journal end, ring end)
        self.told = 0  # the last position sent in a RELEASE
        self._end = 0  # the end of the last line referenced

    @classmethod
    def make(cls, size: int) -> SupervisorRing | None:
        """A ring of ``size`` bytes, or None (size 0, or no memfd on this system: results use the pipe)."""
        if size <= 0 or not hasattr(os, "memfd_create"):
            return None
        try:
            return cls(size)
        except (OSError, OverflowError, ValueError):
            return None

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def line(self, pos: int, n: int, journal_end: int) -> memoryview:
        """The line at ``pos``, as a view of the ring (the journal's writer writes it from there);
        ``journal_end`` is where it ends in the journal's stream of appended bytes."""
        # The worker places lines one after the other, never past what it was told is free: a reference
        # before the last line's end or beyond the free space is a broken worker (not a line to write)
        if n <= 0 or pos < self._end or pos + n > self.told + self.size:
            raise ProtocolError(f"ring reference {pos}+{n} outside what the worker can have written")
        o = pos % self.size
        if o + n > self.size:
            raise ProtocolError(f"ring reference {pos}+{n} crosses the ring's end")
        self._end = pos + n
        self._pending.append((journal_end, pos + n))
        return self._view[o : o + n]

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
