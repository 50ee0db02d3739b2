"""The worker's side of the cache: the key of each request, and the answer kept for it (a read on the worker's
loop: one indexed SELECT on a local file, tens of microseconds; a busy or damaged file is a miss). A hit is
answered here, before the request would be paced or sent, so it costs no request and no rate-limit budget, and
its result travels to the supervisor like any other (``metrics.cache: "hit"``)."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evalsup.cache.keep import why_not
from evalsup.cache.key import KeyMaker
from evalsup.cache.store import CacheError, Entry, Store, describe

MODES = ("rw", "ro", "refresh")


class CacheReader:
    """``mode``: "rw" reads and keeps, "ro" only reads, "refresh" only keeps (every request is sent and its
    answer replaces the one kept)."""

    def __init__(self, directory: Path, mode: str, model_id: str | None, endpoints: Sequence[str], salt: str,
                 keep_length: bool, schema: dict[str, Any] | None = None) -> None:
        self.keys = KeyMaker(model_id, tuple(endpoints), salt, schema)
        self.reads = mode in ("rw", "ro")
        self.keeps = mode in ("rw", "refresh")
        self.keep_length = keep_length
        self.store: Store | None = None
        if self.reads:
            try:
                self.store = Store(directory, readonly=True)
            except CacheError as e:
                self._warn(str(e))

    def _warn(self, what: str) -> None:
        print(f"evalsup: warning: {what}; this worker answers from the endpoint only", file=sys.stderr, flush=True)
        self.store = None

    def key(self, path: str, body: dict[str, Any], task_id: str) -> bytes:
        return self.keys.key(path, body, task_id)

    def get(self, key: bytes) -> Entry | None:
        store = self.store
        if store is None:
            return None
        try:
            return store.get(key)
        except sqlite3.OperationalError:  # busy past READ_BUSY_MS: a miss this once
            return None
        except sqlite3.Error as e:
            self._warn(f"the cache {store.path} cannot be read ({describe(e)})")
            store.close()
            return None

    def keep(self, parsed: Any, raw: bytes | None) -> bool:
        """Whether an answer (a 200 without error) may be kept."""
        return self.keeps and why_not(parsed, raw, self.keep_length) is None
