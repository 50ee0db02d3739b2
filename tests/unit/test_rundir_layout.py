"""The run directory's layout (evalsup.rundir.layout): its file names, the shard directory name and its one
parser, what is a run directory, and whether a writer holds one. No process, no socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsup.config.run_config import default_run_dir
from evalsup.rundir import layout
from evalsup.rundir.lock import RunDirLock, moved_aside_name
from evalsup.tools.coverage import find_run_dirs
from evalsup.tools.status import find_shards, is_run_dir


def test_every_file_has_one_name() -> None:
    names = [layout.RESULTS, layout.CHECKPOINT, layout.CHECKPOINT_NEXT, layout.IDS, layout.INVALID, layout.RUN_JSON,
             layout.EVENTS, layout.MEMORY, layout.SUMMARY, layout.INPUT_INFO, layout.INPUT_COPY, layout.DAMAGED,
             layout.REPLACED, layout.REPORT, layout.SCORED, layout.SCORES, layout.LOCK]
    assert len(set(names)) == len(names)
    assert (layout.RESULTS, layout.CHECKPOINT, layout.RUN_JSON, layout.IDS, layout.INVALID, layout.EVENTS,
            layout.MEMORY, layout.SUMMARY, layout.INPUT_INFO, layout.LOCK) == (
        "results.jsonl", "checkpoint.json", "run.json", "ids.bin", "invalid.jsonl", "events.jsonl", "memory.jsonl",
        "summary.json", "input.json", "evalsup.lock")
    assert set(layout.RUN_DIR_MARKS) <= set(names)


@pytest.mark.parametrize(("k", "n"), [(0, 1), (0, 2), (1, 2), (7, 8), (99, 100)])
def test_shard_name_round_trips(k: int, n: int) -> None:
    name = layout.shard_dir_name(k, n)
    assert name == f"shard-{k}-of-{n}"
    assert layout.parse_shard_dir(name) == (k, n)
    assert default_run_dir(Path("/d/tasks.jsonl.gz"), (k, n)) == Path("/d/tasks.run") / name


@pytest.mark.parametrize("name", ["shard-3-of-2", "shard-2-of-2", "shard-0-of-0", "shard-01-of-2", "shard-1-of-02",
                                  "shard--1-of-2", "shard-1-of-2.old-20250101-000000", "shard-1-of-2x", "xshard-1-of-2",
                                  "shard-١-of-٢", "shard-1-2", "tasks.run", ""])
def test_shard_parser_refuses_what_shard_dir_name_never_writes(name: str) -> None:
    assert layout.parse_shard_dir(name) is None


def test_moved_aside_names_are_recognised() -> None:
    stamp = "20250101-000000"
    assert moved_aside_name("tasks.run", stamp) == "tasks.run.old-20250101-000000"
    assert moved_aside_name("tasks.run", stamp, 2) == "tasks.run.old-20250101-000000-2"
    assert layout.is_moved_aside(Path(moved_aside_name("shard-0-of-2", stamp)))
    assert not layout.is_moved_aside(Path("shard-0-of-2"))


@pytest.mark.parametrize("mark", ["checkpoint.json", "results.jsonl", "events.jsonl"])
def test_a_run_directory_is_one_with_a_checkpoint_results_or_events(tmp_path: Path, mark: str) -> None:
    d = tmp_path / "r.run"
    d.mkdir()
    assert not layout.is_run_dir(d)
    for other in ("summary.json", "run.json", "evalsup.lock", "tasks.jsonl", "report.html"):
        (d / other).write_text("{}")
    assert not layout.is_run_dir(d)
    (d / mark).write_text("")
    assert layout.is_run_dir(d)
    assert is_run_dir is layout.is_run_dir  # status asks the layout, not a copy
    assert not layout.is_run_dir(tmp_path / "missing")


def test_status_and_merge_find_the_same_shards(tmp_path: Path) -> None:
    parent = tmp_path / "tasks.run"
    for name in ("shard-0-of-3", "shard-2-of-3", "shard-3-of-2", "shard-1-of-3.old-20250101-000000", "notes"):
        (parent / name).mkdir(parents=True)
    (parent / "shard-0-of-3" / "results.jsonl").write_text("")
    assert {n: sorted(ks) for n, ks in find_shards(parent).items()} == {3: [0, 2]}
    # merge's finder: shard directories by name even before their first file, never moved-aside ones
    assert sorted(p.name for p in find_run_dirs([parent])) == ["shard-0-of-3", "shard-2-of-3"]


def test_writer_alive_is_the_lock_held_by_another(tmp_path: Path) -> None:
    d = tmp_path / "r.run"
    assert not layout.writer_alive(d) and layout.lock_holder(d) is None
    lock = RunDirLock(d)
    lock.acquire(command="run")
    try:
        info = layout.lock_holder(d)
        assert info is not None and info["command"] == "run"
        # held by this very process (the run rewriting its own results for --retry-failed): not another writer
        assert not layout.writer_alive(d)
        (d / layout.LOCK).write_bytes(b'{"host": "elsewhere", "pid": 1, "started": 0, "command": "run"}\n')
        assert layout.writer_alive(d) and layout.writer_alive(d, command="run")
        # `evalsup score` holding a stopped run's directory writes, but it is no run (status: not "running")
        (d / layout.LOCK).write_bytes(b'{"host": "elsewhere", "pid": 1, "started": 0, "command": "score"}\n')
        assert layout.writer_alive(d) and not layout.writer_alive(d, command="run")
    finally:
        lock.release()
    assert not layout.writer_alive(d) and layout.lock_holder(d) is None
