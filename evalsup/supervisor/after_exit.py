"""What a worker's exit leads to, once what it held is handed on. No I/O, no clock (time is passed in).

- a worker that could not start (it sent FATAL: its settings are wrong) stops the run, unless a stop is
  already under way;
- during a stop, or after an exit the arbiter asked for (drained, stopped, killed past the hard RSS limit:
  ``Exit.planned``), nothing more: a recycle's successor is already started;
- otherwise it is an unplanned restart (hung or crashed), counted against the restart intensity: past it
  the run stops, resumably, instead of crash-looping; else a successor is started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from evalsup.supervisor.policies import RestartIntensity
from evalsup.supervisor.workers import Exit

__all__ = ["AfterExit", "after_exit"]


@dataclass(frozen=True)
class AfterExit:
    step: Literal["stop_fatal", "nothing", "stop_crash_loop", "restart"]
    cause: Literal["hung", "crashed"] | None = None  # an unplanned restart's cause (counted, logged)


def after_exit(how: Exit, *, fatal: bool, stopping: bool, intensity: RestartIntensity, now: float) -> AfterExit:
    if fatal and not stopping:
        return AfterExit("stop_fatal")
    if stopping or how.planned:
        return AfterExit("nothing")
    cause: Literal["hung", "crashed"] = "hung" if how is Exit.HUNG else "crashed"
    return AfterExit("stop_crash_loop" if intensity.record(now) else "restart", cause)
