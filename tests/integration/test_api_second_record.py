"""The Python API's readers refuse a results.jsonl holding a second record for a task, as `evalsup status`,
`score`, `report` and a resume do: `sed -n 3p R/results.jsonl >> R/results.jsonl`, then
``evalsup.read_results(R)`` read 21 records of 20 tasks and ``to_pandas`` made 21 rows. Now both raise
``evalsup.ResultsDamaged`` with the line status prints (both lines named, what `evalsup repair` does), before a
record is read; a line that is no record is refused too, naming its line; a clean run reads as before."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

import evalsup
from evalsup.mock.server import MockThread
from tests.harness import finished_run, ids_of, run_cli

N = 20


def test_read_results_refuses_a_second_record_with_the_line_status_prints(tmp_path: Path,
                                                                          mock: MockThread) -> None:
    tasks, run_dir, _args = finished_run(tmp_path, mock, N)
    results = run_dir / "results.jsonl"
    clean = results.read_bytes()
    # a clean run reads as before: every record once, in file order, and in input order
    assert [r["custom_id"] for r in evalsup.read_results(run_dir)] == \
        [orjson.loads(x)["custom_id"] for x in clean.splitlines()]
    assert [r.custom_id for r in evalsup.read_results(run_dir, ordered=True, typed=True)] == \
        [f"t{i}" for i in range(N)]
    assert {r["custom_id"] for r in evalsup.read_results(results)} == ids_of(N)  # the file itself too

    third = clean.splitlines(keepends=True)[2]
    results.write_bytes(clean + third)  # sed -n 3p R/results.jsonl >> R/results.jsonl
    status = run_cli("status", str(run_dir))
    assert status.returncode == 2, status.stderr
    said = status.stderr.strip().removeprefix("evalsup: ")
    tid = orjson.loads(third)["custom_id"]
    assert said.startswith(f"{results}:{N + 1}: a second record for {tid!r} (the first: line 3); run `evalsup "
                           f"repair {run_dir}`"), said

    for read in (lambda: evalsup.read_results(run_dir), lambda: evalsup.read_results(results),
                 lambda: evalsup.read_results(run_dir, typed=True),
                 lambda: evalsup.read_results(run_dir, ordered=True, tasks=tasks)):
        with pytest.raises(evalsup.ResultsDamaged) as got:
            read()  # at the call, before a record is handed out
        assert str(got.value) == said and got.value.code == 2
        assert isinstance(got.value, evalsup.EvalsupError)
    pytest.importorskip("pandas")
    with pytest.raises(evalsup.ResultsDamaged, match="a second record for"):
        evalsup.to_pandas(run_dir)

    # after `evalsup repair` the run reads as before
    assert run_cli("repair", str(run_dir)).returncode == 0
    assert results.read_bytes() == clean
    assert len(evalsup.to_pandas(run_dir)) == N


def test_read_results_names_a_line_that_is_no_record(tmp_path: Path, mock: MockThread) -> None:
    _tasks, run_dir, _args = finished_run(tmp_path, mock, N)
    results = run_dir / "results.jsonl"
    good = results.read_bytes().splitlines(keepends=True)
    results.write_bytes(b"".join(good[:5]) + b"{torn by an editor\n" + b"".join(good[5:]))
    with pytest.raises(evalsup.ResultsDamaged) as got:
        list(evalsup.read_results(run_dir))
    assert str(got.value).startswith(f"{results}:6: not JSON"), got.value
    assert "evalsup repair" in str(got.value)

    # a torn last line (a run killed mid-write, or still writing) is not a result, and no error
    results.write_bytes(b"".join(good) + good[0][:40])
    assert len(list(evalsup.read_results(run_dir))) == N
