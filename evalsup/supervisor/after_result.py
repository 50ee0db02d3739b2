"""What a RESULT changes besides the ledger and the counts. No I/O, no clock: the arbiter appends the line,
counts it, then asks ``after_result`` and does what it says.

- ``wake``: the dispatcher is woken only when it has something to do: the worker has a refill's worth of free
  credits, the input is read to its end (the run may be over), a suspect waits for a worker, or a stop is
  under way;
- ``step``: the worker's task count (``policies.task_count_step``): ``"warm"`` starts its successor ahead,
  ``"recycle"`` drains it; nothing for a worker already being recycled;
- ``hold``: the journal's writer is behind (``backlog`` past ``backlog_high``) and results are not held yet:
  give the writer everything buffered and read no more results until it catches up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from evalsup.supervisor.policies import task_count_step

__all__ = ["AfterResult", "after_result"]


class Counted(Protocol):
    """What the decision reads of the worker that sent the result (its ``done`` already counts it)."""

    @property
    def credits(self) -> int: ...
    @property
    def refill(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def task_limit(self) -> int | None: ...
    @property
    def window(self) -> int: ...
    @property
    def recycling(self) -> bool: ...


@dataclass(frozen=True)
class AfterResult:
    wake: bool
    step: Literal["recycle", "warm"] | None
    hold: bool


def after_result(w: Counted, *, input_done: bool, suspects_waiting: bool, stopping: bool, backlog: int,
                 backlog_high: int, held: bool) -> AfterResult:
    wake = w.credits >= w.refill or input_done or suspects_waiting or stopping
    step = None if w.recycling else task_count_step(w.done, w.task_limit, w.window)
    return AfterResult(wake=wake, step=step, hold=backlog > backlog_high and not held)
