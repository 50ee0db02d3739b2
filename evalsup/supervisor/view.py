"""What the progress display and the summary may read of a run: ``RunView``, built by the arbiter
(``Supervisor.view``) at the moment it is asked for. A read-only picture: the rooms that show figures
(``progress.snapshot``, ``summary.build_summary``) never see the arbiter itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from evalsup.supervisor.endpoints import Endpoints
from evalsup.supervisor.stats import RunStats

__all__ = ["MemoryFigures", "Rate", "RunView", "WorkerFigures"]


class Rate(Protocol):
    """Results a second over a sliding window of running time (``progress.RateWindow``): each call adds a
    sample; ``paused_s`` is the session's time paused so far, taken off the clock."""

    def rate(self, now: float, count: int, paused_s: float = 0.0) -> float: ...


class WorkerFigures(Protocol):
    """A worker's figures from its last heartbeat and memory sample (``WorkerHandle`` has them)."""

    rss: int
    wire: int  # requests on the wire
    conc_limit: int  # its concurrency limit now (adaptive or its share)
    ep_load: list[list[int]] | None  # several endpoints: [limit, on the wire] each
    limit_why: list[Any] | None  # a low adaptive limit: [why, a --concurrency to try or 0] (issue 41)

    @property
    def alive(self) -> bool: ...


class MemoryFigures(Protocol):
    """The memory control's figures (``MemoryControl``)."""

    last_ws: int  # the working set last sampled (bytes; 0 before the first sample)
    limit: int | None

    def summary(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RunView:
    state: str  # "running", "throttled", "waiting for endpoint", "waiting for budget",
    # "waiting for a first answer's price", "draining" or "stopping"
    stats: RunStats
    rate: Rate
    in_flight: int  # tasks held by workers, queued in them or begun (TaskLedger.in_flight)
    total: int | None  # the input's lines (of this shard) counted so far; None until counted
    workers: tuple[WorkerFigures, ...]
    memory: MemoryFigures | None  # None until the run directory is open
    endpoints: Endpoints
    active: int  # worker slots in use (grows with autoscale)
    first_workers: int
    max_workers: int  # --workers
    autoscale: bool
    concurrency: int
    adaptive: bool
    run_dir: Path
    finished: bool  # every task has its record
    stop_message: str  # why the run stopped early ("" if it did not)
    cache: dict[str, Any] | None = None  # the cache's writes this session (evalsup.cache.feed), None: no cache
    budget: dict[str, Any] | None = None  # with a cap (issue 30): supervisor.budget.Budget.to_json
    # the run's price table (config.prices.PriceTable.lookup): what the cache's hits would have cost
    price_of: Callable[[str], Any] | None = None
    prices: dict[str, Any] | None = None  # the sources that priced the run (config.prices.PriceTable.to_json)
