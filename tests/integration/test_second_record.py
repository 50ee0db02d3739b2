"""A record appended after the checkpoint for a task done before it (issue 39 item 5): `sed -n 3p
R/results.jsonl >> R/results.jsonl; evalsup run t.jsonl` said "21 done" of 20 tasks, exit 0, and status, score
and report counted it. Now the resume, status, score and report refuse it in one line naming both lines and
saying what `evalsup repair` does; after the repair the run is 20 tasks, each once, and nothing is sent again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from evalsup.mock.server import MockThread
from tests.harness import (
    Run,
    assert_clean_exit,
    assert_exactly_once,
    chat_requests,
    finished_run,
    ids_of,
    killed_mid_run,
    run_cli,
)


def test_a_record_appended_for_a_task_already_done_is_refused_everywhere_then_repaired(
        tmp_path: Path, mock: MockThread) -> None:
    _tasks, run_dir, args = finished_run(tmp_path, mock, 20)
    results = run_dir / "results.jsonl"
    third = results.read_bytes().splitlines(keepends=True)[2]
    with open(results, "ab") as f:
        f.write(third)  # sed -n 3p R/results.jsonl >> R/results.jsonl
    tid = orjson.loads(third)["custom_id"]
    said = (f"evalsup: {results}:21: a second record for {tid!r} (the first: line 3); run `evalsup repair "
            f"{run_dir}` to move it to damaged.jsonl (the first stays: the task is done and does not run again)")
    sent = chat_requests(mock)

    r = run_cli(*args)
    assert (r.returncode, r.stderr.splitlines()[-1]) == (2, said), r.stderr  # after the endpoint check's line
    assert "21 done" not in r.stdout + r.stderr
    assert_clean_exit(r)
    for cmd, code in ((("status", str(run_dir)), 2), (("score", str(run_dir), "--scorer", "json_valid"), 2),
                      (("report", str(run_dir)), 1)):  # each with the exit code it gives a damaged line
        r = run_cli(*cmd)
        assert (r.returncode, r.stderr.splitlines()) == (code, [said]), (cmd, r.stderr)
        assert_clean_exit(r)
    assert not (run_dir / "results.scored.jsonl").exists() and not (run_dir / "report.html").exists()

    r = run_cli("repair", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert f"results.jsonl:21 (a second record for {tid!r}" in r.stdout, r.stdout
    moved = [orjson.loads(x) for x in (run_dir / "damaged.jsonl").read_bytes().splitlines()]
    assert [(m["line"], m["raw"].encode()) for m in moved] == [(21, third)]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent  # the task kept its first record: nothing is asked again
    assert_exactly_once(run_dir, ids_of(20))
    st = orjson.loads(run_cli("status", str(run_dir), "--json").stdout)
    assert (st["done"], st["ok"]) == (20, 20)
    r = run_cli("score", str(run_dir), "--scorer", "json_valid")
    assert r.returncode == 0, r.stderr
    assert len((run_dir / "results.scored.jsonl").read_bytes().splitlines()) == 20


def test_after_a_kill_the_records_past_the_checkpoint_are_taken_and_a_copied_one_refused(
        tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    """A run killed mid-way (most often with records past its checkpoint: tasks outstanding then, or read after
    it, which the resume takes); one more line, a copy of its fifth record, is refused first."""
    n = 2000
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n)
    results = run_dir / "results.jsonl"
    data = results.read_bytes()
    data = data[: data.rfind(b"\n") + 1]
    first = data.splitlines(keepends=True)[4]  # covered by the checkpoint, unless the kill came before its first
    results.write_bytes(data + first)
    tid = orjson.loads(first)["custom_id"]
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    line = data.count(b"\n") + 1
    assert f"results.jsonl:{line}: a second record for {tid!r} (the first: line 5)" in r.stderr, r.stderr
    assert_clean_exit(r)
    assert run_cli("repair", str(run_dir)).returncode == 0
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(run_dir, ids_of(n))
