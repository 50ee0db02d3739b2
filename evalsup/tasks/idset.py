"""A compact set of task ids for duplicate detection: 16 bytes a slot, not a Python set of strings.

Each id is kept as a 64-bit hash in an open-addressing table (linear probing) beside the byte offset of
its line. On a hash match the caller re-reads the earlier line and compares the ids exactly, so a
collision can never be reported as a duplicate. 1M ids cost about 32 MiB at worst, 24 MiB typically.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable

_EMPTY = 0


def id_hash(task_id: str) -> int:
    h = int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "little")
    return h or 1  # 0 marks an empty slot


class IdSet:
    def __init__(self, capacity: int = 1 << 12) -> None:
        size = 1 << max(4, (capacity - 1).bit_length())
        self._hashes = array("Q", bytes(8 * size))
        self._offsets = array("Q", bytes(8 * size))
        self._mask = size - 1
        self._count = 0
        self._log = array("Q")  # (hash, offset) pairs added since the last take_log(), for ids.bin

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return (len(self._hashes) + len(self._offsets)) * 8

    def add(self, task_id: str, offset: int, id_at: Callable[[int], str | None], log: bool = True) -> int | None:
        """Add ``task_id`` found at ``offset``; return the offset of an earlier line with the same id, if any.

        ``id_at(offset)`` reads the id of the line at an earlier offset, for the exact check on a hash match.
        The same id at the same offset is the same line, added before (by the pre-scan, with ``log=False``):
        no duplicate, no re-read, and it is logged now (the log, ids.bin, holds the ids of the lines the run
        has read, those before its frontier).
        """
        h = id_hash(task_id)
        i = h & self._mask
        hashes = self._hashes
        while True:
            slot = hashes[i]
            if slot == _EMPTY:
                break
            if slot == h:
                earlier = self._offsets[i]
                if earlier == offset:
                    break
                if id_at(earlier) == task_id:
                    return earlier
            i = (i + 1) & self._mask
        if hashes[i] == _EMPTY:
            self._store(i, h, offset)  # i is the empty slot the search ended at: no second probe to find it
        if log:
            self._log.append(h)
            self._log.append(offset)
        return None

    def find(self, task_id: str, id_at: Callable[[int], str | None]) -> int | None:
        """The offset stored for ``task_id``, or None."""
        h = id_hash(task_id)
        i = h & self._mask
        while True:
            slot = self._hashes[i]
            if slot == _EMPTY:
                return None
            if slot == h and id_at(self._offsets[i]) == task_id:
                return self._offsets[i]
            i = (i + 1) & self._mask

    def _insert(self, h: int, offset: int) -> None:
        hashes = self._hashes
        i = h & self._mask
        while hashes[i] != _EMPTY:
            i = (i + 1) & self._mask
        self._store(i, h, offset)

    def _store(self, i: int, h: int, offset: int) -> None:
        """Put (h, offset) in empty slot i; grow past three quarters full."""
        self._hashes[i] = h
        self._offsets[i] = offset
        self._count += 1
        if self._count * 4 > len(self._hashes) * 3:
            self._grow()

    def reserve(self, n: int) -> None:
        """Make room for ``n`` ids in all without growing on the way (growing re-inserts every id, in Python)."""
        while n * 4 > len(self._hashes) * 3:
            self._grow()

    def take_log(self) -> bytes:
        """The (hash, offset) pairs added since the last call, as bytes to append to ids.bin."""
        data = self._log.tobytes()
        self._log = array("Q")
        return data

    def load(self, data: bytes) -> None:
        """Add the pairs of an ids.bin prefix (ids seen by an earlier run of the same job)."""
        pairs = array("Q")
        pairs.frombytes(data[: len(data) - len(data) % 16])
        for j in range(0, len(pairs), 2):
            self._insert(pairs[j], pairs[j + 1])

    def _grow(self) -> None:
        old_h, old_o = self._hashes, self._offsets
        size = len(old_h) * 2
        self._hashes = array("Q", bytes(8 * size))
        self._offsets = array("Q", bytes(8 * size))
        self._mask = size - 1
        hashes, offsets, mask = self._hashes, self._offsets, self._mask
        for h, off in zip(old_h, old_o, strict=True):
            if h == _EMPTY:
                continue
            i = h & mask
            while hashes[i] != _EMPTY:
                i = (i + 1) & mask
            hashes[i] = h
            offsets[i] = off
