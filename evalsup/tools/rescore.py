"""`evalsup score`: score a finished run's results again, streamed, in parallel processes, no request sent."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from evalsup.rundir import layout
from evalsup.rundir.checkpoint import RunDirDamaged
from evalsup.rundir.results_file import iter_records
from evalsup.scoring.groups import GroupedScores
from evalsup.scoring.scorers import Scored, ScorerOptions, ScoreStats, score_sync
from evalsup.scoring.selection import Loaded
from evalsup.tasks.group_key import group_of, parse_group_by

BATCH = 500
_scorers: list[Loaded] = []  # this process's: the run's --scorer list and those the tasks name (issue 43)
_group_path: list[tuple[str, ...] | None] = [None]


def _init(specs: list[str], options: ScorerOptions, group_by: str | None = None) -> None:
    _scorers[:] = [Loaded(specs, options)]
    _group_path[0] = parse_group_by(group_by) if group_by else None


Scoring = tuple[bytes, Scored | None, str | None, bool]  # the line, its scores, its group, whether it is ok


def _score_batch(lines: list[bytes]) -> list[Scoring]:
    out: list[Scoring] = []
    path = _group_path[0]
    for line in lines:
        rec = orjson.loads(line)
        group = None if path is None else group_of(rec.get("metadata"), path)
        rec.pop("scores", None)
        rec.pop("score_errors", None)
        scored: Scored | None = None
        if rec.get("error") is None and rec.get("response"):
            task = {"id": rec["custom_id"], **(rec.get("metadata") or {})}
            scored = score_sync(_scorers[0].for_task(task), task, rec["response"].get("body"))
            rec["scores"] = scored.scores  # a scorer that left the task unscored is absent, as in a run
            if scored.errors:
                rec["score_errors"] = scored.errors
        out.append((orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE), scored, group, rec.get("error") is None))
    return out


def _batches(path: Path) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    try:  # checked: a damaged line is a one-line error naming results.jsonl:LINE (a torn last line ends)
        for _n, line, _rec in iter_records(path, once=True):  # a second record for an id: refused too
            batch.append(line)
            if len(batch) >= BATCH:
                yield batch
                batch = []
    except RunDirDamaged as e:
        raise ValueError(str(e)) from None
    if batch:
        yield batch


def rescore(run_dir: Path, specs: list[str], workers: int, strip: bool, ignore_case: bool, pattern: str | None,
            output: Path | None, normalize: bool = False, group_by: str | None = None) -> dict[str, Any]:
    """Score every record again; the summary by scorer (and with ``group_by``, metadata.KEY, by group under
    ``"groups"``), also written to RUN_DIR/scores.json."""
    src = run_dir / layout.RESULTS
    if not src.exists():
        raise ValueError(f"{run_dir}: no results.jsonl")
    options = ScorerOptions(strip, ignore_case, pattern, normalize)
    _init(specs, options, group_by)  # fail here, once, on a bad scorer name or --group-by
    dest = output or run_dir / layout.SCORED
    tmp = dest.with_name(dest.name + ".partial")
    stats = ScoreStats()
    groups = GroupedScores(group_by) if group_by else None

    def count(done: list[Scoring]) -> None:
        for line, scored, group, ok in done:
            w.write(line)
            if scored is not None:
                stats.add(scored.scores, scored.unscored)
            if groups is not None and group is not None:
                groups.add(group, ok, None if scored is None else scored.scores,
                           () if scored is None else scored.unscored)

    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(specs, options, group_by)) as pool, open(tmp, "wb") as w:
        batches = _batches(src)
        pending: list[Any] = []
        for batch in batches:  # at most 2 batches a process in flight: memory stays flat
            pending.append(pool.apply_async(_score_batch, (batch,)))
            if len(pending) >= 2 * workers:
                count(pending.pop(0).get())
        for p in pending:
            count(p.get())
    os.replace(tmp, dest)
    summary = stats.summary()
    if groups is not None:
        summary = {**summary, "groups": groups.summary()}
    (run_dir / layout.SCORES).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary
