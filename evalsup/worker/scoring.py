"""Running scorers in a worker: off the event loop (a thread pool), each call under --scorer-timeout.

A scorer that raises or times out gives that task an error score (``None``, with the exception's type and
message in ``score_errors``), never a crashed worker or a lost result; one that finds nothing to score (a task
without ``expected``) leaves it unscored (``Scored.unscored``). A timed-out call cannot be killed inside a
thread; it finishes in the background while the task moves on.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evalsup.scoring.scorers import Scored, ScorerOptions
from evalsup.scoring.selection import Loaded


class Scoring:
    """The run's ``--scorer`` list (the judge aside: ``worker.judge``) and the scorers tasks name themselves
    (``scoring.selection``): each task is scored by its own, else by the run's."""

    def __init__(self, specs: list[str], options: ScorerOptions, timeout_s: float, threads: int) -> None:
        self.loaded = Loaded(specs, options)
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="evalsup-scorer")

    def applies(self, task: dict[str, Any]) -> bool:
        """Whether a scorer other than the judge scores this task (else no thread is woken for it)."""
        return bool(self.loaded.for_task(task))

    async def score(self, task: dict[str, Any], body: Any) -> Scored:
        loop = asyncio.get_running_loop()
        out = Scored({}, {}, [])
        for name, fn in self.loaded.for_task(task):
            try:
                value = await asyncio.wait_for(loop.run_in_executor(self.pool, fn, task, body), self.timeout_s)
            except TimeoutError:
                out.fail(name, f"TimeoutError: the scorer took longer than --scorer-timeout {self.timeout_s:g}s")
                continue
            except Exception as e:
                out.fail(name, f"{type(e).__name__}: {e}")
                continue
            out.take(name, value)
        return out
