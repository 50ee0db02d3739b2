"""One frozen configuration object for a run, its defaults, and sizing from the container's limit."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

DEFAULT_CONCURRENCY = 64
DEFAULT_MAX_CONCURRENCY = 256  # issue 21: the adaptive limit's ceiling without --max-concurrency
MIB = 1 << 20


class ConfigError(Exception):
    """A setting that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs; sent to it as the CONFIG frame (never holds the API key itself)."""

    base_url: str
    concurrency: int
    api_key_env: str = "OPENAI_API_KEY"
    api_key_file: str | None = None
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False
    max_attempts: int = 5
    max_retry_wait_s: float = 60.0
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
    # issue 21 (adaptive concurrency, server signals, headers): see evalsup.worker.adaptive
    adaptive: bool = False  # no --concurrency: each worker's limit moves between 1 and its share
    server_metrics: str | None = None  # --server-metrics URL; None: try the server root's /metrics
    headers: tuple[str, ...] = ()  # --header specs, resolved by each side (evalsup.headers), never values

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunConfig:
    tasks_path: Path
    run_dir: Path
    worker: WorkerConfig
    workers: int = 4  # with autoscale, the most there may be
    autoscale: bool = False  # start with one worker, add one while each is CPU-bound (supervisor.scaling)
    concurrency: int = DEFAULT_CONCURRENCY  # total requests in flight across all workers
    adaptive: bool = False  # issue 21: concurrency is then --max-concurrency, the most the limits may reach
    window: int = 0  # tasks outstanding per worker; 0 = 2 x its concurrency
    max_line_mb: float = 16.0
    on_invalid: Literal["error", "skip"] = "error"
    fresh: bool = False
    flush_interval_s: float = 1.0
    checkpoint_interval_s: float = 2.0
    grace_s: float = 20.0
    hang_timeout_s: float = 60.0
    max_task_crashes: int = 3
    max_restarts: int = 10
    quiet: bool = False
    json_summary: bool = False
    log_interval_s: float = 10.0
    log_format: Literal["text", "json"] = "text"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    shard: tuple[int, int] | None = None  # (K, N): only lines whose index is K mod N
    # the endpoint
    max_requests_per_s: float | None = None
    max_tokens_per_min: float | None = None
    arrivals: Literal["uniform", "poisson"] = "uniform"
    max_wait_down_s: float = 600.0
    check: bool = True
    # memory supervision
    monitor_interval_s: float = 0.5
    memory_limit: int | None = None  # bytes; overrides the cgroup's limit (or sets one where there is none)
    memory_high: int | None = None  # bytes; default high_frac of the effective limit
    high_frac: float = 0.85
    low_frac: float = 0.70
    psi_threshold: float = 10.0
    max_worker_rss: int | None = None  # bytes; default: a worker's share of the limit, or 1 GiB without one
    hard_rss_factor: float = 1.5
    max_tasks_per_worker: int | None = None
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


def resolve_base_url(flag: str | None) -> str:
    url = flag or os.environ.get("OPENAI_BASE_URL")
    if not url:
        raise ConfigError(
            "no endpoint: pass --base-url http://HOST:PORT/v1 or set OPENAI_BASE_URL "
            "(try `evalsup demo` for a run against the built-in mock endpoint)"
        )
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url must start with http:// or https://, got {url!r}")
    return url.rstrip("/")


def default_run_dir(tasks_path: Path, shard: tuple[int, int] | None = None) -> Path:
    name = tasks_path.name
    stem = name[: -len(".jsonl")] if name.endswith(".jsonl") else tasks_path.stem
    run_dir = tasks_path.with_name(stem + ".run")
    return run_dir / f"shard-{shard[0]}-of-{shard[1]}" if shard else run_dir


# (index variable, count variable) of the schedulers whose array jobs evalsup shards under
SHARD_ENV = (
    ("JOB_COMPLETION_INDEX", "EVALSUP_SHARDS", "Kubernetes Indexed Job"),
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "Slurm job array"),
    ("AWS_BATCH_JOB_ARRAY_INDEX", "AWS_BATCH_JOB_ARRAY_SIZE", "AWS Batch array job"),
)


def parse_shard(value: str | None, env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """--shard K/N, or "auto" from a scheduler's array-job variables."""
    if not value:
        return None
    env = dict(os.environ) if env is None else env
    if value == "auto":
        for idx_var, count_var, what in SHARD_ENV:
            if idx_var in env:
                if count_var not in env:
                    raise ConfigError(f"--shard auto: {idx_var} is set ({what}) but {count_var} is not; "
                                      f"set {count_var} to the number of shards")
                value = f"{env[idx_var]}/{env[count_var]}"
                break
        else:
            names = ", ".join(f"{i} with {c}" for i, c, _ in SHARD_ENV)
            raise ConfigError(f"--shard auto: no array-job variables found (looked for {names})")
    k_s, sep, n_s = value.partition("/")
    try:
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise ConfigError(f"--shard must be K/N (e.g. 0/4) or auto, got {value!r}") from None
    if not sep or n < 1 or not 0 <= k < n:
        raise ConfigError(f"--shard {value}: need 0 <= K < N")
    return k, n


WORKER_BASELINE = 100 * MIB  # what one idle worker costs (interpreter, aiohttp, uvloop), with headroom


def container_limit() -> tuple[int | None, str]:
    """The effective memory limit of this process's cgroup and where it came from."""
    from evalsup.supervisor.cgroup import CgroupProbe

    s = CgroupProbe.detect().sample()
    return s.limit_bytes, s.source


def default_workers(limit: int | None, cpus: int | None = None) -> int:
    """The most workers a run may have without --workers (it starts with one, see supervisor.scaling): 4,
    fewer when the CPUs or the memory limit cannot carry them (half the limit for baselines)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = min(4, max(1, 2 * cpus))
    if limit:
        n = min(n, max(1, int(limit * 0.5 // WORKER_BASELINE)))
    return n
