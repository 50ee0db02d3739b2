"""One frozen configuration object for a run, its defaults, and sizing from the container's limit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from evalsup.ipc.messages import WorkerConfig

DEFAULT_CONCURRENCY = 64
MIB = 1 << 20

__all__ = ["ConfigError", "RunConfig", "WorkerConfig"]


class ConfigError(Exception):
    """A setting that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True)
class RunConfig:
    tasks_path: Path
    run_dir: Path
    worker: WorkerConfig
    workers: int = 4  # with autoscale, the most there may be
    autoscale: bool = False  # start with one worker, add one while each is CPU-bound (supervisor.scaling)
    concurrency: int = DEFAULT_CONCURRENCY  # total requests in flight across all workers
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


def parse_shard(value: str | None, env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """--shard K/N, or "auto" from a scheduler's array-job variables (evalsup.shards)."""
    from evalsup.shards import ShardError
    from evalsup.shards import parse_shard as parse

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
