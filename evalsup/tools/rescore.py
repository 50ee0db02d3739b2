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
from evalsup.scoring.scorers import Scored, ScoreFn, ScorerOptions, ScoreStats, load_scorer, score_sync

BATCH = 500
_scorers: list[tuple[str, ScoreFn]] = []


def _init(specs: list[str], options: ScorerOptions) -> None:
    _scorers[:] = [load_scorer(s, options) for s in specs]


def _score_batch(lines: list[bytes]) -> list[tuple[bytes, Scored | None]]:
    out: list[tuple[bytes, Scored | None]] = []
    for line in lines:
        rec = orjson.loads(line)
        rec.pop("scores", None)
        rec.pop("score_errors", None)
        scored: Scored | None = None
        if rec.get("error") is None and rec.get("response"):
            task = {"id": rec["custom_id"], **(rec.get("metadata") or {})}
            scored = score_sync(_scorers, task, rec["response"].get("body"))
            rec["scores"] = scored.scores  # a scorer that left the task unscored is absent, as in a run
            if scored.errors:
                rec["score_errors"] = scored.errors
        out.append((orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE), scored))
    return out


def _batches(path: Path) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    try:  # checked: a damaged line is a one-line error naming results.jsonl:LINE (a torn last line ends)
        for _n, line, _rec in iter_records(path):
            batch.append(line)
            if len(batch) >= BATCH:
                yield batch
                batch = []
    except RunDirDamaged as e:
        raise ValueError(str(e)) from None
    if batch:
        yield batch


def rescore(run_dir: Path, specs: list[str], workers: int, strip: bool, ignore_case: bool, pattern: str | None,
            output: Path | None, normalize: bool = False) -> dict[str, Any]:
    src = run_dir / layout.RESULTS
    if not src.exists():
        raise ValueError(f"{run_dir}: no results.jsonl")
    options = ScorerOptions(strip, ignore_case, pattern, normalize)
    _init(specs, options)  # fail here, once, on a bad scorer name
    dest = output or run_dir / layout.SCORED
    tmp = dest.with_name(dest.name + ".partial")
    stats = ScoreStats()
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(specs, options)) as pool, open(tmp, "wb") as w:
        batches = _batches(src)
        pending: list[Any] = []
        for batch in batches:  # at most 2 batches a process in flight: memory stays flat
            pending.append(pool.apply_async(_score_batch, (batch,)))
            if len(pending) >= 2 * workers:
                for line, scored in pending.pop(0).get():
                    w.write(line)
                    if scored is not None:
                        stats.add(scored.scores, scored.unscored)
        for p in pending:
            for line, scored in p.get():
                w.write(line)
                if scored is not None:
                    stats.add(scored.scores, scored.unscored)
    os.replace(tmp, dest)
    summary = stats.summary()
    (run_dir / layout.SCORES).write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary
