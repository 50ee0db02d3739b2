"""`evalsup report`: one self-contained HTML page of a run directory, its charts drawn as inline SVG.

No script and no external resource: the file opens offline and can be mailed around. Every file is streamed
(data: memory samples thinned to at most MAX_POINTS, events, run.json; scan: one pass over results.jsonl into
histograms, counts and a top-k), so the cost in memory does not grow with the run. The page: page.render.
"""

from __future__ import annotations

from pathlib import Path

from evalsup.rundir import layout
from evalsup.rundir.checkpoint import write_atomic
from evalsup.tools.report.scan import ReportError

__all__ = ["ReportError", "write_report"]


def write_report(run_dir: Path, output: Path | None = None, group_by: str | None = None) -> Path:
    """Write the report of `run_dir` (default RUN_DIR/report.html); returns its path. ``group_by``
    (metadata.KEY): the scores per group (default: the run's --group-by)."""
    from evalsup.tasks.group_key import GroupByError, parse_group_by
    from evalsup.tools.report.data import load
    from evalsup.tools.report.page import render

    if not layout.is_run_dir(run_dir):
        raise ReportError(f"{run_dir}: not a run directory (none of {', '.join(layout.RUN_DIR_MARKS)})")
    if group_by is not None:
        try:
            parse_group_by(group_by)
        except GroupByError as e:
            raise ReportError(str(e)) from None
    out = output or run_dir / layout.REPORT
    try:
        write_atomic(out, render(run_dir, load(run_dir, group_by)).encode())
    except OSError as e:
        raise ReportError(f"cannot write {out}: {e.strerror}") from None
    return out
