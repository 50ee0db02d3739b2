"""Duplicate task ids found on disk, with memory that does not grow with the number of tasks (issue 33).

The pre-scan hands every good line's (id hash, byte offset) to an ``IndexBuilder``. It keeps at most ``RUN``
pairs in memory: each full batch is sorted and appended to a temporary file as a sorted run. At the end the runs
are merged (a heap merge, at most ``FAN_IN`` runs at once; more are merged first in a pass of their own) into one
file of pairs sorted by hash. A duplicate is two equal adjacent hashes whose lines' ids, read again from the task
file, are equal: a hash collision is never reported as a duplicate. Each duplicate (its offset, the offset of the
first line with its id) goes to a second sorted file, read in offset order by the run's reader.

The ``IdIndex`` built is what the run's ``TaskReader`` checks ids with:

* a line before ``covered`` (the pre-scan's end) was checked by the pre-scan: it is a duplicate exactly when the
  duplicates file says so (a cursor that moves with the reader: no look-up, no memory);
* a line appended to the file after the pre-scan is looked up in the sorted file (binary search over its mmap)
  and in a small in-memory ``IdSet`` of the appended lines only.

Each checked line's pair is logged for ids.bin (the ids before the checkpoint's frontier; a resume feeds them to
the builder before the lines the scan reads). The temporary files are unlinked at creation (``TemporaryFile``,
beside the run directory): nothing stays behind even after a SIGKILL. Disk: 16 bytes a task for the sorted file,
16 more for the runs while they are merged.
"""

from __future__ import annotations

import heapq
import mmap
import os
import tempfile
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from evalsup.tasks.idset import IdSet, id_hash

RUN = 1 << 16  # pairs sorted in memory at once (~3.5 MB of Python ints while sorted)
FAN_IN = 128  # runs merged at once
BLOCK = 256  # pairs read from a run at a time while merging
_LOW = (1 << 64) - 1
IdAt = Callable[[int], str | None]


def temp_file(beside: Path) -> IO[bytes]:
    """An unlinked temporary file in the nearest existing directory at or above ``beside``'s parent."""
    d = beside.parent
    while not d.is_dir() and d != d.parent:
        d = d.parent
    return tempfile.TemporaryFile(dir=d, prefix=f".{beside.name}.ids-")


class PairSort:
    """An external sort of (a, b) pairs of unsigned 64-bit integers by (a, b): bounded memory, disk for the rest."""

    def __init__(self, beside: Path) -> None:
        self._beside = beside
        self._buf = array("Q")
        self._file: IO[bytes] | None = None
        self._runs: list[tuple[int, int]] = []  # (first pair, pairs) in the runs file
        self._pairs = 0  # written to the runs file

    def __len__(self) -> int:
        return self._pairs + len(self._buf) // 2

    def add(self, a: int, b: int) -> None:
        buf = self._buf
        buf.append(a)
        buf.append(b)
        if len(buf) >= 2 * RUN:
            self._spill()

    def add_bytes(self, data: bytes) -> None:
        """Pairs as ids.bin holds them (native 'Q' pairs)."""
        pairs = array("Q")
        pairs.frombytes(data[: len(data) - len(data) % 16])
        for j in range(0, len(pairs), 2):
            self.add(pairs[j], pairs[j + 1])

    def _spill(self) -> None:
        buf = self._buf
        if not buf:
            return
        keys = sorted([(buf[j] << 64) | buf[j + 1] for j in range(0, len(buf), 2)])
        self._buf = array("Q")
        out = array("Q", bytes(16 * len(keys)))
        for j, k in enumerate(keys):
            out[2 * j] = k >> 64
            out[2 * j + 1] = k & _LOW
        del keys
        self._write_run(out)

    def _write_run(self, pairs: array[int]) -> None:
        if self._file is None:
            self._file = temp_file(self._beside)
        f = self._file
        f.seek(0, os.SEEK_END)
        start = f.tell() // 16
        pairs.tofile(f)
        self._runs.append((start, len(pairs) // 2))
        self._pairs += len(pairs) // 2

    def _read(self, start: int, count: int) -> Iterator[int]:
        """The keys (a << 64 | b) of one run, BLOCK pairs read at a time."""
        f = self._file
        assert f is not None
        fd = f.fileno()
        end = start + count
        while start < end:
            n = min(BLOCK, end - start)
            block = array("Q")
            block.frombytes(os.pread(fd, 16 * n, 16 * start))
            start += n
            for j in range(0, len(block), 2):
                yield (block[j] << 64) | block[j + 1]

    def sorted_keys(self) -> Iterator[int]:
        """Every pair, as a key (a << 64 | b), in order. Call once, after the last ``add``."""
        if not self._runs:  # all in memory: one sort, no file
            buf, self._buf = self._buf, array("Q")
            yield from sorted((buf[j] << 64) | buf[j + 1] for j in range(0, len(buf), 2))
            return
        self._spill()
        assert self._file is not None
        self._file.flush()
        while len(self._runs) > FAN_IN:  # merge the first few into one, so that FAN_IN are left
            k = len(self._runs) - FAN_IN + 1
            group, self._runs = self._runs[:k], self._runs[k:]
            out = array("Q")
            f = self._file
            f.seek(0, os.SEEK_END)
            first = f.tell() // 16
            total = 0
            for key in heapq.merge(*(self._read(s, c) for s, c in group)):
                out.append(key >> 64)
                out.append(key & _LOW)
                if len(out) >= 2 * BLOCK * 16:
                    out.tofile(f)
                    total += len(out) // 2
                    out = array("Q")
            out.tofile(f)
            total += len(out) // 2
            f.flush()
            self._runs.append((first, total))
        yield from heapq.merge(*(self._read(s, c) for s, c in self._runs))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._buf = array("Q")


class IndexBuilder:
    """Collects (id hash, offset) pairs (the pre-scan, and ids.bin's on a resume) and builds the ``IdIndex``.

    It stands in for the id set while the pre-scan reads: ``add`` records the pair and reports no duplicate;
    duplicates are found by ``build``."""

    def __init__(self, beside: Path) -> None:
        self.beside = beside
        self._pairs = PairSort(beside)

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, task_id: str, offset: int, id_at: IdAt, log: bool = True) -> int | None:
        self._pairs.add(id_hash(task_id), offset)
        return None

    def add_logged(self, read: Callable[[int, int], bytes], length: int, chunk: int = 1 << 20) -> None:
        """The pairs of ids.bin[:length], read ``chunk`` bytes at a time with ``read(offset, size)``."""
        pos = 0
        while pos < length:
            data = read(pos, min(chunk, length - pos))
            if not data:
                break
            self._pairs.add_bytes(data)
            pos += len(data)

    def take_log(self) -> bytes:
        return b""

    def build(self, covered: int, id_at: IdAt) -> IdIndex:
        """Merge the pairs into the sorted file and find the duplicates (``id_at`` reads a line's id again).
        ``covered``: every line before this offset was added (the pre-scan's end)."""
        index_file = temp_file(self.beside)
        dups = PairSort(self.beside)
        out = array("Q")
        pairs = 0
        g_hash = -1
        g_first = 0
        g_ids: dict[str | None, int] | None = None  # the ids of this hash's lines, once it has two
        last = -1
        for key in self._pairs.sorted_keys():
            if key == last:
                continue  # the same line twice (never expected): one entry
            last = key
            h, off = key >> 64, key & _LOW
            out.append(h)
            out.append(off)
            pairs += 1
            if len(out) >= 1 << 14:
                out.tofile(index_file)
                out = array("Q")
            if h != g_hash:
                g_hash, g_first, g_ids = h, off, None
                continue
            if g_ids is None:
                g_ids = {id_at(g_first): g_first}
            tid = id_at(off)
            first = g_ids.get(tid) if tid is not None else None
            if first is None:
                g_ids[tid] = off  # a collision: another id with the same hash
            else:
                dups.add(off, first)
        out.tofile(index_file)
        index_file.flush()
        self._pairs.close()
        return IdIndex(index_file, pairs, covered, dups)

    def close(self) -> None:
        self._pairs.close()


class IdIndex:
    """The run's duplicate check: the pre-scan's verdicts for the lines it read, look-ups for lines appended after.

    Offsets must be given in increasing order (the same line may be given again, after ``TaskReader.unread``)."""

    def __init__(self, index_file: IO[bytes] | None, pairs: int, covered: int, dups: PairSort | None) -> None:
        self.covered = covered
        self.pairs = pairs
        self.appended = IdSet(1 << 8)  # lines at or past ``covered``: appended while the run went on
        self._log = array("Q")
        self._file = index_file
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        if index_file is not None and pairs:
            self._map = mmap.mmap(index_file.fileno(), 16 * pairs, access=mmap.ACCESS_READ)
            self._view = memoryview(self._map).cast("Q")
        self.duplicates = len(dups) if dups is not None else 0
        self._dups = dups.sorted_keys() if dups is not None and len(dups) else iter(())
        self._dups_owner = dups
        self._next_dup = self._advance()

    @classmethod
    def empty(cls) -> IdIndex:
        """No pre-scan: every line is checked as read, in memory (tests, tools)."""
        return cls(None, 0, 0, None)

    def _advance(self) -> tuple[int, int] | None:
        key = next(self._dups, None)
        return None if key is None else (key >> 64, key & _LOW)

    @property
    def first_duplicate(self) -> tuple[int, int] | None:
        """(offset, offset of the first line with its id) of the first duplicate not yet passed by the reader."""
        return self._next_dup

    def load(self, data: bytes) -> None:
        """Pairs of an ids.bin prefix, in memory (``empty``: no pre-scan to build the index from)."""
        self.appended.load(data)

    def __len__(self) -> int:
        return self.pairs + len(self.appended)

    def add(self, task_id: str, offset: int, id_at: IdAt, log: bool = True) -> int | None:
        """The offset of an earlier line with ``task_id`` if the line at ``offset`` is a duplicate, else None
        (and its pair is logged for ids.bin)."""
        if offset < self.covered:
            while self._next_dup is not None and self._next_dup[0] < offset:
                self._next_dup = self._advance()
            if self._next_dup is not None and self._next_dup[0] == offset:
                return self._next_dup[1]
            h = id_hash(task_id)
        else:
            earlier = self.find(task_id, id_at)
            if earlier is not None and earlier != offset:
                return earlier
            earlier = self.appended.add(task_id, offset, id_at, log=False)
            if earlier is not None:
                return earlier
            h = id_hash(task_id)
        if log:
            self._log.append(h)
            self._log.append(offset)
        return None

    def find(self, task_id: str, id_at: IdAt) -> int | None:
        """The offset of a line before ``covered`` with ``task_id``, or None (binary search on the hash)."""
        v = self._view
        if v is None:
            return None
        h = id_hash(task_id)
        lo, hi = 0, self.pairs
        while lo < hi:
            mid = (lo + hi) // 2
            if v[2 * mid] < h:
                lo = mid + 1
            else:
                hi = mid
        while lo < self.pairs and v[2 * lo] == h:
            if id_at(v[2 * lo + 1]) == task_id:
                return int(v[2 * lo + 1])
            lo += 1
        return None

    def take_log(self) -> bytes:
        """The pairs checked since the last call, as bytes to append to ids.bin."""
        data = self._log.tobytes()
        self._log = array("Q")
        return data

    def close(self) -> None:
        """Let go of the temporary files (unlinked already: closing frees their disk)."""
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._dups_owner is not None:
            self._dups_owner.close()
            self._dups_owner = None
