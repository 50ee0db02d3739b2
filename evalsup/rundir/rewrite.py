"""Rewriting ``results.jsonl`` without some of its lines, crash-safely: `evalsup repair` (damaged lines go
to ``damaged.jsonl``) and ``run --retry-failed`` (the chosen error records go to ``replaced.jsonl``). Either
way the tasks of the lines taken out have no record any more, and the next run sends them, exactly once.

The order (a crash between any two steps leaves a run directory that the next open completes or undoes):

1. write ``results.jsonl.new`` (the kept lines) and ``damaged.jsonl.new`` / ``replaced.jsonl.new`` (the old
   file plus the lines taken out), fsync each;
2. write ``checkpoint.next.json`` atomically: the commit point. It covers the new file whole (length, line
   count, CRC-32), its counts are the kept records', and it says ``reconcile``;
3. rename each ``*.new`` over its file, fsync the directory;
4. rename ``checkpoint.next.json`` over ``checkpoint.json``, fsync the directory.

Opening a run directory (finish_pending): with a ``checkpoint.next.json``, steps 3-4 are done (each rename
only while its ``.new`` is there); without one, ``*.new`` files are a rewrite that never committed and are
removed. Then, since the checkpoint says ``reconcile``, the run works out its outstanding set again from the
task file (reconcile): every task before the frontier without a record is outstanding, every record of a
task past it is skipped when reading gets there. Nothing else is needed: no task's fate is written anywhere
but in ``results.jsonl``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.rundir.checkpoint import (
    Checkpoint,
    JournalError,
    fsync_dir,
    load_checkpoint,
    read_checkpoint,
    write_atomic,
)
from evalsup.rundir.layout import CHECKPOINT, CHECKPOINT_NEXT, DAMAGED, REPLACED, RESULTS, writer_alive
from evalsup.rundir.results_file import LineAt, complete_length, prefix_sums, record_problem
from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import TaskError, TaskReader, TaskRef

NEXT = CHECKPOINT_NEXT
SIDE_FILES = (RESULTS, DAMAGED, REPLACED)


def finish_pending(run_dir: Path) -> bool:
    """Complete a committed rewrite, or remove the files of one that never committed. True if one was done."""
    nxt = run_dir / NEXT
    if not nxt.exists():
        for name in SIDE_FILES:
            (run_dir / f"{name}.new").unlink(missing_ok=True)
        return False
    read_checkpoint(nxt)  # written atomically: readable, or the rename never happened
    for name in SIDE_FILES:
        new = run_dir / f"{name}.new"
        if new.exists():
            os.replace(new, run_dir / name)
    fsync_dir(run_dir)
    os.replace(nxt, run_dir / CHECKPOINT)
    fsync_dir(run_dir)
    return True


@dataclass
class RewriteReport:
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line, why) moved to damaged.jsonl
    damaged_count: int = 0
    replaced: int = 0  # records moved to replaced.jsonl
    kept: int = 0
    torn_bytes: int = 0
    rechecked: bool = False  # the covered lines were changed but are all records: the checkpoint was re-based


def _copy_then(src: Path, dest: IO[bytes]) -> None:
    if src.exists():
        with open(src, "rb") as f:
            while chunk := f.read(1 << 20):
                dest.write(chunk)


def rewrite(run_dir: Path, drop: Callable[[dict[str, Any]], bool] | None = None, max_listed: int = 10,
            fingerprint: dict[str, Any] | None = None) -> RewriteReport:
    """Take damaged lines (not a record, or a second record for an id) and, if ``drop`` says so, records out
    of results.jsonl, committed as the module says. A no-op (nothing written) when nothing is taken out."""
    cp = load_checkpoint(run_dir)
    if cp is not None and not cp.finished and writer_alive(run_dir):  # another process holds its lock
        raise JournalError(f"{run_dir}: a run (pid {cp.pid}) is writing to it; stop it first")
    results = run_dir / RESULTS
    rep = RewriteReport()
    if not results.exists():
        return rep
    keep_len = complete_length(results)
    rep.torn_bytes = results.stat().st_size - keep_len
    new_p, dmg_p, rpl_p = (run_dir / f"{n}.new" for n in SIDE_FILES)
    ids = IdSet()
    ok = bad = 0
    with open(results, "rb") as src, open(new_p, "wb") as new, open(dmg_p, "wb") as dmg, open(rpl_p, "wb") as rpl:
        _copy_then(run_dir / DAMAGED, dmg)
        _copy_then(run_dir / REPLACED, rpl)
        id_at = LineAt(new_p, new)
        pos = 0
        try:
            for n, line in enumerate(src, 1):
                if not line.endswith(b"\n"):
                    break  # the torn tail: its task is redone
                rec, why = record_problem(line)
                if rec is not None and ids.find(rec["custom_id"], id_at) is not None:
                    why = f"a second record for {rec['custom_id']!r}"
                    rec = None
                if rec is None:
                    rep.damaged_count += 1
                    if len(rep.damaged) < max_listed:
                        rep.damaged.append((n, why or ""))
                    dmg.write(orjson.dumps({"line": n, "reason": why, "raw": line.decode("utf-8", "replace")},
                                           option=orjson.OPT_APPEND_NEWLINE))
                    continue
                if drop is not None and drop(rec):
                    rep.replaced += 1
                    rpl.write(line)
                    continue
                ids.add(rec["custom_id"], pos, id_at)
                new.write(line)
                pos += len(line)
                rep.kept += 1
                if rec.get("error") is None:
                    ok += 1
                else:
                    bad += 1
        finally:
            id_at.close()
        for f in (new, dmg, rpl):
            f.flush()
            os.fsync(f.fileno())
    # lines edited in place that still are records: the checkpoint's line count and CRC are taken anew
    rep.rechecked = cp is not None and (cp.results_len > keep_len or (
        cp.results_crc is not None and prefix_sums(results, cp.results_len) != (cp.results_lines, cp.results_crc)))
    if not rep.damaged_count and not rep.replaced and not rep.torn_bytes and not rep.rechecked:
        for p in (new_p, dmg_p, rpl_p):
            p.unlink()
        return rep
    if not rep.damaged_count:
        dmg_p.unlink()
    if not rep.replaced:
        rpl_p.unlink()
    lines, crc = prefix_sums(new_p, pos)
    nxt = cp if cp is not None else Checkpoint(fingerprint=fingerprint or {})
    nxt.results_len, nxt.results_lines, nxt.results_crc = pos, lines, crc
    nxt.succeeded, nxt.failed = ok, bad
    nxt.finished = False
    nxt.reconcile = True
    write_atomic(run_dir / NEXT, nxt.to_json())  # the commit point
    finish_pending(run_dir)
    return rep


def reconcile(run_dir: Path, cp: Checkpoint, tasks: Path, max_line_bytes: int) -> Checkpoint:
    """After a rewrite: O = the tasks before the frontier (of this shard) that have no record, done_ahead = the
    ids of the records of tasks past it. One pass over the task file; memory: a compact id set of records."""
    shard = cp.fingerprint.get("shard")
    results = run_dir / RESULTS
    ids = IdSet()
    crashes = {r.offset: r.crashes for r in cp.outstanding}
    outstanding: list[TaskRef] = []
    ahead: list[str] = []
    with open(results, "rb") as f, LineAt(results) as id_at:
        pos = 0
        for line in f:  # the records the checkpoint covers (those after it are the resume scan's D)
            if pos >= cp.results_len:
                break
            ids.add(str(orjson.loads(line)["custom_id"]), pos, id_at)
            pos += len(line)
        with TaskReader(tasks, max_line_bytes) as reader:
            while True:
                try:
                    got = reader.next()
                except TaskError:
                    continue  # invalid (in invalid.jsonl, or met again by the reader) or a duplicate id
                if got is None:
                    break
                ref, _line, index = got
                if shard is not None and index % shard[1] != shard[0]:
                    continue
                found = ids.find(ref.id, id_at) is not None
                if ref.offset < cp.frontier:
                    if not found:
                        ref.crashes = crashes.get(ref.offset, 0)
                        outstanding.append(ref)
                elif found:
                    ahead.append(ref.id)
    cp.outstanding = outstanding
    cp.done_ahead = ahead
    cp.reconcile = False
    return cp


def repair(run_dir: Path) -> tuple[str, int]:
    """`evalsup repair RUN_DIR`: (what was done, exit code)."""
    if not (run_dir / RESULTS).exists():
        return f"{run_dir}: no results.jsonl (not a run directory)", 2
    try:
        rep = rewrite(run_dir)
    except JournalError as e:
        return str(e), e.code
    except OSError as e:
        return f"cannot repair {run_dir}: {e.strerror}", 1
    out = []
    if rep.damaged_count:
        where = ", ".join(f"results.jsonl:{n} ({why})" for n, why in rep.damaged)
        more = " ..." if rep.damaged_count > len(rep.damaged) else ""
        out.append(f"{run_dir}: moved {rep.damaged_count:,} damaged line(s) to damaged.jsonl: {where}{more}")
    if rep.torn_bytes:
        out.append(f"{run_dir}: cut a torn last line of {rep.torn_bytes} bytes")
    if rep.rechecked and not rep.damaged_count:
        out.append(f"{run_dir}: every line is a record, but lines the checkpoint covers were changed; the "
                   "checkpoint now covers them as they are")
    if not out:
        return f"{run_dir}: results.jsonl has no damaged line; nothing to repair", 0
    out.append("tasks without a record now run on the next resume: rerun the same `evalsup run` command")
    return "\n".join(out), 0


