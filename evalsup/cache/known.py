"""What the cache already holds, for `evalsup estimate --cache DIR` (issue 30): which of a batch of keys have an
answer kept, and its completion tokens (a task answered from the cache costs nothing; the lengths kept inform
the estimate's band). One indexed SELECT a batch (``key IN (...)``, the primary key), read only: the file is
neither created nor changed, and a damaged or busy file is no hits and one warning, never a failed estimate."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

from evalsup.cache.store import CacheError, Store, cache_file, describe

BATCH = 500  # keys a SELECT (SQLite's bound-parameter limit is 999 in old builds)


class KnownAnswers:
    """The cache at ``directory`` opened for reading (``problem``: why it cannot be, one line; then every
    look-up finds nothing)."""

    def __init__(self, directory: Path) -> None:
        self.path = cache_file(directory)
        self.store: Store | None = None
        self.problem: str | None = None
        if not self.path.is_file():
            self.problem = f"no cache at {self.path} yet"
            return
        try:
            self.store = Store(directory, readonly=True)
        except CacheError as e:
            self.problem = str(e)

    def completion_tokens(self, keys: Sequence[bytes]) -> dict[bytes, int]:
        """{key: its kept answer's completion tokens} for the ``keys`` that have one."""
        store = self.store
        if store is None or not keys:
            return {}
        out: dict[bytes, int] = {}
        try:
            for i in range(0, len(keys), BATCH):
                part = keys[i:i + BATCH]
                rows = store.conn.execute(
                    f"SELECT key, completion_tokens FROM entries WHERE key IN ({','.join('?' * len(part))})",
                    part).fetchall()
                out.update((bytes(k), int(ct or 0)) for k, ct in rows)
        except sqlite3.Error as e:
            self.problem = f"the cache {self.path} cannot be read ({describe(e)})"
            self.close()
            return {}
        return out

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
