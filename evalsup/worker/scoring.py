"""Running scorers in a worker: off the event loop (a thread pool), each call under --scorer-timeout.

A scorer that raises or times out gives that task an error score (``None``, with the exception's type and
message in ``score_errors``), never a crashed worker or a lost result. A timed-out call cannot be killed
inside a thread; it finishes in the background while the task moves on.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evalsup.scoring.scorers import ScoreFn, ScorerOptions, load_scorer, to_scores


class Scoring:
    def __init__(self, specs: list[str], options: ScorerOptions, timeout_s: float, threads: int) -> None:
        self.scorers: list[tuple[str, ScoreFn]] = [load_scorer(s, options) for s in specs]
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="evalsup-scorer")

    async def score(self, task: dict[str, Any], body: Any) -> tuple[dict[str, float | None], dict[str, str]]:
        loop = asyncio.get_running_loop()
        scores: dict[str, float | None] = {}
        errors: dict[str, str] = {}
        for name, fn in self.scorers:
            try:
                value = await asyncio.wait_for(loop.run_in_executor(self.pool, fn, task, body), self.timeout_s)
                scores.update(to_scores(name, value))
            except TimeoutError:
                scores[name] = None
                errors[name] = f"TimeoutError: the scorer took longer than --scorer-timeout {self.timeout_s:g}s"
            except Exception as e:
                scores[name] = None
                errors[name] = f"{type(e).__name__}: {e}"[:500]
        return scores, errors

