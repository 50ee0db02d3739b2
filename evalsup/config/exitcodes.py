"""The process exit codes of evalsup, in one place: what a scheduler (Slurm, Kubernetes, a shell script) acts on.

0 only when every task has its record. 75 (``EX_TEMPFAIL``) for every stop that a rerun of the same command
resumes: nothing is lost and nothing done is redone. 2 for input or settings a rerun would meet again. 73 when
another evalsup holds the run directory. Documented in docs/operations.md ("Exit codes").
"""

from __future__ import annotations

from typing import Any

OK = 0  # every task has its record (failed requests are records too)
FAILED = 1  # could not go on, and a rerun alone will not fix it (merge incomplete, report error, a bug)
BAD_INPUT = 2  # bad input or settings: fix them, then rerun
LOCKED = 73  # another evalsup holds the run directory's lock: nothing was touched
RESUMABLE = 75  # stopped before the end (signal, endpoint down, crash loop, disk full...): rerun to resume

_REASONS = {OK: "done", FAILED: "failed", BAD_INPUT: "bad input or settings", LOCKED: "run directory in use",
            RESUMABLE: "stopped, resumable"}


def describe(code: int) -> dict[str, Any]:
    """The fields that say which exit a run took, for ``--json`` and ``summary.json``."""
    return {"exit_code": code, "resumable": code == RESUMABLE, "exit_reason": _REASONS.get(code, "failed")}
