"""The worker's side of the cache: the key of each request, and the answer kept for it (a read on the worker's
loop: one indexed SELECT on a local file, tens of microseconds; a busy or damaged file is a miss). A hit is
answered here, before the request would be paced or sent, so it costs no request and no rate-limit budget, and
its result travels to the supervisor like any other (``metrics.cache: "hit"``).

An entry is a hit only once it passes the checks an online answer passes (``keep.entry_unfit``, issue 39): a
damaged, edited or imported entry that does not is a miss, its reason in the RESULT's meta (``cu``), and the
request is sent as usual; its answer then replaces the entry."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsup.cache.keep import entry_unfit, why_not
from evalsup.cache.key import KeyMaker
from evalsup.cache.store import CacheError, Entry, Store, describe

MODES = ("rw", "ro", "refresh")


@dataclass(slots=True)
class Hit:
    """An entry that passed the checks: its ``body`` as one line of JSON (the bytes kept, or written again
    compactly when they held a line break) and that body ``parsed``."""

    entry: Entry
    body: bytes
    parsed: dict[str, Any]


class CacheReader:
    """``mode``: "rw" reads and keeps, "ro" only reads, "refresh" only keeps (every request is sent and its
    answer replaces the one kept)."""

    def __init__(self, directory: Path, mode: str, model_id: str | None, endpoints: Sequence[str], salt: str,
                 keep_length: bool, schema: dict[str, Any] | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.keys = KeyMaker(model_id, tuple(endpoints), salt, schema, headers)
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

    def lookup(self, key: bytes, path: str) -> Hit | str | None:
        """The answer kept for ``key`` (a request to ``path``) as a Hit; None when there is none; a str (why)
        when there is one that fails the checks (a miss, to be counted)."""
        e = self.get(key)
        if e is None:
            return None
        parsed, why = entry_unfit(e, path, self.keep_length)
        if why is not None:
            return why
        single = b"\n" not in e.body and b"\r" not in e.body
        return Hit(e, e.body if single else orjson.dumps(parsed), parsed)

    def keep(self, parsed: Any, raw: bytes | None) -> bool:
        """Whether an answer (a 200 without error) may be kept."""
        return self.keeps and why_not(parsed, raw, self.keep_length) is None
