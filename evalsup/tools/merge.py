"""`evalsup merge`: the results of shard runs as one results file and one summary, with a coverage check."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.rundir import layout
from evalsup.rundir.checkpoint import RunDirDamaged
from evalsup.rundir.results_file import LineAt, iter_records
from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import TaskError, TaskReader
from evalsup.tools.summaries import combined


class MergeError(Exception):
    pass


@dataclass
class MergeReport:
    records: int = 0
    succeeded: int = 0
    failed: int = 0
    duplicates: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    missing_count: int = 0
    duplicate_count: int = 0
    run_dirs: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.missing_count == 0 and self.duplicate_count == 0


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories among ``paths`` (see evalsup.tools.coverage: moved-aside ``*.old-*`` ones are left out)."""
    from evalsup.tools.coverage import CoverageError
    from evalsup.tools.coverage import find_run_dirs as find

    try:
        return find(paths)
    except CoverageError as e:
        raise MergeError(str(e)) from None


def merge(run_dirs: list[Path], out: Path, tasks: Path | None = None, sort: bool = False,
          max_listed: int = 20, tick: Callable[[], None] = lambda: None) -> MergeReport:
    """``tick``: called for each record read (the command's progress line on a terminal)."""
    if sort and tasks is None:
        raise MergeError("--sort needs --tasks (the input order comes from the task file)")
    rep = MergeReport(run_dirs=[str(d) for d in run_dirs])
    ids = IdSet()
    tmp = out.with_name(out.name + ".partial")
    try:
        _merge_into(tmp, run_dirs, rep, ids, tasks, sort, max_listed, tick)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if rep.complete:
        os.replace(tmp, out)  # only a complete merge replaces what was there
    else:
        tmp.unlink()
    return rep


def _merge_into(tmp: Path, run_dirs: list[Path], rep: MergeReport, ids: IdSet, tasks: Path | None, sort: bool,
                max_listed: int, tick: Callable[[], None]) -> None:
    with open(tmp, "wb") as w:
        reader = LineAt(tmp, w)
        pos = 0
        for d in run_dirs:
            if not (d / layout.RESULTS).exists():
                continue  # a shard whose every line was invalid (and skipped) has no results
            try:  # checked: a damaged line is a one-line error naming results.jsonl:LINE (a torn last line ends)
                for _n, line, rec in iter_records(d / layout.RESULTS):
                    tick()
                    cid = str(rec["custom_id"])
                    if ids.add(cid, pos, reader) is not None:
                        rep.duplicate_count += 1
                        if len(rep.duplicates) < max_listed:
                            rep.duplicates.append(cid)
                        continue
                    w.write(line)
                    pos += len(line)
                    rep.records += 1
                    if rec.get("error") is None:
                        rep.succeeded += 1
                    else:
                        rep.failed += 1
            except RunDirDamaged as e:
                raise MergeError(str(e)) from None
        w.flush()
        if tasks is not None:
            final = tmp.with_name(tmp.name + ".sorted") if sort else None
            sw = open(final, "wb") if final else None  # noqa: SIM115 - closed below
            try:
                with TaskReader(tasks, 1 << 30) as tr:
                    while True:
                        try:
                            got = tr.next()
                        except TaskError:
                            continue
                        if got is None:
                            break
                        ref = got[0]
                        at = ids.find(ref.id, reader)
                        if at is None:
                            rep.missing_count += 1
                            if len(rep.missing) < max_listed:
                                rep.missing.append(ref.id)
                        elif sw is not None:
                            sw.write(reader.line(at))
            finally:
                if sw is not None:
                    sw.close()
            if final is not None:
                os.replace(final, tmp)
        reader.close()


def merged_summary(rep: MergeReport, run_dirs: list[Path]) -> dict[str, Any]:
    """The merge's counts, each shard's line, and the figures of the shards' summary.json summed (scores and
    groups, budget, judge usage, structured outputs, cache: evalsup.tools.summaries)."""
    shards = []
    found: list[dict[str, Any]] = []
    for d in run_dirs:
        p = d / layout.SUMMARY
        if p.exists():
            s = orjson.loads(p.read_bytes())
            found.append(s)
            shards.append({"run_dir": str(d), "total": s.get("total"), "wall_s": s.get("wall_s"),
                           "worker_restarts": s.get("worker_restarts")})
        else:
            shards.append({"run_dir": str(d), "total": None})
    return {"total": rep.records, "succeeded": rep.succeeded, "failed": rep.failed,
            "duplicates": rep.duplicate_count, "missing": rep.missing_count, "complete": rep.complete,
            **combined(found), "shards": shards}
