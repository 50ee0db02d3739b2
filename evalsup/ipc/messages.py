"""The typed contract at the process boundary: what each frame's payload holds, and the worker's config.

Frames are ``ipc.frames.FrameKind`` + payload. The meta of TASK and RESULT frames keeps short keys on the wire
(they cross the pipe once per task); the TypedDicts below name and explain each. The worker's settings cross
as one CONFIG frame, a dict of ``WorkerConfig``'s fields, and are rebuilt into the frozen dataclass on the
worker's side (``WorkerConfig.from_wire``): the defaults live here and nowhere else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any, NotRequired, TypedDict


class TaskMeta(TypedDict):
    """supervisor -> worker, before the task line's bytes."""

    k: int  # key: the task line's byte offset in the input (unique in the run)
    n: int  # line number (1-based), for messages


class ResultMeta(TypedDict):
    """worker -> supervisor, before the finished output line's bytes (or with ``sh`` and no bytes)."""

    k: int  # the task's key
    ok: bool  # the record has no error
    lat: float  # seconds the last attempt took at the server, request written to last byte: the record's
    #             metrics.latency_s and summary.json's latency_s; not the task's whole time (metrics.total_s)
    att: int  # attempts counted against --max-attempts
    rt: int  # requests re-sent: retries, 429 waits and requests parked through an outage
    rb: int  # bytes of the response body (the memory budget learns response sizes from it)
    ec: str | None  # the record's error code, or None
    ttft: float | None  # time to first token of a streamed answer
    pt: int  # prompt tokens (usage)
    ct: int  # completion tokens (usage)
    sc: dict[str, Any] | None  # scores by scorer name
    us: NotRequired[list[str]]  # the scorers that left the task unscored (no 'expected'): counted apart
    chk: NotRequired[int]  # present: a large body checked by simdjson rather than built (worker.bodies)
    sh: NotRequired[list[int]]  # [position, length] of the line in the worker's shared-memory ring
    ep: NotRequired[int]  # the endpoint that served the last attempt (its index in WorkerConfig.endpoints)
    st: NotRequired[int]  # attempts abandoned as stalled (timeout_stall, on the supervisor's STALL); absent: 0
    g: NotRequired[str]  # the task's group (--group-by metadata.KEY): its scores are counted per group too
    rk: NotRequired[int]  # re-asks for an answer that failed --response-schema (metrics.reasks); absent: 0
    rpt: NotRequired[int]  # the prompt tokens of the answers asked again (metrics.reask_usage), beside ``pt``
    rct: NotRequired[int]  # their completion tokens
    hg: NotRequired[int]  # hedged (--hedge): 1, the first copy's answer is the record; 2, the second's; absent: not
    jpt: NotRequired[int]  # the judge's prompt tokens for this task (--scorer judge), apart from ``pt``
    jct: NotRequired[int]  # the judge's completion tokens
    cr: NotRequired[int]  # prompt tokens read from the provider's prompt cache, part of ``pt`` (priced apart)
    cw: NotRequired[int]  # prompt tokens written to the provider's prompt cache, part of ``pt``
    w1: NotRequired[int]  # of them, those kept an hour (Anthropic's 1-hour cache writes: their own rate)
    md: NotRequired[str]  # the model the response names, when not the request's (priced by it when it has a price)
    tr: NotRequired[str]  # the service tier the answer is billed at (the response's, else the request's)
    bt: NotRequired[int]  # 1: a provider batch's answer (record's metrics.batch), billed at the batch API's rates
    # the cache (issue 30): "h" answered from it, "m" not; ``ch`` the key hit (hex), ``ck`` an answer to keep:
    # [key hex, offset of the body in the line, its length, request id, model, path] (evalsup.cache.feed)
    ca: NotRequired[str]
    ch: NotRequired[str]
    ck: NotRequired[list[Any]]
    cm: NotRequired[str | None]  # a hit's model (the summary's tokens saved by model)
    cu: NotRequired[str]  # a miss whose entry failed an answer's checks (damaged, no answer): why (issue 39)


class Heartbeat(TypedDict):
    inflight: int  # requests begun and not answered (on the wire, or waiting to retry)
    wire: int  # requests on the wire (what the endpoint counts)
    limit: int  # requests it may have in flight now (its adaptive limit under the supervisor's cap)
    queued: int  # tasks held and not begun
    parked: int  # requests parked by the breaker
    done: int
    retries: int
    eps: list[list[int]] | None  # with several endpoints: [its limit, requests on the wire to it] each (issue 21)
    # the oldest requests on the wire (at most ``WIRE_TOP``), oldest first, each an ``OnWire`` row:
    # [task key, endpoint index, seconds on the wire, attempt, bytes received so far, 1 if a hedge's second copy
    # else 0] (issue 28; an older worker's rows lack the last)
    old: NotRequired[list[list[float]]]
    # a low adaptive limit (issue 41): [why, in words ("latency 3.1x its baseline"), the --concurrency that
    # served answers at least 1.5x as fast by the worker's own measurements, or 0]; absent when not low
    why: NotRequired[list[Any]]


WIRE_TOP = 5  # requests on the wire a heartbeat names (the oldest), and `evalsup status` shows


class Stall(TypedDict):
    age: float  # STALL: abandon every attempt on the wire for at least this many seconds, and retry it


class Ready(TypedDict):
    pid: int
    concurrency: int


class Trip(TypedDict):
    reason: str  # why the worker thinks the endpoint is down
    e: int  # which endpoint (its index in WorkerConfig.endpoints)


class ProbeResult(TypedDict):
    ok: bool
    detail: str
    e: int  # the endpoint probed


class Probe(TypedDict):
    e: int  # PROBE: check this endpoint with a request of the worker's own


class BreakerOpen(TypedDict):
    e: int  # BREAKER_OPEN: this endpoint is ejected (the worker sends it nothing)
    out: NotRequired[bool]  # left out for the whole run (failed the connection check, refused the key): never probed


class Returned(TypedDict):
    keys: list[int]  # tasks handed back unbegun on DRAIN


class Message(TypedDict):
    message: str  # FATAL: why the worker cannot go on; AUTH: what the endpoint said when it refused the key


class Auth(Message):
    e: NotRequired[int]  # AUTH: the endpoint that refused it (0 when there is one)


class Leaks(TypedDict):
    text: str  # LEAKS: top allocation sites (tracemalloc)


class Limit(TypedDict):
    inflight: int  # LIMIT: cap on requests in flight in this worker
    judge: NotRequired[int]  # its share of --judge-concurrency (--scorer judge), as workers are added


class Rate(TypedDict):
    rps: float | None  # RATE: this worker's share of the global limits
    tpm: float | None
    arrivals: str  # "uniform" | "poisson"
    # and of each endpoint's own (--max-requests-per-s URL=N): {"index": [rps, tpm]}, only those that have one
    eps: NotRequired[dict[str, list[float | None]]]


class BreakerClose(TypedDict):
    was_down: bool  # a probe failed while open: parked attempts are not counted against --max-attempts
    e: int  # the endpoint that rejoins


class Drain(TypedDict):
    report: bool  # DRAIN: send LEAKS before exiting


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs; sent to it as the CONFIG frame (never holds the API key itself)."""

    base_url: str  # the first endpoint (see ``endpoints``)
    concurrency: int
    limit: int | None = None  # requests it may have in flight at first (None: its concurrency)
    api_key_env: str = "OPENAI_API_KEY"
    api_key_file: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False
    max_attempts: int = 8
    max_retry_wait_s: float = 60.0
    max_rate_limited_s: float = 1800.0  # the most a task may wait on 429s (then a rate_limited record)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    total_timeout_s: float = 600.0
    max_response_mb: float = 64.0
    heartbeat_s: float = 1.0
    insecure: bool = False
    trace_memory: bool = False
    plugin: str | None = None  # module:function called on each finished task (tests, hooks)
    scorers: tuple[str, ...] = ()
    scorer_timeout_s: float = 30.0
    scorer_threads: int = 4
    score_strip: bool = True
    score_ignore_case: bool = False
    score_pattern: str | None = None
    score_normalize: bool = False  # exact_match/contains/regex: SQuAD's normalize_answer on both sides
    ring_fd: int | None = None  # the shared-memory ring for large result lines (ipc.ring), if any
    ring_size: int = 0
    # adaptive concurrency, server signals, headers (issue 21): see evalsup.worker.adaptive
    adaptive: bool = False  # no --concurrency: the worker's limit moves between 1 and its concurrency
    adaptive_start: int = 0  # a replacement starts from its predecessor's limit (0: slow start)
    server_metrics: str | None = None  # --server-metrics URL; None: try the server root's /metrics; "off"
    headers: tuple[str, ...] = ()  # --header specs, resolved by each side (evalsup.tasks.headers), never values
    # many endpoints (issue 21 item 1): every --base-url, in the order given; () means just base_url
    base_urls: tuple[str, ...] = ()
    group_by: str | None = None  # --group-by metadata.KEY: each RESULT names its task's group (meta "g")
    # --response-schema (its JSON schema, loaded and checked before the start) and --max-reasks
    response_schema: dict[str, Any] | None = None
    max_reasks: int = 2
    validate_schema: bool = True  # --no-validate-schema: a task's own response_format schema is not validated
    # --hedge (issue 28): a request this many times the worker's p95 old gets a second copy in the run's tail
    hedge: bool = False
    hedge_factor: float = 2.0
    # the model-graded scorer (--scorer judge): its endpoint of its own, model, key's variable (never the key;
    # None: the answers' key), template's text (None: the default, evalsup.scoring.judge) and limits
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_api_key_env: str | None = None
    judge_template: str | None = None
    judge_concurrency: int = 16  # --judge-concurrency, the run's; CONFIG at spawn: this worker's share of it
    judge_timeout_s: float = 900.0  # the most one task's judging may take (attempts, outages); then a scorer error
    judge_max_tokens: int | None = None
    # the answer cache (issue 30, evalsup.cache): its directory (None: off), --cache-mode, --cache-model-id,
    # --cache-salt, --cache-length
    cache_dir: str | None = None
    cache_mode: str = "rw"
    cache_model_id: str | None = None
    cache_salt: str = ""
    cache_length: bool = False
    # the Batch API (issue 31): set, the supervisor starts evalsup.batch's driver in the workers' place
    batch: dict[str, Any] | None = None

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every endpoint's base URL; an endpoint's index here is its number in frames, records and logs."""
        return self.base_urls or (self.base_url,)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> WorkerConfig:
        """Rebuild from a CONFIG frame; an unknown field is a protocol error (both sides are one version)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown worker config field(s): {', '.join(sorted(unknown))}")
        for name in ("scorers", "headers", "base_urls"):
            if name in d:
                d = {**d, name: tuple(d[name])}
        return cls(**d)
