"""The cache's one SQLite file, ``DIR/cache.sqlite``, in WAL mode (the standard library's sqlite3; values are
bytes and numbers, never pickled).

Safe with several evalsup processes (runs, shards, their workers) on one host: WAL lets readers go on while one
writer commits; every write is one short transaction (``BEGIN IMMEDIATE``: the write lock is taken at its
start, so two writers queue on ``busy_timeout`` instead of failing with "database is locked" half-way); readers
finish each statement at once, so no reader holds an old snapshot. ``synchronous=NORMAL``: a power cut may lose
the last transactions, never the file's consistency (the results file is the truth; an entry lost is a miss).

The byte budget counts each entry's body plus ``ROW_BYTES``; ``meta.bytes`` keeps the sum, kept exact by
triggers in the same transactions as the entries. Past the budget the least recently used entries (``atime``,
set when written and when a run hits them) go in batches, down to ``PRUNE_TO`` of the budget.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsup.cache.mounts import network_problem

FILE = "cache.sqlite"
ROW_BYTES = 128  # a row's cost beside its body: key, numbers, index entries
PRUNE_BATCH = 1000  # entries deleted per transaction
PRUNE_TO = 0.9  # of the budget, so a full cache is not pruned at every batch
BUSY_MS = 10_000  # a writer waits this long for another's transaction (each is short)
READ_BUSY_MS = 200  # a worker's read (on its event loop) waits at most this long; then a miss

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY,
    body BLOB NOT NULL,
    status INTEGER NOT NULL,
    request_id TEXT,
    model TEXT,
    path TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    atime REAL NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_atime ON entries(atime);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('bytes', 0), ('version', 1);
CREATE TRIGGER IF NOT EXISTS entries_ins AFTER INSERT ON entries
    BEGIN UPDATE meta SET v = v + NEW.size WHERE k = 'bytes'; END;
CREATE TRIGGER IF NOT EXISTS entries_del AFTER DELETE ON entries
    BEGIN UPDATE meta SET v = v - OLD.size WHERE k = 'bytes'; END;
CREATE TRIGGER IF NOT EXISTS entries_upd AFTER UPDATE OF size ON entries
    BEGIN UPDATE meta SET v = v + NEW.size - OLD.size WHERE k = 'bytes'; END;
"""

COLUMNS = ("key", "body", "status", "request_id", "model", "path", "prompt_tokens", "completion_tokens",
           "created", "atime")


class CacheError(Exception):
    """The cache cannot be used: its place (a network file system, not writable) or its file (damaged)."""


@dataclass(slots=True)
class Entry:
    """One answer kept: its body as written in the record (bytes), and what the record and the summary show."""

    key: bytes
    body: bytes
    status: int = 200
    request_id: str | None = None
    model: str | None = None
    path: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    created: float = 0.0
    atime: float = 0.0


def cache_file(directory: Path) -> Path:
    return directory / FILE


class NotText(bytes):
    """A TEXT value whose bytes are not UTF-8 (the file was edited: evalsup writes bodies as BLOBs and its text
    columns as str), kept as those bytes. The driver's own decoding raised instead, from the row's fetch, so one
    such row stopped a whole export; as this, it is one entry the checks refuse (``shape_problem``: not a string;
    ``keep.why_unfit``: not JSON)."""


def _text(raw: bytes) -> str | NotText:
    """The connection's ``text_factory``: a TEXT value as str, or as NotText when it is not UTF-8."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return NotText(raw)


def _connect(path: Path, busy_ms: int) -> sqlite3.Connection:
    # isolation_level=None: transactions only as written (BEGIN IMMEDIATE ... COMMIT), never implicit ones
    conn = sqlite3.connect(path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False)
    conn.text_factory = _text
    conn.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
    return conn


def describe(e: BaseException) -> str:
    return str(e) or type(e).__name__


class Store:
    """The cache file, opened for writing (the supervisor, the `evalsup cache` commands) or for reading
    (a worker: ``readonly``). Raises CacheError (with one line for the user) when it cannot be used."""

    def __init__(self, directory: Path, readonly: bool = False, mounts: str | None = None) -> None:
        self.directory = directory
        self.path = cache_file(directory)
        problem = network_problem(directory, mounts)
        if problem is not None:
            raise CacheError(problem)
        try:
            if not readonly:
                directory.mkdir(parents=True, exist_ok=True)
            self.conn = _connect(self.path, READ_BUSY_MS if readonly else BUSY_MS)
        except (OSError, sqlite3.Error) as e:
            raise CacheError(f"cannot open the cache {self.path}: {describe(e)}") from None
        try:
            if readonly:
                self.conn.execute("PRAGMA query_only=1")
                self.conn.execute("SELECT 1 FROM entries LIMIT 1").fetchall()
            else:
                self._setup()
        except sqlite3.Error as e:
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
            raise CacheError(f"the cache {self.path} cannot be read ({describe(e)})") from None

    def _setup(self) -> None:
        c = self.conn
        mode = c.execute("PRAGMA journal_mode").fetchall()[0][0]
        if str(mode).lower() != "wal":
            c.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table: pruning can give space back
            got = c.execute("PRAGMA journal_mode=WAL").fetchall()[0][0]
            if str(got).lower() != "wal":
                raise sqlite3.OperationalError(f"WAL mode refused (journal_mode {got})")
        c.execute("PRAGMA synchronous=NORMAL")
        with self.transaction():
            for stmt in SCHEMA.split(";\n"):
                if stmt.strip():
                    c.execute(stmt)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction, its write lock taken at the start."""
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()

    # ----- reading (a worker, on its loop: one indexed read, finished at once) -----

    def get(self, key: bytes) -> Entry | None:
        rows = self.conn.execute(
            "SELECT body, status, request_id, model, path, prompt_tokens, completion_tokens, created, atime "
            "FROM entries WHERE key = ?", (key,)).fetchall()
        if not rows:
            return None
        r = rows[0]
        return Entry(key, blob(r[0]), *r[1:])

    def get_many(self, keys: Sequence[bytes]) -> Iterator[Entry]:
        """The entries of ``keys`` that are there (one indexed SELECT; at most 999 keys, SQLite's oldest limit of
        bound parameters), one row at a time: a batch of large bodies is never held at once. Read to the end
        (or closed) at once, so no snapshot is held."""
        if not keys:
            return
        cur = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM entries WHERE key IN "
                                f"({','.join('?' * len(keys))})", tuple(keys))
        try:
            for r in cur:
                yield Entry(blob(r[0]), blob(r[1]), *r[2:])
        finally:
            cur.close()

    # ----- writing -----

    def put(self, entries: Iterable[Entry], touched: Iterable[bytes] = (), now: float | None = None) -> int:
        """Keep ``entries`` (a key already there is replaced: --cache-mode refresh) and mark ``touched`` keys
        used now, in one transaction; the entries written."""
        now = time.time() if now is None else now
        rows = [(e.key, e.body, e.status, e.request_id, e.model, e.path, e.prompt_tokens, e.completion_tokens,
                 e.created or now, e.atime or now, len(e.body) + ROW_BYTES) for e in entries]
        touch = [(now, k) for k in touched]
        if not rows and not touch:
            return 0
        with self.transaction() as c:
            c.executemany(
                "INSERT INTO entries (key, body, status, request_id, model, path, prompt_tokens, completion_tokens, "
                "created, atime, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                "body = excluded.body, status = excluded.status, request_id = excluded.request_id, "
                "model = excluded.model, path = excluded.path, prompt_tokens = excluded.prompt_tokens, "
                "completion_tokens = excluded.completion_tokens, created = excluded.created, "
                "atime = excluded.atime, size = excluded.size", rows)
            c.executemany("UPDATE entries SET atime = ? WHERE key = ?", touch)
        return len(rows)

    def add_missing(self, entries: Iterable[Entry]) -> int:
        """Import: keep the entries whose key is not there yet; how many were added."""
        added = 0
        with self.transaction() as c:
            for e in entries:
                cur = c.execute(
                    "INSERT OR IGNORE INTO entries (key, body, status, request_id, model, path, prompt_tokens, "
                    "completion_tokens, created, atime, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (e.key, e.body, e.status, e.request_id, e.model, e.path, e.prompt_tokens, e.completion_tokens,
                     e.created, e.atime, len(e.body) + ROW_BYTES))
                added += cur.rowcount
        return added

    def bytes_used(self) -> int:
        rows = self.conn.execute("SELECT v FROM meta WHERE k = 'bytes'").fetchall()
        return int(rows[0][0]) if rows else 0

    def prune(self, max_bytes: int, to: float = PRUNE_TO) -> int:
        """Past ``max_bytes``, delete the least recently used entries (in batches of PRUNE_BATCH, a transaction
        each) until at most ``to`` of it is used; the entries deleted."""
        if self.bytes_used() <= max_bytes:
            return 0
        target = int(max_bytes * to)
        gone = 0
        while (excess := self.bytes_used() - target) > 0:
            with self.transaction() as c:  # the oldest used, just enough of them (at most PRUNE_BATCH a transaction)
                rows = c.execute("SELECT rowid, size FROM entries ORDER BY atime LIMIT ?", (PRUNE_BATCH,)).fetchall()
                doomed = []
                for rowid, size in rows:
                    doomed.append((rowid,))
                    excess -= size
                    if excess <= 0:
                        break
                c.executemany("DELETE FROM entries WHERE rowid = ?", doomed)
            gone += len(doomed)
            if not doomed:
                break
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("PRAGMA incremental_vacuum")  # give the freed pages back to the file system
        return gone

    def stats(self) -> dict[str, Any]:
        c = self.conn
        n, body, pt, ct, first, last = c.execute(
            "SELECT count(*), coalesce(sum(length(body)), 0), coalesce(sum(prompt_tokens), 0), "
            "coalesce(sum(completion_tokens), 0), min(created), max(atime) FROM entries").fetchall()[0]
        models = c.execute("SELECT model, count(*) FROM entries GROUP BY model ORDER BY count(*) DESC LIMIT 20"
                           ).fetchall()
        size = sum(p.stat().st_size for p in (self.path, self.path.with_name(FILE + "-wal")) if p.exists())
        return {"path": str(self.path), "entries": n, "body_bytes": body, "budget_bytes": self.bytes_used(),
                "file_bytes": size, "prompt_tokens": pt, "completion_tokens": ct, "oldest": first,
                "last_used": last, "models": {str(m): k for m, k in models}}

    def entries(self) -> Iterator[Entry]:
        """Every entry, oldest use first (export)."""
        cur = self.conn.execute(f"SELECT {', '.join(COLUMNS)} FROM entries ORDER BY atime")
        try:
            for r in cur:
                yield Entry(blob(r[0]), blob(r[1]), *r[2:])
        finally:
            cur.close()


def blob(value: Any) -> bytes:
    """A BLOB column's value as bytes, whatever SQLite holds there (a file edited by hand may hold text, a
    number or NULL: their bytes, or none, and the checks that follow refuse them; a text that is not UTF-8 is
    its bytes, NotText)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, memoryview | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace")
    return b""


MAX_INT = (1 << 63) - 1  # SQLite's INTEGER


def field_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be an entry's ``name`` (one of COLUMNS but key and body), or None."""
    if name in ("prompt_tokens", "completion_tokens", "status"):
        low, high = (100, 599) if name == "status" else (0, MAX_INT)
        if type(value) is not int:
            return f"a whole number expected, got {_kind(value)}"
        if not low <= value <= high:
            return f"{value} is out of range ({low} to {high})"
    elif name in ("request_id", "model", "path"):
        if value is not None and not isinstance(value, str):
            return f"a string or null expected, got {_kind(value)}"
    elif name in ("created", "atime"):
        if type(value) not in (int, float):
            return f"a time in seconds expected, got {_kind(value)}"
        if not math.isfinite(value) or value < 0:
            return f"{value} is not a time"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, NotText):
        return "text that is not UTF-8"
    return {bool: "a boolean", str: "a string", dict: "an object", list: "a list", float: "a fraction"}.get(
        type(value), type(value).__name__)


def shape_problem(e: Entry) -> str | None:
    """Why a row read back cannot be a record's (a value of another kind than evalsup writes: the file was
    edited), or None."""
    for name in COLUMNS[2:]:
        problem = field_problem(name, getattr(e, name))
        if problem is not None:
            return f"{name}: {problem}"
    return None


def entry_json(e: Entry) -> bytes:
    """One line of an export: the body as a string of its exact bytes (a parse and a dump could change them)."""
    return orjson.dumps({"key": e.key.hex(), "body": e.body.decode(), "status": e.status, "request_id": e.request_id,
                         "model": e.model, "path": e.path, "prompt_tokens": e.prompt_tokens,
                         "completion_tokens": e.completion_tokens, "created": e.created, "atime": e.atime},
                        option=orjson.OPT_APPEND_NEWLINE)


class BadEntry(ValueError):
    """An import's line that is not a cache entry: the message says why, in one line (no value quoted whole)."""


def entry_from_json(line: bytes, now: float | None = None) -> Entry:
    """An export's line back, its body stored as compact JSON (parsed and written again: a body edited into
    several lines can never make a record of several lines); a field left out or null takes its default
    (status 200, no tokens, the times ``now``). Raises BadEntry."""
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise BadEntry(f"not JSON ({e})") from None
    if not isinstance(d, dict):
        raise BadEntry(f"a JSON object expected, got {_kind(d)}")
    key = d.get("key")
    if not isinstance(key, str) or len(key) != 64:
        raise BadEntry("key: 64 hex digits expected")
    try:
        raw_key = bytes.fromhex(key)
    except ValueError:
        raise BadEntry("key: 64 hex digits expected") from None
    text = d.get("body")
    if not isinstance(text, str):
        raise BadEntry(f"body: the answer's JSON as a string expected, got {_kind(text)}")
    try:
        body = orjson.dumps(orjson.loads(text))
    except orjson.JSONDecodeError as e:
        raise BadEntry(f"body: not JSON ({e})") from None
    now = time.time() if now is None else now
    defaults: dict[str, Any] = {"status": 200, "prompt_tokens": 0, "completion_tokens": 0, "created": now,
                                "atime": now}
    v: dict[str, Any] = {}
    for name in COLUMNS[2:]:
        value = d.get(name)
        if value is None:
            value = defaults.get(name)
        problem = field_problem(name, value)
        if problem is not None:
            raise BadEntry(f"{name}: {problem}")
        v[name] = value
    return Entry(raw_key, body, v["status"], v["request_id"], v["model"], v["path"], v["prompt_tokens"],
                 v["completion_tokens"], float(v["created"]), float(v["atime"]))
