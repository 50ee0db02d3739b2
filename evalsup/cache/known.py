"""What the cache already holds, for `evalsup estimate --cache DIR` and a run's estimate at its start (issue 30):
which of a batch of keys have an answer kept that the run would serve, and its completion tokens (a task
answered from the cache costs nothing; the lengths kept inform the estimate's band). One indexed SELECT a batch
(``key IN (...)``, the primary key), read only: the file is neither created nor changed, and a damaged or busy
file is no hits and one note, never a failed estimate.

An entry counts as a hit only when it passes the check the run's workers make before answering from it
(``keep.entry_unfit``, for the request's path and the run's --cache-length): one that fails it (damaged, edited,
imported with an error) is sent again by the run, so the estimate counts it as a request (priced), and apart,
as ``unusable``. The check parses each hit's body (orjson): measured in docs/benchmarks.md against the key
look-up alone."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsup.cache.keep import entry_unfit
from evalsup.cache.key import KeyMaker
from evalsup.cache.store import CacheError, Store, cache_file, describe
from evalsup.tasks.requests import RequestDefaults, to_request
from evalsup.tasks.tokens import MAX_MODELS, OTHER, Band, Figures, Tally

BATCH = 500  # keys a SELECT (SQLite's bound-parameter limit is 999 in old builds)


class KnownAnswers:
    """The cache at ``directory`` opened for reading (``problem``: why it cannot be, one line; then every
    look-up finds nothing). ``keep_length``: the run's --cache-length (an answer cut at its token limit is a
    hit only with it, as in the run)."""

    def __init__(self, directory: Path, keep_length: bool = False) -> None:
        self.path = cache_file(directory)
        self.keep_length = keep_length
        self.store: Store | None = None
        self.problem: str | None = None
        if not self.path.is_file():
            self.problem = f"no cache at {self.path} yet"
            return
        try:
            self.store = Store(directory, readonly=True)
        except CacheError as e:
            self.problem = str(e)

    def completion_tokens(self, keys: Sequence[bytes], paths: Sequence[str | None] | None = None
                          ) -> tuple[dict[bytes, int], dict[bytes, str]]:
        """({key: its kept answer's completion tokens} for the ``keys`` whose entry the run would serve,
        {key: why not} for those whose entry it would not (``keep.entry_unfit``)). ``paths``: each key's
        request path (the route whose answer it must be); None, or a None in it: the entry's own."""
        store = self.store
        if store is None or not keys:
            return {}, {}
        path_of = dict(zip(keys, paths, strict=True)) if paths is not None else {}
        out: dict[bytes, int] = {}
        unfit: dict[bytes, str] = {}
        try:
            for i in range(0, len(keys), BATCH):
                for e in store.get_many(keys[i:i + BATCH]):
                    why = entry_unfit(e, path_of.get(e.key) or e.path, self.keep_length)[1]
                    if why is None:
                        out[e.key] = e.completion_tokens
                    else:
                        unfit[e.key] = why
        except sqlite3.Error as e:
            self.problem = f"the cache {self.path} cannot be read ({describe(e)})"
            self.close()
            return {}, {}
        return out, unfit

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


SHAPES = 256  # distinct (choices, max completion) pairs a model keeps for re-banding; past it, its band stays
FLUSH_LINES = 500  # requests looked up in the cache at once


@dataclass
class Seen:
    """Completion tokens a choice among answers: the shortest, their sum and count."""

    low: float = math.inf
    total: float = 0.0
    n: int = 0

    def add(self, per_choice: float) -> None:
        self.low = min(self.low, per_choice)
        self.total += per_choice
        self.n += 1

    @property
    def pair(self) -> tuple[float, float] | None:
        return (self.low, self.total / self.n) if self.n else None


@dataclass
class Pending:
    """A request waiting for its batch's look-up: its figures, the model's largest answer, its key, what the
    caller wants back with it (the estimate: the body its tokenizer would count), and its path (None: the
    entry's own, which its key was made with)."""

    f: Figures
    model_max: int | None
    key: bytes
    extra: Any = None
    path: str | None = None


class CachedTally:
    """An estimate's pass with the cache (issue 30): requests are offered one by one with their key and looked
    up ``FLUSH_LINES`` at a time; a request whose answer the cache holds is free (counted in ``hits``, by model),
    its answer's completion tokens a choice join ``seen``; the others go to ``miss`` (by default
    ``tally.add``), and each model's misses are kept by shape, (choices, most completion tokens): ``finish``
    bands them again with the lengths seen (the run directory's ``earlier``, and the hits'), so the pass stays
    one and flat in memory."""

    def __init__(self, known: KnownAnswers, tally: Tally, miss: Callable[[Pending], None] | None = None,
                 earlier: tuple[int, float, float] | None = None) -> None:
        self.known = known
        self.tally = tally
        self.miss = miss or (lambda p: tally.add(p.f, p.model_max))
        self.earlier = earlier  # (answers, shortest, sum) a choice already seen (the run directory's)
        self.pending: list[Pending] = []
        self.hits = 0
        self.unusable = 0  # requests whose entry the run would not serve: counted as requests
        self.unusable_why: dict[str, int] = {}  # by reason (at most MAX_MODELS reasons)
        self.by_model: dict[str, int] = {}
        self.seen = Seen()
        self.shapes: dict[str, dict[tuple[int, int], int] | None] = {}

    def offer(self, p: Pending) -> None:
        self.pending.append(p)
        if len(self.pending) >= FLUSH_LINES:
            self.flush()

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        kept, unfit = self.known.completion_tokens([p.key for p in pending], [p.path for p in pending])
        tally = self.tally
        for p in pending:
            f = p.f
            ct = kept.get(p.key)
            name = f.model or "(no model)"
            why = unfit.get(p.key) if ct is None else None
            if why is not None:  # the run sends it again: a request like any other
                self.unusable += 1
                if why in self.unusable_why or len(self.unusable_why) < MAX_MODELS:
                    self.unusable_why[why] = self.unusable_why.get(why, 0) + 1
            if ct is not None:  # answered from the cache: free
                self.hits += 1
                if name in self.by_model or len(self.by_model) < MAX_MODELS:
                    self.by_model[name] = self.by_model.get(name, 0) + 1
                if f.choices:
                    self.seen.add(ct / f.choices)
                continue
            self.miss(p)
            self._shape(name if name in tally.models else OTHER, f.choices, f.max_completion(p.model_max))

    def _shape(self, name: str, choices: int, high: int) -> None:
        got = self.shapes.setdefault(name, {})
        if got is None:
            return
        if (choices, high) not in got and len(got) >= SHAPES:
            self.shapes[name] = None  # too many to keep: this model's band stays as first made
            return
        got[(choices, high)] = got.get((choices, high), 0) + 1

    def finish(self) -> str | None:
        """The last batch, then the bands again with the hits' lengths (and the earlier ones); what the lengths
        seen came from ("cache", "run directory and cache"), or None when the hits gave none."""
        self.flush()
        if not self.seen.n:
            return None
        both = self.seen
        if self.earlier is not None and self.earlier[0]:
            n, low, total = self.earlier
            both = Seen(min(low, both.low), total + both.total, n + both.n)
        seen = both.pair
        assert seen is not None
        lo, mean = seen
        for name, t in self.tally.models.items():
            shapes = self.shapes.get(name)
            if not shapes:
                continue
            t.completion = Band(sum(n * min(lo * c, h) for (c, h), n in shapes.items()),
                                sum(n * min(mean * c, h) for (c, h), n in shapes.items()), t.completion.high)
        self.tally.seen = seen
        return "run directory and cache" if self.earlier is not None and self.earlier[0] else "cache"

    def to_json(self) -> dict[str, Any]:
        """The estimate's ``cache``: where, the hits (free requests) by model, their lengths a choice; the
        requests whose entry the run would not serve (``unusable``, by reason), when there are any."""
        return {"path": str(self.known.path), "hits": self.hits, "hits_by_model": self.by_model,
                **({"unusable": self.unusable, "unusable_why": self.unusable_why} if self.unusable else {}),
                **({"completion_seen": {"low": round(self.seen.low, 1),
                                        "mean": round(self.seen.total / self.seen.n, 1)}} if self.seen.n else {}),
                **({"note": self.known.problem} if self.known.problem else {})}


def request_key(keys: KeyMaker, obj: dict[str, Any], defaults: RequestDefaults) -> tuple[bytes, str, dict[str, Any]]:
    """A task line's cache key as the run's workers make it (worker.main: its request and its task id), with
    its request's path and body."""
    path, body, _ = to_request(obj, defaults)
    return keys.key(path, body, str(obj.get("custom_id", obj.get("id")))), path, body
