"""`evalsup estimate TASKS`: what a run of TASKS would send and cost, before it is started (issue 30).

One streamed pass over the task file (``TaskReader``: each line checked as the run checks it, but for duplicate
ids, which the run's pre-scan refuses; memory stays flat however long the file is: 28 MiB peak for 10 thousand
lines and for a million): requests, prompt tokens and completion tokens as a low / expected / high band, and the
cost from the price table (config.prices), by model and in all (the maths: tasks.tokens.Tally). The band's lengths
seen come from the run directory's answers (``seen_lengths``) and, with ``--cache DIR``, from the cache: a request
whose key (cache.key, as the run's workers make it) the cache already holds costs nothing and is counted apart
(``cache.hits``; an entry the run would not serve, damaged or no answer, is a request like any other, counted
apart as ``cache.unusable``: cache.keep.entry_unfit, the run's own check), and the completion tokens of those
kept answers join the lengths seen (each model's misses are
banded again with them at the end, from their (choices, max tokens) shapes, so the pass stays
one and flat). The keys are looked up in batches (one indexed SELECT each: cache.known.CachedTally).

Prompt tokens come from the endpoint's own tokenizer when it serves one (vLLM and SGLang: ``POST /tokenize``
at the server's root with ``{"model", "messages"}`` or ``{"model", "prompt"}``, answering ``{"count"}`` or
``{"tokens"}``), for the first ``tokenize_max`` requests; the rest are scaled from the ratio those showed. Without
a tokenizer (no --base-url, or the endpoint answers 404) they are an estimate, characters / 4, marked ≈.

Completion tokens: low 0, expected half of max_tokens, high max_tokens. A request without max_tokens is bounded
by the model's largest answer (the shipped table) or its context window (genai-prices); with neither known it is
said to be unbounded ("set --max-tokens"), its high end and cost left open, and its expected length unknown until
answers are seen, rather than a figure made up. When the run directory already holds answers (a resume), the low
end is the shortest seen and the expected the mean seen, and the band covers only the tasks still to do.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsup.cache.key import KeyMaker
from evalsup.cache.known import CachedTally, KnownAnswers, Pending, request_key
from evalsup.config.prices import PriceTable
from evalsup.rundir.checkpoint import JournalError
from evalsup.rundir.layout import RESULTS
from evalsup.rundir.usage import Usage, usage_of_results
from evalsup.tasks.headers import api_key, build_headers, key_source, request_headers
from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import TaskReader
from evalsup.tasks.requests import RequestDefaults, credentials, to_request
from evalsup.tasks.routes import CHAT, COMPLETIONS
from evalsup.tasks.tokens import Figures, Tally, figures, one_line

TOKENIZE_PATH = "/tokenize"
TIMEOUT_S = 10.0

__all__ = ["EstimateError", "Tokenizer", "estimate", "estimate_text", "seen_lengths"]


class _NoIds(IdSet):
    """No duplicate-id check: the estimate counts lines in constant memory (the run's pre-scan refuses a duplicate
    id before its first request)."""

    def add(self, task_id: str, offset: int, id_at: Callable[[int], str | None], log: bool = True) -> int | None:
        return None


class EstimateError(Exception):
    """The estimate cannot be made; the message is one line."""


@dataclass
class Tokenizer:
    """The endpoint's ``/tokenize`` (at its root: ``http://host:8000/v1`` -> ``http://host:8000/tokenize``), on
    one kept-alive connection. ``absent`` once it answered 404/405 (or no connection): none is served."""

    base_url: str
    headers: dict[str, str]
    absent: bool = False
    failed: int = 0
    _conn: http.client.HTTPConnection | None = None

    def __post_init__(self) -> None:
        bare, _ = credentials(self.base_url)
        u = urllib.parse.urlsplit(bare)
        root = u.path.rstrip("/").removesuffix("/v1")
        self.path = root + TOKENIZE_PATH
        self.host, self.port, self.https = u.hostname or "127.0.0.1", u.port, u.scheme == "https"

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=TIMEOUT_S,
                                                         context=ssl.create_default_context())
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        return self._conn

    def count(self, body: dict[str, Any]) -> int | None:
        """The prompt tokens of ``body`` ({"model", "messages"} or {"model", "prompt"}), or None."""
        if self.absent:
            return None
        try:
            conn = self._connection()
            conn.request("POST", self.path, orjson.dumps(body), self.headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            self.failed += 1
            if self.failed >= 3:
                self.absent = True
            return None
        if resp.status in (404, 405, 501):
            self.absent = True
            return None
        if resp.status != 200:
            self.failed += 1
            return None
        try:
            got = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.absent = True
            return None
        n = got.get("count") if isinstance(got, dict) else None
        if n is None and isinstance(got, dict) and isinstance(got.get("tokens"), list):
            n = len(got["tokens"])
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def seen_lengths(run_dir: Path | None) -> tuple[int, tuple[float, float] | None]:
    """(records done, (shortest, mean) completion tokens a choice among the answers with usage), from the run
    directory's results.jsonl when there is one (streamed: rundir.usage)."""
    if run_dir is None:
        return 0, None
    u = usage_of_results(run_dir / RESULTS, lambda _m: None)
    return u.records, u.seen


def _tokenize_body(path: str, body: dict[str, Any]) -> dict[str, Any] | None:
    if path == CHAT.path and isinstance(body.get("messages"), list):
        return {"model": body.get("model"), "messages": body["messages"]}
    if path == COMPLETIONS.path and isinstance(body.get("prompt"), str):
        return {"model": body.get("model"), "prompt": body["prompt"]}
    return None


FLUSH_BYTES = 4 << 20  # the tokenizer's bodies a batch of cache look-ups may hold; past it, looked up at once


def estimate(tasks: Path, prices: PriceTable, defaults: RequestDefaults, *, base_url: str | None = None,
             headers: dict[str, str] | None = None, tokenize_max: int = 2000, run_dir: Path | None = None,
             shard: tuple[int, int] | None = None, max_line_bytes: int = 16 << 20, cache_dir: Path | None = None,
             cache_model_id: str | None = None, cache_salt: str = "", cache_length: bool = False) -> dict[str, Any]:
    """The estimate of ``tasks`` (see the module's doc) as a dict: ``Tally.summary`` plus how it was made.
    With ``cache_dir`` (--cache DIR, its key settings as the run's) the requests whose answer the cache holds
    are free: counted apart (``cache.hits``), not in the requests, tokens and cost; their answers' lengths join
    the band's lengths seen. An entry the run would not serve (``cache.keep.entry_unfit``, ``cache_length`` as
    the run's --cache-length) is a request, counted apart too (``cache.unusable``). Raises EstimateError (a bad
    line: ``file:LINE: why``, as the run would refuse it)."""
    from evalsup.tasks.reader import TaskError

    u = Usage()
    if run_dir is not None:
        try:
            u = usage_of_results(run_dir / RESULTS, lambda _m: None)
        except JournalError as e:  # a damaged results.jsonl (evalsup repair)
            raise EstimateError(str(e)) from None
    done = u.records
    tally = Tally(seen=u.seen)
    tok = Tokenizer(base_url, headers or {}) if base_url else None
    counted = approx_sum = 0  # the tokenizer's counts and the ≈ figures of the same requests: their ratio scales

    def count(f: Figures, model_max: int | None, tb: dict[str, Any] | None) -> None:
        nonlocal counted, approx_sum
        exact: int | None = None
        if tok is not None and not tok.absent and tally.exact < tokenize_max and tb is not None:
            exact = tok.count(tb)
            if exact is not None:
                counted += exact
                approx_sum += f.approx_prompt
        scaled = None if exact is not None or not counted else round(f.approx_prompt * counted / approx_sum)
        tally.add(f, model_max, exact if exact is not None else scaled, counted=exact is not None)

    look = None if cache_dir is None else CachedTally(KnownAnswers(cache_dir, cache_length), tally,
                                                      lambda p: count(p.f, p.model_max, p.extra),
                                                      (u.answers, u.low, u.sum_per_choice))
    keys = KeyMaker(cache_model_id, (base_url,) if base_url else (), cache_salt)
    held = 0  # bytes of the tokenizer's bodies waiting for their batch's look-up
    try:
        with TaskReader(tasks, max_line_bytes, ids=_NoIds(16)) as reader:
            while True:
                got = reader.next()
                if got is None:
                    break
                index = got[2]
                if shard is not None and index % shard[1] != shard[0]:
                    continue
                obj = reader.last_obj
                f = figures(obj, defaults)
                price = prices.lookup(f.model)
                model_max = price.completion_bound if price else None
                pending = len(look.pending) if look is not None else 0
                wants_tb = tok is not None and not tok.absent and tally.exact + pending < tokenize_max
                if look is None:
                    count(f, model_max, _tokenize_body(*to_request(obj, defaults)[:2]) if wants_tb else None)
                    continue
                key, path, body = request_key(keys, obj, defaults)
                tb = _tokenize_body(path, body) if wants_tb else None
                held += len(got[1]) if tb is not None else 0
                look.offer(Pending(f, model_max, key, tb, path))
                if held >= FLUSH_BYTES:
                    look.flush()
                if not look.pending:
                    held = 0
            from_cache = look.finish() if look is not None else None
    except TaskError as e:
        raise EstimateError(str(e)) from None
    except OSError as e:
        raise EstimateError(f"{tasks}: {e.strerror}") from None
    finally:
        if tok is not None:
            tok.close()
        if look is not None:
            look.known.close()
    hits = look.hits if look is not None else 0
    left = 1.0
    if done and tally.requests:  # the tasks done are taken from those the cache does not answer first
        left = max(0.0, (tally.requests - max(0, done - hits)) / tally.requests)
    out = tally.scaled(left).summary(prices.lookup) if left < 1.0 else tally.summary(prices.lookup)
    if from_cache:
        out["completion_from"] = f"seen ({from_cache})"
    out.update({
        "tasks": str(tasks), "total_requests": tally.requests + hits, "done": done, "prices": prices.describe(),
        "price_sources": prices.to_json(),  # which source priced each model, with its date
        "tokenizer": "none" if tok is None else ("absent (404): ≈ chars/4" if tok.absent and not counted else
                                                 f"{tok.path} ({tally.exact:,} counted"
                                                 + (", the rest scaled by their ratio)" if tally.exact < tally.requests
                                                    else ")")),
    })
    if look is not None:
        out["cache"] = look.to_json()
    if tally.exact and tally.exact < tally.requests:
        out["prompt_tokens_counted"] = f"endpoint for {tally.exact:,}, the rest scaled"
    return out


def endpoint_headers(base_url: str, header_specs: tuple[str, ...], key_env: str | None,
                     key_file: str | None) -> dict[str, str]:
    """The headers of a /tokenize request: those of the run's requests (the key, --header)."""
    try:
        key = api_key(key_env, key_file)
    except OSError:
        key = None
    return request_headers(base_url, build_headers(header_specs), key, key_source(key_env, key_file))


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:,}"


def _usd(x: float | None) -> str:
    return "?" if x is None else f"${x:,.4f}"


def estimate_text(s: dict[str, Any]) -> str:
    """The estimate for a person: the one line, then a line a model."""
    lines = []
    head = f"estimate for {s['tasks']}"
    if s.get("done"):
        head += f" ({s['done']:,} of {s['total_requests']:,} done already: the figures are for the rest)"
    lines.append(head)
    lines.append("  " + one_line(s))
    c = s.get("cache")
    if c is not None:  # --cache DIR: the requests it would answer cost nothing and are not in the figures above
        seen = c.get("completion_seen")
        lines.append(f"  cache {c['path']}: {c['hits']:,} of {s['total_requests']:,} requests would be answered "
                     "from it (free, not counted above)"
                     + (f"; its answers' completion tokens a choice: shortest {seen['low']:,.0f}, mean "
                        f"{seen['mean']:,.0f} (the band's low and expected)" if seen else "")
                     + (f"; {c['unusable']:,} kept answers unusable ("
                        + ", ".join(f"{k:,} {why}" for why, k in c["unusable_why"].items())
                        + "): the run sends them again, counted above" if c.get("unusable") else "")
                     + (f" ({c['note']})" if c.get("note") else ""))
    for name, m in s["models"].items():
        p, c = m["prompt_tokens"], m["completion_tokens"]
        cost = m["cost_usd"]
        money = "no price (say it with --prices FILE, or --self-hosted)" if cost is None else \
            f"{_usd(cost['low'])} / {_usd(cost['expected'])} / {_usd(cost['high'])}"
        more = ""
        if m.get("unbounded"):
            more = f"; {m['unbounded']:,} without max_tokens and no known limit of the model: unbounded, set " \
                "--max-tokens"
        elif m.get("no_max_tokens"):
            more = f"; {m['no_max_tokens']:,} without max_tokens (high: the model's largest answer or context)"
        lines.append(f"  {name}: {m['requests']:,} requests; prompt {p['low']:,}/{p['expected']:,}/{p['high']:,}; "
                     f"completion {_n(c['low'])}/{_n(c['expected'])}/{_n(c['high'])}; cost {money}{more}")
    lines.append(f"  (low / expected / high, ? where nothing bounds it; prompt tokens: {s['prompt_tokens_counted']}; "
                 f"tokenizer: {s['tokenizer']}; prices: {s['prices']})")
    return "\n".join(lines)
