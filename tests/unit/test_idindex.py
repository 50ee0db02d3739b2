"""Duplicate ids found on disk (tasks/idindex.py, issue 33): sorted runs merged, a hash collision never taken for a
duplicate, duplicates found across runs and merge passes, lines appended after the pre-scan looked up, and the
temporary files left nowhere."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from evalsup.tasks import idindex, idset
from evalsup.tasks.idindex import IndexBuilder, PairSort
from evalsup.tasks.prescan import prescan
from evalsup.tasks.reader import TaskError, TaskReader

MAX = 1 << 20


def _write(path: Path, ids: list[str]) -> Path:
    path.write_bytes(b"".join(orjson.dumps({"id": i, "prompt": "q"}) + b"\n" for i in ids))
    return path


def _read_all(path: Path, index: idindex.IdIndex) -> tuple[list[str], list[str]]:
    """(ids read, bad-line reasons) of a run's reading with ``index``."""
    good: list[str] = []
    bad: list[str] = []
    with TaskReader(path, MAX, ids=index) as r:
        while True:
            try:
                got = r.next()
            except TaskError as e:
                bad.append(e.reason)
                continue
            if got is None:
                return good, bad
            good.append(got[0].id)


def _at(path: Path, line: int) -> int:
    """The byte offset of 0-based line ``line``."""
    return sum(len(x) for x in path.read_bytes().splitlines(keepends=True)[:line])


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of 4 pairs, 3 merged at once: a few dozen ids go through several runs and a merge pass of its own."""
    monkeypatch.setattr(idindex, "RUN", 4)
    monkeypatch.setattr(idindex, "FAN_IN", 3)
    monkeypatch.setattr(idindex, "BLOCK", 2)


def test_pairs_sort_across_runs_and_merge_passes(small_runs: None, tmp_path: Path) -> None:
    s = PairSort(tmp_path / "run")
    pairs = [((i * 7919) % 101, i) for i in range(50)]
    for a, b in pairs:
        s.add(a, b)
    assert len(s) == 50
    assert [(k >> 64, k & ((1 << 64) - 1)) for k in s.sorted_keys()] == sorted(pairs)
    s.close()


def test_duplicates_across_sorted_runs_are_found_and_named_by_line(small_runs: None, tmp_path: Path) -> None:
    ids = [f"t{i}" for i in range(30)] + ["t3", "t29", "t3"]
    f = _write(tmp_path / "t.jsonl", ids)
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"), keep_going=True)
    assert (scan.tasks, scan.invalid) == (30, 3)
    assert scan.first_bad is not None and scan.first_bad.line_no == 31
    assert scan.first_bad.reason == f"duplicate id 't3' (first seen at byte {_at(f, 3)})"
    assert scan.index is not None
    good, bad = _read_all(f, scan.index)
    assert good == ids[:30] and bad == [f"duplicate id 't3' (first seen at byte {_at(f, 3)})",
                                        f"duplicate id 't29' (first seen at byte {_at(f, 29)})",
                                        f"duplicate id 't3' (first seen at byte {_at(f, 3)})"]
    scan.index.close()


def test_a_hash_collision_is_never_a_duplicate(small_runs: None, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    def collide(task_id: str) -> int:
        return 42  # every id has the same hash: each match is read again and compared

    monkeypatch.setattr(idindex, "id_hash", collide)
    monkeypatch.setattr(idset, "id_hash", collide)
    ids = [f"t{i}" for i in range(12)]
    f = _write(tmp_path / "t.jsonl", ids)
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"))
    assert (scan.tasks, scan.invalid, scan.first_bad) == (12, 0, None)
    assert scan.index is not None
    with open(f, "ab") as out:  # appended while the run goes on: looked up, colliding with every line
        out.write(b'{"id": "t12", "prompt": "q"}\n{"id": "t5", "prompt": "q"}\n{"id": "t12", "prompt": "q"}\n')
    good, bad = _read_all(f, scan.index)
    assert good == [*ids, "t12"]
    assert bad == [f"duplicate id 't5' (first seen at byte {_at(f, 5)})",
                   f"duplicate id 't12' (first seen at byte {_at(f, 12)})"]
    scan.index.close()


def test_a_line_appended_after_the_scan_is_checked_against_the_lines_before_it(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [f"t{i}" for i in range(1000)])
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"))
    assert scan.index is not None and scan.index.covered == f.stat().st_size
    with open(f, "ab") as out:
        out.write(b'{"id": "t999", "prompt": "q"}\n{"id": "new", "prompt": "q"}\n{"id": "t0", "prompt": "q"}\n')
    good, bad = _read_all(f, scan.index)
    assert good[-1] == "new" and len(good) == 1001
    assert [b.split(" (")[0] for b in bad] == ["duplicate id 't999'", "duplicate id 't0'"]
    assert len(scan.index.take_log()) == 1001 * 16  # every good line read goes to ids.bin
    scan.index.close()


def test_the_temporary_files_are_beside_the_run_and_never_named_on_disk(small_runs: None, tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [f"t{i}" for i in range(40)])
    before = set(os.listdir(tmp_path))
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "out" / "run"))  # out/ does not exist yet: its parent holds them
    assert scan.index is not None
    assert set(os.listdir(tmp_path)) == before  # unlinked at creation: a SIGKILL leaves nothing behind
    assert scan.index.pairs == 40
    scan.index.close()


def test_memory_is_a_run_of_pairs_whatever_the_number_of_ids(small_runs: None, tmp_path: Path) -> None:
    s = PairSort(tmp_path / "run")
    for i in range(1000):
        s.add(i * 31 % 997, i)
        assert len(s._buf) <= 2 * idindex.RUN  # what is held in memory: one run, the rest on disk
    assert sum(1 for _ in s.sorted_keys()) == 1000
    s.close()
