"""The pre-scan's verdict (issue 28): may the run start, and what does a person read? No I/O, no clock.

The scan itself (``evalsup.tasks.prescan``) reads the file before the endpoint check and before any worker
starts; this room turns what it found into a verdict the arbiter acts on: refuse (exit 2, one line; nothing is
sent), or go, with at most one line to say (how many bad lines ``--on-invalid skip`` will skip).
"""

from __future__ import annotations

from dataclasses import dataclass

from evalsup.tasks.prescan import Scan
from evalsup.tasks.reader import TaskError

FIX = "fix that line and rerun, or rerun with --on-invalid skip to record bad lines in invalid.jsonl and go on"


def bad_line(e: TaskError) -> str:
    """The one line for a bad task line: ``file:LINE: what is wrong`` and what to do about it."""
    return f"{e}  ({FIX})"


def bad_input(e: TaskError) -> str:
    """Why the run stopped, as summary.json, events.jsonl and `evalsup status` say it: never a resume."""
    return f"bad input: {bad_line(e)}"


@dataclass(frozen=True, slots=True)
class InputVerdict:
    go: bool
    say: str | None = None  # refused: the one line (exit 2); go: a note, or None
    reason: str | None = None  # refused: why, for the run directory's record (status, summary)


def judge(scan: Scan, name: str, skip: bool) -> InputVerdict:
    """``name``: the task file as the user named it; ``skip``: --on-invalid skip."""
    if scan.stopped:  # a signal came during the scan: the run's own stop says what happened
        return InputVerdict(True)
    if scan.first_bad is not None and not skip:
        return InputVerdict(False, bad_line(scan.first_bad), bad_input(scan.first_bad))
    if scan.start == 0 and scan.tasks == 0:
        what = "no task in it" + (f" ({scan.invalid:,} bad line{'s' if scan.invalid != 1 else ''}, "
                                  f"the first: line {scan.first_bad.line_no}: {scan.first_bad.reason})"
                                  if scan.first_bad is not None else "")
        return InputVerdict(False, f"{name}: {what}", f"bad input: {name}: {what}")
    if scan.invalid:
        assert scan.first_bad is not None
        s = "s" if scan.invalid != 1 else ""
        return InputVerdict(True, f"{name}: {scan.invalid:,} bad line{s} of {scan.invalid + scan.tasks:,} will be "
                                  f"skipped (--on-invalid skip; recorded in invalid.jsonl as the run reads them); "
                                  f"the first: line {scan.first_bad.line_no}: {scan.first_bad.reason}")
    return InputVerdict(True)
