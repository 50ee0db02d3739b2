"""One frozen configuration object for a run, its defaults, and sizing from the container's limit."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from evalsup.config.options import DEFAULTS as OPT  # every run option's default, defined once (options.py)
from evalsup.config.ratelimits import EndpointRate, RateLimitError, parse_rate_limits
from evalsup.config.shards import shard_dir_name
from evalsup.ipc.messages import WorkerConfig
from evalsup.tasks.requests import public_url

DEFAULT_MAX_CONCURRENCY: int = OPT["max_concurrency"]  # the adaptive limit's ceiling without --max-concurrency
MIB = 1 << 20

__all__ = ["ConfigError", "RunConfig", "WorkerConfig"]


class ConfigError(Exception):
    """A setting that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True)
class RunConfig:
    """A run's settings. Those that are options take their defaults from evalsup/config/options.py (build_config
    fills them all from there); the rest are internal tunings."""

    tasks_path: Path
    run_dir: Path
    worker: WorkerConfig
    workers: int = 4  # with autoscale, the most there may be
    autoscale: bool = False  # start with one worker, add one while each is CPU-bound (supervisor.scaling)
    # total requests in flight across all workers: --concurrency, or when adaptive (no --concurrency) the most
    # the workers' adaptive limits may reach together (--max-concurrency)
    concurrency: int = DEFAULT_MAX_CONCURRENCY
    adaptive: bool = False  # without --concurrency each worker's limit adapts (evalsup.worker.adaptive)
    # --retry-failed: error codes whose records are taken out and their tasks sent again (empty: every error;
    # None: no retry), see evalsup.rundir.rewrite; --accept-changed-settings: resume across changed request settings
    retry_failed: frozenset[str] | None = None
    accept_changed_settings: bool = False
    window: int = OPT["window"]  # tasks outstanding per worker; 0 = 2 x its concurrency
    max_line_mb: float = OPT["max_line_mb"]
    on_invalid: Literal["error", "skip"] = OPT["on_invalid"]
    fresh: bool = OPT["fresh"]
    flush_interval_s: float = 1.0
    checkpoint_interval_s: float = 2.0
    grace_s: float = OPT["grace"]
    hang_timeout_s: float = OPT["hang_timeout"]
    stall_after_s: float = OPT["stall_after"]  # issue 28: no result this long, requests on the wire: STALL
    max_task_crashes: int = OPT["max_task_crashes"]
    max_restarts: int = OPT["max_restarts"]
    quiet: bool = OPT["quiet"]
    json_summary: bool = OPT["json_summary"]
    log_interval_s: float = OPT["log_interval"]
    log_format: Literal["text", "json"] = OPT["log_format"]
    metrics_port: int | None = OPT["metrics_port"]
    metrics_host: str = OPT["metrics_host"]
    shard: tuple[int, int] | None = None  # (K, N): only lines whose index is K mod N
    # the endpoint
    max_requests_per_s: float | None = None  # the global rate limits (evalsup.config.ratelimits parses the options)
    max_tokens_per_min: float | None = None
    endpoint_rates: tuple[EndpointRate, ...] = ()  # limits of single endpoints (URL=N), see evalsup.config.ratelimits
    arrivals: Literal["uniform", "poisson"] = OPT["arrivals"]
    max_wait_down_s: float = OPT["max_wait_down"]
    check: bool = OPT["check"]
    # memory supervision
    monitor_interval_s: float = OPT["monitor_interval"]
    memory_limit: int | None = None  # bytes; overrides the cgroup's limit (or sets one where there is none)
    memory_high: int | None = None  # bytes; default high_frac of the effective limit
    high_frac: float = 0.85
    low_frac: float = 0.70
    psi_threshold: float = 10.0
    max_worker_rss: int | None = None  # bytes; default: a worker's share of the limit, or 1 GiB without one
    hard_rss_factor: float = 1.5
    max_tasks_per_worker: int | None = OPT["max_tasks_per_worker"]
    max_tasks_jitter: int = 0

    @property
    def max_line_bytes(self) -> int:
        return int(self.max_line_mb * MIB)

    @property
    def first_workers(self) -> int:
        """How many workers a run starts with."""
        return 1 if self.autoscale else self.workers

    def per_worker_concurrency(self, workers: int | None = None) -> list[int]:
        """Split the total concurrency evenly among ``workers`` (default: all; the first take the remainder)."""
        n = workers or self.workers
        base, rest = divmod(self.concurrency, n)
        return [base + (1 if i < rest else 0) for i in range(n)]

    def window_for(self, concurrency: int) -> int:
        return self.window if self.window > 0 else max(2, 2 * concurrency)


def build_config(tasks: Path, given: dict[str, Any]) -> RunConfig:
    """The RunConfig of a run of ``tasks`` with the options ``given`` (keys of evalsup.config.options.RUN_OPTIONS; the
    rest take their defaults). An explicit value is used as given: 0 is 0. Raises ConfigError."""
    from evalsup.config.options import with_defaults

    kw = with_defaults(given)
    if kw["retry_failed"] is not None and kw["fresh"]:  # refused before --fresh moves anything aside
        raise ConfigError("--retry-failed needs the run to retry; it cannot go with --fresh")
    urls = resolve_base_urls(kw["base_url"])  # many endpoints (issue 21 item 1)
    if len(urls) > 1 and kw["server_metrics"] not in (None, "off"):
        raise ConfigError("--server-metrics URL names one server; with several --base-url each endpoint's own "
                          "/metrics is read (or give --server-metrics off)")
    try:  # global (N) or per endpoint (URL=N), issue 21 item 1
        rates = parse_rate_limits(kw["max_requests_per_s"], kw["max_tokens_per_min"], urls)
    except RateLimitError as e:
        raise ConfigError(str(e)) from None
    wc = WorkerConfig(
        base_url=urls[0], base_urls=urls, concurrency=0, api_key_env=kw["api_key_env"],
        api_key_file=None if kw["api_key_file"] is None else str(kw["api_key_file"]),
        model=kw["model"], max_tokens=kw["max_tokens"], temperature=kw["temperature"],
        max_attempts=kw["max_attempts"], max_rate_limited_s=kw["max_rate_limited_wait"],
        connect_timeout_s=kw["connect_timeout"],
        read_timeout_s=kw["read_timeout"], total_timeout_s=kw["timeout"],
        max_response_mb=kw["max_response_mb"], insecure=kw["insecure"], plugin=kw["worker_plugin"],
        trace_memory=kw["trace_memory"], stream=kw["stream"],
        scorers=tuple(kw["scorers"]), scorer_timeout_s=kw["scorer_timeout"],
        score_strip=not kw["no_strip"], score_ignore_case=kw["ignore_case"], score_pattern=kw["regex"],
        score_normalize=kw["normalize"],
        adaptive=kw["concurrency"] is None, server_metrics=kw["server_metrics"], headers=tuple(kw["headers"]),
    )
    _check_requests(wc)
    adaptive = wc.adaptive  # without --concurrency each worker's limit adapts (issue 21)

    def mb(name: str) -> int | None:
        v = kw[name]
        return None if v is None else int(v * MIB)
    workers = kw["workers"]
    autoscale = workers is None
    if workers is None:
        from evalsup.config.cgroup import container_limit

        limit = mb("memory_limit_mb")
        workers = default_workers(container_limit()[0] if limit is None else limit)
        # no more workers than requests in flight: each holds at least one, so -c 1 would mean 4 on the wire
        workers = min(workers, kw["max_concurrency"] if adaptive else kw["concurrency"])
    shard = parse_shard(kw["shard"])
    run_dir = run_dir_of(tasks, kw["out"], shard)
    window = kw["window"]
    if kw["batch_api"] or kw["batch_cancel"]:  # one batch driver in the workers' place (issue 31)
        if kw["batch_poll_interval"] <= 0 or kw["batch_poll_max"] < kw["batch_poll_interval"]:
            raise ConfigError("--batch-poll-interval must be above 0 and at most --batch-poll-max")
        wc = dataclasses.replace(wc, batch={
            "run_dir": str(run_dir), "max_requests": kw["batch_max_requests"],
            "max_bytes": kw["batch_max_bytes"], "poll_s": kw["batch_poll_interval"],
            "poll_max_s": kw["batch_poll_max"], "fallback": kw["batch_fallback"], "cancel": kw["batch_cancel"],
            "completion_window": "24h"})
        workers, autoscale = 1, False
        # the driver holds up to two chunks' tasks (one filling while one runs)
        window = window or min(200_000, 2 * kw["batch_max_requests"])
    per_worker = None if wc.batch is not None else kw["max_tasks_per_worker"]  # a driver is not recycled by count
    jitter = kw["max_tasks_jitter"]
    return RunConfig(
        tasks_path=tasks, run_dir=run_dir,
        worker=wc, workers=workers, shard=shard, autoscale=autoscale and workers > 1,
        concurrency=max(kw["max_concurrency"] if adaptive else kw["concurrency"], workers), adaptive=adaptive,
        window=window, max_line_mb=kw["max_line_mb"],
        on_invalid=kw["on_invalid"], fresh=kw["fresh"], grace_s=kw["grace"], hang_timeout_s=kw["hang_timeout"],
        stall_after_s=kw["stall_after"],
        max_task_crashes=kw["max_task_crashes"], max_restarts=kw["max_restarts"], quiet=kw["quiet"],
        json_summary=kw["json_summary"], memory_limit=mb("memory_limit_mb"), memory_high=mb("memory_high_mb"),
        max_worker_rss=mb("max_worker_rss_mb"), max_tasks_per_worker=per_worker,
        max_tasks_jitter=int(jitter) if jitter is not None else int(per_worker or 0) // 10,
        monitor_interval_s=kw["monitor_interval"], max_requests_per_s=rates.rps, max_tokens_per_min=rates.tpm,
        endpoint_rates=rates.endpoints, arrivals=kw["arrivals"], max_wait_down_s=kw["max_wait_down"],
        check=kw["check"], log_interval_s=kw["log_interval"], log_format=kw["log_format"],
        metrics_port=kw["metrics_port"], metrics_host=kw["metrics_host"],
        retry_failed=retry_failed_codes(kw["retry_failed"]), accept_changed_settings=kw["accept_changed_settings"],
    )


RETRY_CODES = re.compile(r"^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$")


def retry_failed_codes(value: str | None) -> frozenset[str] | None:
    """--retry-failed's value, parsed here only: "*" (the flag alone) for every error code (an empty set), or
    CODE[,CODE...]; None without the flag."""
    if value is None:
        return None
    return frozenset() if value == "*" else frozenset(c for c in value.split(",") if c)


def retry_failed_task_file(tasks: Path | None, value: str | None) -> tuple[Path | None, str | None]:
    """`run --retry-failed tasks.jsonl`: the option's value is optional, so the task file may come as its
    value. Then (that file, "*"): the flag alone; else (tasks, value) unchanged, to be parsed by
    retry_failed_codes."""
    if value is not None and tasks is None and value != "*" and not RETRY_CODES.match(value):
        return Path(value), "*"
    return tasks, value


def _check_requests(w: WorkerConfig) -> None:
    """What would keep a request from being sent stops the run before it starts, never showing a value: a
    --header that cannot be used, a --base-url that cannot be requested, or two sources for the Authorization
    header (a URL's user:password@ and the API key, or a --header Authorization; issue 34)."""
    from evalsup.tasks.headers import HeaderError, api_key, build_headers, key_source, request_headers
    from evalsup.tasks.requests import url_problem

    for url in w.endpoints:
        problem = url_problem(url)
        if problem is not None:
            raise ConfigError(f"--base-url {public_url(url)} {problem}")
    try:
        common = build_headers(w.headers)
        try:
            key = api_key(w.api_key_env, w.api_key_file)
        except OSError:  # (the key file is read, and its error said, where the key is used)
            key = None
        for url in w.endpoints:
            request_headers(url, common, key, key_source(w.api_key_env, w.api_key_file))
    except HeaderError as e:
        raise ConfigError(str(e)) from None


def resolve_base_url(flag: str | None) -> str:
    """One endpoint: --base-url or $OPENAI_BASE_URL (the first of a list)."""
    return resolve_base_urls(flag)[0]


def resolve_base_urls(flags: str | Sequence[str] | None) -> tuple[str, ...]:
    """Every endpoint, in the order given: each --base-url, else $OPENAI_BASE_URL (a comma-separated list)."""
    given = [flags] if isinstance(flags, str) else list(flags or ())
    if not given:
        given = [u for u in os.environ.get("OPENAI_BASE_URL", "").split(",") if u.strip()]
    if not given:
        raise ConfigError(
            "no endpoint: pass --base-url http://HOST:PORT/v1 or set OPENAI_BASE_URL "
            "(try `evalsup demo` for a run against the built-in mock endpoint)"
        )
    urls: list[str] = []
    for url in given:
        url = url.strip()
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url must start with http:// or https://, got {public_url(url)!r}")
        url = url.rstrip("/")
        if url in urls:
            raise ConfigError(f"--base-url {public_url(url)} is given twice")
        urls.append(url)
    return tuple(urls)


RUN_DIR_SUFFIX = ".run"  # TASKS.jsonl -> TASKS.run (evalsup.rundir.layout lists it with the rest)


def run_dir_of(tasks: Path, out: str | Path | None, shard: str | tuple[int, int] | None) -> Path:
    """The run directory: --out, else TASKS.run beside the task file (its shard-K-of-N/ under --shard, given as
    parsed or as the option's text). Raises ConfigError for a bad --shard."""
    if out is not None:
        return Path(out)
    return default_run_dir(tasks, parse_shard(shard) if isinstance(shard, str) else shard)


def default_run_dir(tasks_path: Path, shard: tuple[int, int] | None = None) -> Path:
    name = tasks_path.name
    for ext in (".jsonl.gz", ".jsonl.zst", ".jsonl"):  # tasks.jsonl.gz -> tasks.run
        if name.endswith(ext):
            stem = name[: -len(ext)]
            break
    else:
        stem = tasks_path.stem
    run_dir = tasks_path.with_name(stem + RUN_DIR_SUFFIX)
    return run_dir / shard_dir_name(*shard) if shard else run_dir


def parse_shard(value: str | None, env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """--shard K/N, or "auto" from a scheduler's array-job variables (evalsup.config.shards)."""
    from evalsup.config.shards import ShardError
    from evalsup.config.shards import parse_shard as parse

    try:
        return parse(value, dict(os.environ) if env is None else env)
    except ShardError as e:
        raise ConfigError(str(e)) from None


WORKER_BASELINE = 100 * MIB  # what one idle worker costs (interpreter, aiohttp, uvloop), with headroom


def default_workers(limit: int | None, cpus: int | None = None) -> int:
    """The most workers a run may have without --workers (it starts with one, see supervisor.scaling): 4,
    fewer when the CPUs or the memory limit cannot carry them (half the limit for baselines)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = min(4, max(1, 2 * cpus))
    if limit:
        n = min(n, max(1, int(limit * 0.5 // WORKER_BASELINE)))
    return n
