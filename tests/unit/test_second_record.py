"""A second record for an id is damage wherever its first is (issue 39; rundir/results_file.py): before, only a
repeat among the records after the checkpoint was seen, so a record appended for an id done before it made a
resume say "21 done" of 20 tasks. ``second_record`` names the second line and the first, with memory for the
records after the checkpoint only; the tools' checked reader (``iter_records(once=True)``) refuses it first."""

from __future__ import annotations

import re
from array import array
from pathlib import Path

import orjson
import pytest

from evalsup.rundir import results_file
from evalsup.rundir.checkpoint import Checkpoint, RunDirDamaged, write_atomic
from evalsup.rundir.results_file import check_run_dir, iter_records, prefix_sums, second_record
from evalsup.tasks.idset import id_hash
from evalsup.tasks.reader import TaskRef
from evalsup.tasks.records import output_line


def _line(cid: str, text: str = "ok") -> bytes:
    return output_line(cid, status=200, request_id="r", body={"choices": [{"message": {"content": text}}]},
                       error=None, metrics={"attempts": 1}, metadata=None)


def _run_dir(tmp_path: Path, covered: list[bytes], after: list[bytes],
             outstanding: tuple[str, ...] = ()) -> tuple[Path, Checkpoint]:
    """A run directory whose checkpoint covers ``covered``, with ``after`` written past it: as a run leaves
    it, ids.bin logs the ids of the tasks read before the frontier (those with a record, and ``outstanding``)."""
    d = tmp_path / "t.run"
    d.mkdir()
    path = d / "results.jsonl"
    path.write_bytes(b"".join(covered + after))
    length = sum(map(len, covered))
    lines, crc = prefix_sums(path, length)
    read = [str(orjson.loads(x)["custom_id"]) for x in covered] + list(outstanding)
    pairs = array("Q")
    for i, tid in enumerate(read):
        pairs.extend((id_hash(tid), 100 * i))
    (d / "ids.bin").write_bytes(pairs.tobytes())
    cp = Checkpoint(fingerprint={}, results_len=length, results_lines=lines, results_crc=crc, succeeded=lines,
                    ids_len=16 * len(read), outstanding=[TaskRef(100 * (len(covered) + i), 0, tid)
                                                         for i, tid in enumerate(outstanding)])
    write_atomic(d / "checkpoint.json", cp.to_json())
    return d, cp


def test_a_record_after_the_checkpoint_for_an_id_done_before_it_is_named_with_its_first(tmp_path: Path) -> None:
    covered = [_line(f"t{i}") for i in range(20)]
    d, cp = _run_dir(tmp_path, covered, [covered[2]])  # sed -n 3p results.jsonl >> results.jsonl
    path = d / "results.jsonl"
    problem = second_record(path, cp)
    assert problem is not None and str(problem) == (
        f"{path}:21: a second record for 't2' (the first: line 3); run `evalsup repair {d}` to move it to "
        "damaged.jsonl (the first stays: the task is done and does not run again)")
    assert check_run_dir(d) == str(problem)  # `evalsup status`
    with pytest.raises(RunDirDamaged, match=re.escape("results.jsonl:21: a second record for 't2'")):
        next(iter_records(path, once=True))  # `score` and `report`: refused before any record is counted
    assert len(list(iter_records(path))) == 21  # unchecked, as the resume's own scan of the tail reads


def test_a_record_put_among_the_checkpointed_lines_is_named_by_its_own_line_by_the_tools(tmp_path: Path) -> None:
    """`evalsup score` and `report` read with ``iter_records(once=True)``: a copy of line 3 put in as line 6,
    inside what the checkpoint covers, is named as line 6 (as `evalsup status` names it), not as the line where
    the records after the checkpoint seem to start."""
    covered = [_line(f"t{i}") for i in range(20)]
    d, _cp = _run_dir(tmp_path, covered, [])
    path = d / "results.jsonl"
    path.write_bytes(b"".join([*covered[:5], covered[2], *covered[5:]]))  # sed -i '5r' a copy of line 3
    said = "results.jsonl:6: a second record for 't2' (the first: line 3)"
    with pytest.raises(RunDirDamaged, match=re.escape(said)):
        next(iter_records(path, once=True))
    assert check_run_dir(d) is not None and "results.jsonl:6: a second record for 't2'" in check_run_dir(d)


def test_each_id_once_is_no_damage_and_the_earliest_second_record_is_named(tmp_path: Path) -> None:
    covered = [_line(f"t{i}") for i in range(50)]
    d, cp = _run_dir(tmp_path, covered, [_line("t50"), _line("t51")])
    path = d / "results.jsonl"
    assert second_record(path, cp) is None and check_run_dir(d) is None
    assert [n for n, _, _ in iter_records(path, once=True)] == list(range(1, 53))
    # two repeats after the checkpoint: of the tail's own t50 (line 54) and of t7 (line 55); the first named
    with open(path, "ab") as f:
        f.write(_line("t51b") + _line("t50") + _line("t7"))
    problem = second_record(path, cp)
    assert problem is not None and "results.jsonl:54: a second record for 't50' (the first: line 51)" in str(problem)


def test_ids_are_matched_whole_whatever_the_lines_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer that quotes another record's head is no record of it; a covered line in another key order (not
    evalsup's own form) is parsed; blocks smaller than a line still see every line whole."""
    monkeypatch.setattr(results_file, "CHUNK", 97)
    quote = orjson.dumps({"id": "x", "custom_id": "t3"}).decode()
    covered = [_line(f"t{i}", "y" * (i * 13)) for i in range(30)]
    covered[4] = _line("t4", f'\n{quote}\n"custom_id":"t3"')
    covered[9] = orjson.dumps({"custom_id": "t9", "response": None, "error": {"code": "x"}, "id": "b"}) + b"\n"
    d, cp = _run_dir(tmp_path, covered, [_line("t3x"), _line("t31")])
    path = d / "results.jsonl"
    assert second_record(path, cp) is None
    with open(path, "ab") as f:
        f.write(_line("t9"))
    problem = second_record(path, cp)
    assert problem is not None and "results.jsonl:33: a second record for 't9' (the first: line 10)" in str(problem)


def test_without_a_checkpoint_every_record_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"  # a run killed before its first checkpoint
    path.write_bytes(b"".join(_line(f"t{i}") for i in (1, 2, 3, 2)))
    problem = second_record(path, None)
    assert problem is not None and "results.jsonl:4: a second record for 't2' (the first: line 2)" in str(problem)
    assert check_run_dir(tmp_path) == str(problem)


def test_a_resume_after_a_kill_reads_no_covered_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records after the checkpoint are of tasks outstanding then or read after it: ids.bin (16 bytes a task)
    says so, and the lines the checkpoint covers are not read for their ids."""
    covered = [_line(f"t{i}") for i in range(40)]
    d, cp = _run_dir(tmp_path, covered, [_line("t41"), _line("t40"), _line("t45")], outstanding=("t40", "t41"))
    read: list[int] = []
    real = results_file._covered_ids_in
    monkeypatch.setattr(results_file, "_covered_ids_in", lambda *a: (read.append(1), real(*a))[1])
    assert second_record(d / "results.jsonl", cp) is None and read == []
    with open(d / "results.jsonl", "ab") as f:
        f.write(_line("t39"))  # a task done before the checkpoint (in ids.bin, not outstanding): they are read
    problem = second_record(d / "results.jsonl", cp)
    assert problem is not None and "results.jsonl:44: a second record for 't39' (the first: line 40)" in str(problem)
    assert read == [1]
