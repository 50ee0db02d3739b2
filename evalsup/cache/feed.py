"""The supervisor's side of the cache: answers kept only once their records are committed.

A worker that got an answer worth keeping says so in its RESULT meta (``ck``: the key, where the body sits in
the output line, its request id, model and path); the supervisor notes where that line lands in
``results.jsonl`` (``note``: a small tuple, no body held) and, when a checkpoint has fsynced the file past it
(``committed``), hands the batch to this module's thread, which reads the bodies back from the results file
(``os.pread``: the page cache, as they were just written) and writes them in one short transaction. The
results file stays the source of truth: a crash before the cache write costs a miss, never a wrong answer,
and the supervisor's loop does no SQLite work and holds no body. Hits (``touch``) have their use time set in
the same transactions, which is what the byte budget's least-recently-used pruning reads.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsup.cache.store import Entry, Store, describe

# (end of the line in results.jsonl, absolute offset of the body, its length, key, request id, model, path,
#  prompt tokens, completion tokens)
Pending = tuple[int, int, int, bytes, str | None, str | None, str | None, int, int]


class CacheFeed:
    """Writes kept answers after their records are committed (a thread of its own); ``mode``: "rw" or
    "refresh" write, "ro" only counts. ``log(message, level)`` says a failure once."""

    def __init__(self, store: Store, results_path: Path, mode: str, max_bytes: int | None,
                 log: Callable[..., None]) -> None:
        self.store = store
        self.results_path = results_path
        self.writes = mode in ("rw", "refresh")
        self.max_bytes = max_bytes
        self.log = log
        self.pending: collections.deque[Pending] = collections.deque()
        self.touched: list[bytes] = []
        self.jobs: queue.SimpleQueue[tuple[list[Pending], list[bytes]] | None] = queue.SimpleQueue()
        self.written = 0  # entries written this session
        self.pruned = 0  # entries pruned this session (least recently used, past --cache-max-gb)
        self.broken: str | None = None  # a write failed: said once, and the rest of the session writes nothing
        self._fd: int | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="evalsup-cache", daemon=True)
        self._thread.start()

    # ----- on the supervisor's loop: appends only -----

    def note(self, line_offset: int, line_len: int, ck: list[Any], pt: int, ct: int) -> None:
        """A line holding a kept answer was appended at ``line_offset`` of results.jsonl; ``ck`` is the meta's
        [key hex, body offset in the line, body length, request id, model, path]."""
        if not self.writes or self.broken:
            return
        try:
            key = bytes.fromhex(ck[0])
            off, n = int(ck[1]), int(ck[2])
        except (TypeError, ValueError, IndexError):
            return
        if len(key) != 32 or off < 0 or n <= 0 or off + n > line_len:
            return
        self.pending.append((line_offset + line_len, line_offset + off, n, key, ck[3], ck[4], ck[5], pt, ct))

    def touch(self, key_hex: str) -> None:
        """A hit: its entry was used now (the budget's least-recently-used order)."""
        if self.writes and not self.broken:
            with contextlib.suppress(TypeError, ValueError):
                self.touched.append(bytes.fromhex(key_hex))

    def committed(self, results_len: int) -> None:
        """results.jsonl is fsynced up to ``results_len``: the answers whose lines end before it go to the thread."""
        batch: list[Pending] = []
        pending = self.pending
        while pending and pending[0][0] <= results_len:
            batch.append(pending.popleft())
        touched, self.touched = self.touched, []
        if batch or touched:
            self.jobs.put((batch, touched))

    def close(self, timeout: float = 30.0) -> None:
        """After the last checkpoint: let the thread write what it was handed, then close the file."""
        if self._closed:
            return
        self._closed = True
        self.jobs.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            return  # (a daemon thread: it ends with the process; what it had not written is a miss later)
        self.store.close()
        if self._fd is not None:
            os.close(self._fd)

    # ----- the thread -----

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.broken:
                continue
            try:
                self._write(*job)
            except (OSError, sqlite3.Error, ValueError) as e:
                self.broken = describe(e)
                self.log(f"warning: the cache {self.store.path} cannot be written ({self.broken}); the run goes on "
                         "without keeping answers (results.jsonl has them all)", "warning")

    def _write(self, batch: list[Pending], touched: list[bytes]) -> None:
        if self._fd is None and batch:
            self._fd = os.open(self.results_path, os.O_RDONLY | os.O_CLOEXEC)
        entries = []
        now = time.time()
        for _end, off, n, key, rid, model, path, pt, ct in batch:
            assert self._fd is not None
            body = os.pread(self._fd, n, off)
            if len(body) == n:
                entries.append(Entry(key, body, 200, rid, model, path, pt, ct, now, now))
        self.written += self.store.put(entries, touched, now)
        if self.max_bytes is not None:
            self.pruned += self.store.prune(self.max_bytes)

    def summary(self) -> dict[str, Any]:
        return {"written": self.written, "pruned": self.pruned, **({"error": self.broken} if self.broken else {})}
