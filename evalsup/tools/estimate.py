"""`evalsup estimate TASKS`: what a run of TASKS would send and cost, before it is started (issue 30).

One streamed pass over the task file (``TaskReader``: each line checked as the run checks it, but for duplicate
ids, which the run's pre-scan refuses; memory stays flat however long the file is: 28 MiB peak for 10 thousand
lines and for a million): requests, prompt tokens and completion tokens as a low / expected / high band, and the
cost from the price table (config.prices), by model and in all (the maths: tasks.tokens.Tally). The band's lengths
seen come from the run directory's answers (``seen_lengths``); a cache of answers may feed ``Tally.seen`` the same
way.

Prompt tokens come from the endpoint's own tokenizer when it serves one (vLLM and SGLang: ``POST /tokenize``
at the server's root with ``{"model", "messages"}`` or ``{"model", "prompt"}``, answering ``{"count"}`` or
``{"tokens"}``), for the first ``tokenize_max`` requests; the rest are scaled from the ratio those showed. Without
a tokenizer (no --base-url, or the endpoint answers 404) they are an estimate, characters / 4, marked ≈.

Completion tokens: low 0, expected half of max_tokens, high max_tokens (a request without max_tokens: the model's
largest answer from the price table, else 4096). When the run directory already holds answers (a resume), the
low end is the shortest seen and the expected the mean seen, and the band covers only the tasks still to do.
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

from evalsup.config.prices import PriceTable
from evalsup.rundir.checkpoint import JournalError
from evalsup.rundir.layout import RESULTS
from evalsup.rundir.usage import usage_of_results
from evalsup.tasks.headers import api_key, build_headers, key_source, request_headers
from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import TaskReader
from evalsup.tasks.requests import RequestDefaults, credentials, to_request
from evalsup.tasks.routes import CHAT, COMPLETIONS
from evalsup.tasks.tokens import Tally, figures, one_line

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


def estimate(tasks: Path, prices: PriceTable, defaults: RequestDefaults, *, base_url: str | None = None,
             headers: dict[str, str] | None = None, tokenize_max: int = 2000, run_dir: Path | None = None,
             shard: tuple[int, int] | None = None, max_line_bytes: int = 16 << 20) -> dict[str, Any]:
    """The estimate of ``tasks`` (see the module's doc) as a dict: ``Tally.summary`` plus how it was made.
    Raises EstimateError (a bad line: ``file:LINE: why``, as the run would refuse it)."""
    from evalsup.tasks.reader import TaskError

    try:
        done, seen = seen_lengths(run_dir)
    except JournalError as e:  # a damaged results.jsonl (evalsup repair)
        raise EstimateError(str(e)) from None
    tally = Tally(seen=seen)
    tok = Tokenizer(base_url, headers or {}) if base_url else None
    counted = approx_sum = 0  # the tokenizer's counts and the ≈ figures of the same requests: their ratio scales
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
                exact: int | None = None
                if tok is not None and not tok.absent and tally.exact < tokenize_max:
                    path, body, _ = to_request(obj, defaults)
                    tb = _tokenize_body(path, body)
                    exact = tok.count(tb) if tb is not None else None
                    if exact is not None:
                        counted += exact
                        approx_sum += f.approx_prompt
                scaled = None if exact is not None or not counted else round(f.approx_prompt * counted / approx_sum)
                tally.add(f, price.max_output if price else None, exact if exact is not None else scaled,
                          counted=exact is not None)
    except TaskError as e:
        raise EstimateError(str(e)) from None
    except OSError as e:
        raise EstimateError(f"{tasks}: {e.strerror}") from None
    finally:
        if tok is not None:
            tok.close()
    left = 1.0
    if done and tally.requests:
        left = max(0.0, (tally.requests - done) / tally.requests)
    out = tally.scaled(left).summary(prices.lookup) if left < 1.0 else tally.summary(prices.lookup)
    out.update({
        "tasks": str(tasks), "total_requests": tally.requests, "done": done, "prices": prices.describe(),
        "tokenizer": "none" if tok is None else ("absent (404): ≈ chars/4" if tok.absent and not counted else
                                                 f"{tok.path} ({tally.exact:,} counted"
                                                 + (", the rest scaled by their ratio)" if tally.exact < tally.requests
                                                    else ")")),
    })
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


def estimate_text(s: dict[str, Any]) -> str:
    """The estimate for a person: the one line, then a line a model."""
    lines = []
    head = f"estimate for {s['tasks']}"
    if s.get("done"):
        head += f" ({s['done']:,} of {s['total_requests']:,} done already: the figures are for the rest)"
    lines.append(head)
    lines.append("  " + one_line(s))
    for name, m in s["models"].items():
        p, c = m["prompt_tokens"], m["completion_tokens"]
        cost = m["cost_usd"]
        money = "no price (say it with --prices FILE, or --self-hosted)" if cost is None else \
            f"${cost['low']:,.4f} / ${cost['expected']:,.4f} / ${cost['high']:,.4f}"
        more = f"; {m['no_max_tokens']:,} without max_tokens (high assumes the model's largest answer)" \
            if m.get("no_max_tokens") else ""
        lines.append(f"  {name}: {m['requests']:,} requests; prompt {p['low']:,}/{p['expected']:,}/{p['high']:,}; "
                     f"completion {c['low']:,}/{c['expected']:,}/{c['high']:,}; cost {money}{more}")
    lines.append(f"  (low / expected / high; prompt tokens: {s['prompt_tokens_counted']}; tokenizer: "
                 f"{s['tokenizer']}; prices: {s['prices']})")
    return "\n".join(lines)
