"""Knobs of the mock server, and how a live update (POST /_mock/config) is applied to them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MockConfig:
    latency_ms: float = 0.0  # mean latency per response
    jitter_ms: float = 0.0  # uniform +- jitter
    response_kb: float = 0.0  # pad the completion text so the JSON body is about this many KB (0 = short answer)
    fail_500: float = 0.0  # probability of a 500 JSON error
    fail_429: float = 0.0  # probability of a 429 with Retry-After header
    retry_after_s: float = 1.0
    reset: float = 0.0  # probability of a connection reset (abort the transport without response)
    malformed: float = 0.0  # probability of a 200 with a body that is not valid JSON
    cut_stream: float = 0.0  # probability of an answer cut midway (half the body or of the SSE events, then closed)
    # a share of requests answered after slow_ms instead of latency_ms (a replica with a stuck slot now and then):
    # exactly that share, evenly spaced in arrival order (every 4th at 0.25), so a test knows how many
    slow: float = 0.0
    slow_ms: float = 5000.0
    # the random 429s and 500s answered at once, before the latency, as a gateway's limiter does (llmock too)
    fast_refusals: bool = False
    seed: int = 0
    models: tuple[str, ...] = ("mock-model",)  # /v1/models; other models get 404 (an empty tuple accepts any)
    api_key: str | None = None  # when set, requests without "Authorization: Bearer <key>" get 401
    echo_headers_in_errors: bool = False  # error bodies include the request headers, their message its URL
    revoked: bool = False  # every /v1 request gets 401 invalid_api_key (a key revoked mid-run)
    revoke_after: int | None = None  # the key is revoked after this many /v1 requests (counted since start/reset)
    capacity: int = 0  # at most this many served at once (0: no limit; evalsup.mock.capacity)
    queue: int = 0  # with capacity: this many more wait in a FIFO; beyond them, 429 with Retry-After
    # a gateway's ways (issue 34): requests without "Authorization: Basic base64(user:password)" get 401
    basic_auth: str | None = None  # "user:password"
    api_key_header: str | None = None  # the header that carries api_key instead of Authorization (Azure: api-key)
    require_query: str | None = None  # "name=value&...": a /v1 or Azure request without each of them gets 404
    tokenize: bool = True  # serve POST /tokenize (vLLM's and SGLang's shape; issue 30); False: 404, as OpenAI
    # the provider's bill (issue 40): every answer generated is billed by model (tokens and answers), and by the
    # text of its request's first message (one key a task: a task billed twice shows); bounded only by the test
    bill: bool = False
    # the provider's prompt cache (issue 40): this share of every answer's prompt tokens is reported as read from
    # it (chat's and completions' ``prompt_tokens_details.cached_tokens``, the Responses API's
    # ``input_tokens_details.cached_tokens``), as a provider bills them at its cached-input rate; 0: no details
    cached: float = 0.0
    # this share of every answer's prompt tokens is reported as written to the provider's cache (chat's and
    # completions' ``prompt_tokens_details.cache_write_tokens``, the Responses API's ``input_tokens_details``'),
    # billed at its cache-write rate, whatever the request marked: a gateway that marks requests itself; 0: none
    written: float = 0.0
    # answers name the model asked with this suffix, as a provider names the dated snapshot that served an alias
    # (issue 40: "gpt-4o" answered as "gpt-4o-2024-08-06", billed by the snapshot's name); None: the model asked
    snapshot: str | None = None
    judge: bool = False  # grade requests from evalsup's judge template by a known rule (evalsup.mock.judge)
    # the Batch API (issue 31, evalsup.mock.batches)
    batch_step_ms: float = 50.0  # how long a batch stays validating, and finalizing
    batch_finalize_ms: float = 0.0  # a slow finalize: this much more in finalizing
    batch_retrieve_500: int = 0  # the next N GET /v1/batches/{id} answer 500
    batch_expire: int = 0  # the next N batches created expire after answering half of their lines
    batch_fail_validation: int = 0  # the next N batches created fail validation as a whole
    batch_queue_full: int = 0  # the next N batches created fail for the queue (token_limit_exceeded)
    batch_files_unlisted: bool = False  # GET /v1/files answers 405, as a gateway without that route (issue 39)
    batch_batches_unlisted: bool = False  # GET /v1/batches (the list, not one batch) answers 405 likewise


_FLOAT_FIELDS = frozenset(
    {"latency_ms", "jitter_ms", "response_kb", "fail_500", "fail_429", "retry_after_s", "reset", "malformed",
     "cut_stream", "slow", "slow_ms", "batch_step_ms", "batch_finalize_ms", "cached", "written"}
)
_PROBABILITIES = frozenset({"fail_500", "fail_429", "reset", "malformed", "cut_stream", "slow", "cached",
                            "written"})
FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(MockConfig))


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number")
    out = float(value)
    if out < 0 or out != out:
        raise ValueError(f"{name} must be >= 0")
    if name in _PROBABILITIES and out > 1:
        raise ValueError(f"{name} is a probability and must be <= 1")
    return out


def apply_update(cfg: MockConfig, updates: dict[str, Any]) -> MockConfig:
    """Return cfg with the given fields replaced, validating their types. Raises ValueError."""
    changes: dict[str, Any] = {}
    for name, value in updates.items():
        if name not in FIELD_NAMES:
            raise ValueError(f"unknown config field {name!r}")
        if name in _FLOAT_FIELDS:
            changes[name] = _as_float(name, value)
        elif name in ("capacity", "queue", "batch_retrieve_500", "batch_expire", "batch_fail_validation",
                      "batch_queue_full"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0")
            changes[name] = value
        elif name == "seed":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError("seed must be an integer")
            changes[name] = value
        elif name == "models":
            if isinstance(value, str) or not isinstance(value, list | tuple):
                raise ValueError("models must be a list of strings")
            if not all(isinstance(m, str) for m in value):
                raise ValueError("models must be a list of strings")
            changes[name] = tuple(value)
        elif name in ("api_key", "basic_auth", "api_key_header", "require_query", "snapshot"):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string or null")
            if name == "basic_auth" and value is not None and ":" not in value:
                raise ValueError("basic_auth must be 'user:password'")
            changes[name] = value
        elif name in ("echo_headers_in_errors", "revoked", "tokenize", "judge", "fast_refusals", "bill",
                      "batch_files_unlisted", "batch_batches_unlisted"):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a boolean")
            changes[name] = value
        elif name == "revoke_after":
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError("revoke_after must be a non-negative integer or null")
            changes[name] = value
    return dataclasses.replace(cfg, **changes)


def config_to_json(cfg: MockConfig) -> dict[str, Any]:
    out = dataclasses.asdict(cfg)
    out["models"] = list(cfg.models)
    return out
