"""What `evalsup merge` proves before it writes anything: the run directories to merge, found without the
moved-aside ones (``*.old-*``), and whether together they cover the input, from their checkpoints alone.

Shard ``K`` of ``N`` is the directory whose checkpoint says so (its fingerprint's ``shard``), or, before its first
checkpoint, the one named ``shard-K-of-N``. Every K in 0..N-1 must be there and finished, all made from the same
input (the same fingerprint, evalsup.tasks.fingerprint); with ``--tasks``, that file's fingerprint too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsup.rundir import layout
from evalsup.rundir.checkpoint import Checkpoint, JournalError, load_checkpoint
from evalsup.rundir.layout import is_moved_aside, is_run_dir, parse_shard_dir, shard_dir_name
from evalsup.tasks.fingerprint import fingerprint


class CoverageError(Exception):
    """No run directory where one was named."""


def _is_run_dir(d: Path) -> bool:
    """A run directory, or a shard's directory before the run wrote anything in it (its lock only)."""
    return d.is_dir() and (parse_shard_dir(d.name) is not None or is_run_dir(d))


def _kept(d: Path) -> bool:
    return not is_moved_aside(d)  # `run --fresh` moved it aside: not part of the run any more


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories among ``paths``; a directory that is not one is searched one and two levels down
    (``tasks.run/shard-*``, ``data/tasks.run/shard-*``), leaving out moved-aside ``*.old-*`` directories."""
    found: list[Path] = []
    for p in paths:
        if _is_run_dir(p):
            found.append(p)
            continue
        subs = sorted(d for d in p.glob("*") if _kept(d) and _is_run_dir(d))
        subs += sorted(d for d in p.glob("*/*") if _kept(d) and _kept(d.parent) and _is_run_dir(d))
        if not subs:
            raise CoverageError(f"{p}: no run directory (results.jsonl, checkpoint.json or shard-K-of-N) in it "
                                "or in its subdirectories")
        found.extend(subs)
    seen: set[Path] = set()
    unique = []
    for d in found:
        if d.resolve() not in seen:
            seen.add(d.resolve())
            unique.append(d)
    return unique


def _lines_from(path: Path, start: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


@dataclass
class _Dir:
    path: Path
    cp: Checkpoint | None
    shard: tuple[int, int] | None
    done: int
    unreadable: str | None = None


def _look(d: Path) -> _Dir:
    try:
        cp = load_checkpoint(d)
    except JournalError as e:
        return _Dir(d, None, _named_shard(d), 0, str(e))
    if cp is None:
        return _Dir(d, None, _named_shard(d), _lines_from(d / layout.RESULTS, 0))
    raw = cp.fingerprint.get("shard")
    shard = (int(raw[0]), int(raw[1])) if isinstance(raw, list) and len(raw) == 2 else None
    done = cp.succeeded + cp.failed + _lines_from(d / layout.RESULTS, cp.results_len)
    return _Dir(d, cp, shard, done)


def _named_shard(d: Path) -> tuple[int, int] | None:
    return parse_shard_dir(d.name)


def _input_of(fp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fp.items() if k != "shard"}


def _count_tasks(tasks: Path) -> int:
    with open(tasks, "rb") as f:
        return sum(1 for line in f if line.strip())


def coverage_problems(run_dirs: list[Path], tasks: Path | None = None) -> list[str]:
    """One line per reason the run directories do not prove complete coverage; empty when they do."""
    dirs = [_look(d) for d in run_dirs]
    problems = [f"{x.path}: {x.unreadable}" for x in dirs if x.unreadable]
    with_cp = [x for x in dirs if x.cp is not None]
    ref: dict[str, Any] | None = None
    if tasks is not None:
        ref = _input_of(fingerprint(tasks))
        for x in with_cp:
            assert x.cp is not None
            if _input_of(x.cp.fingerprint) != ref:
                problems.append(f"{x.path}: made from another version of {tasks} (its size or content differ)")
    elif with_cp:
        first = with_cp[0]
        assert first.cp is not None
        ref = _input_of(first.cp.fingerprint)
        for x in with_cp[1:]:
            assert x.cp is not None
            if _input_of(x.cp.fingerprint) != ref:
                problems.append(f"{x.path}: made from another input than {first.path} (size or content differ)")
    # the number of tasks (non-blank lines), for each shard's done/total: from a finished run of the same input
    total: int | None = next((x.cp.index for x in with_cp if x.cp is not None and x.cp.finished
                              and _input_of(x.cp.fingerprint) == ref), None)
    if total is None and tasks is not None:
        total = _count_tasks(tasks)
    shards = [x for x in dirs if x.shard is not None]
    counts = sorted({x.shard[1] for x in shards if x.shard is not None})
    if len(counts) > 1:
        problems.append(f"shard directories of different shard counts (N = {', '.join(map(str, counts))}): "
                        + ", ".join(str(x.path) for x in shards))
    for n in counts:
        have: dict[int, list[_Dir]] = {}
        for x in shards:
            if x.shard is not None and x.shard[1] == n:
                have.setdefault(x.shard[0], []).append(x)
        for k in range(n):
            of = "?" if total is None else f"{len(range(k, total, n)):,}"
            got = have.get(k, [])
            if not got:
                problems.append(f"{shard_dir_name(k, n)}: missing (0/{of} done)")
            elif len(got) > 1:
                problems.append(f"shard {k} of {n} is in more than one directory: "
                                + ", ".join(str(x.path) for x in got))
            elif got[0].cp is None and not got[0].unreadable:
                problems.append(f"{got[0].path}: not started (no checkpoint), {got[0].done:,}/{of} done")
            elif got[0].cp is not None and not got[0].cp.finished:
                problems.append(f"{got[0].path}: incomplete, {got[0].done:,}/{of} done")
    for x in dirs:
        if x.shard is None and not x.unreadable and (x.cp is None or not x.cp.finished):
            of = "?" if total is None else f"{total:,}"
            problems.append(f"{x.path}: incomplete, {x.done:,}/{of} done")
    return problems
