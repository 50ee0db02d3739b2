"""Bad input found before the first request (issue 28): the pre-scan reads every line before the endpoint check
and the workers; a stop on bad input never advises a resume; an input with no task says so."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson

from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, read_results, run_cli, write_tasks


def _run(mock: MockThread, tasks: Path, *extra: str) -> list[str]:
    return ["run", "--model", "mock-model", "--base-url", mock.url, str(tasks), *extra]


def test_a_duplicate_id_near_the_end_stops_the_run_before_any_request(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 5000)
    with open(tasks, "ab") as f:
        f.write(b'{"id": "t17", "prompt": "again"}\n')
        f.write(orjson.dumps({"id": "last", "prompt": "x"}) + b"\n")
    r = run_cli(*_run(mock, tasks))
    assert r.returncode == 2, r.stderr
    first = tasks.read_bytes().index(b'{"id":"t17"')
    assert r.stderr.splitlines() == [
        f"evalsup: {tasks}:5001: duplicate id 't17' (first seen at byte {first})  "
        "(fix that line and rerun, or rerun with --on-invalid skip to record bad lines in invalid.jsonl and go on)"]
    assert mock.stats()["requests"] == 0  # no task, no endpoint check: nothing reached the endpoint
    assert not (tmp_path / "t.run").exists()


def test_on_invalid_skip_counts_every_bad_line_first_and_runs_the_rest(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 200)
    with open(tasks, "ab") as f:
        f.write(b'{"id": "t3", "prompt": "dup"}\n{"id": "x", "messages": [\n')  # lines 201, 202
    r = run_cli(*_run(mock, tasks, "--on-invalid", "skip", "-q"))
    assert r.returncode == 0, r.stderr
    assert (f"evalsup: {tasks}: 2 bad lines of 202 will be skipped (--on-invalid skip; recorded in invalid.jsonl "
            "as the run reads them); the first: line 201: duplicate id 't3'") in r.stderr, r.stderr
    assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(200)})
    invalid = [orjson.loads(x) for x in (tmp_path / "t.run" / "invalid.jsonl").read_bytes().splitlines()]
    assert [x["line"] for x in invalid] == [201, 202]
    assert "2 invalid" in r.stdout


def test_an_input_with_no_task_is_one_line_and_exit_2(tmp_path: Path, mock: MockThread) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b"\n  \n\r\n")
    for tasks in (empty, blank):
        r = run_cli(*_run(mock, tasks))
        assert r.returncode == 2, r.stderr
        assert r.stderr == f"evalsup: {tasks}: no task in it\n"
        assert not tasks.with_suffix(".run").exists() and r.stdout == ""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "no id"}\n[1]\n')
    r = run_cli(*_run(mock, bad, "--on-invalid", "skip"))
    assert r.returncode == 2
    assert r.stderr == f"evalsup: {bad}: no task in it (2 bad lines, the first: line 1: missing id: a line needs " \
                       "'custom_id' (batch form) or 'id' (simple form))\n"
    assert mock.stats()["requests"] == 0


def test_a_bad_line_appended_while_the_run_goes_stops_it_and_status_says_bad_input(
        tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 400, extra={"mock": {"delay_s": 0.05}})
    run_dir = tmp_path / "t.run"
    p = start(*_run(mock, tasks, "-w", "1", "-c", "4"))
    deadline = time.monotonic() + 30
    while not (run_dir / "results.jsonl").exists() or (run_dir / "results.jsonl").stat().st_size == 0:
        time.sleep(0.05)
        assert time.monotonic() < deadline and p.running()
    with open(tasks, "ab") as f:
        f.write(b'{"id": "late", "messages": [\n')  # line 401, checked as read
    assert p.finish() == 2
    out, err = p.communicate()
    line = [x for x in err.splitlines() if f"{tasks}:401:" in x]
    assert len(line) == 1 and line[0].startswith(f"evalsup: bad input: {tasks}:401: malformed JSON"), err
    assert "rerun the same command" not in out + err
    assert "stopped" in out and "bad input" in out and "resume" not in out, out  # the final table
    assert len(read_results(run_dir)) == 400  # the lines before it all ran
    st = run_cli("status", str(run_dir))
    head = st.stdout.splitlines()[0]
    assert head.startswith(f"{run_dir}: stopped (bad input: {tasks}:401: malformed JSON"), st.stdout
    assert "resume" not in st.stdout and "exit code   2" in st.stdout, st.stdout
    # the same command again: the pre-scan (from the checkpoint's frontier) meets it before any request
    before = mock.stats()["requests"]
    again = run_cli(*_run(mock, tasks, "-w", "1", "-c", "4"))
    assert again.returncode == 2 and again.stderr.startswith(f"evalsup: {tasks}:401: malformed JSON"), again.stderr
    assert mock.stats()["requests"] == before
    st = run_cli("status", str(run_dir))
    assert st.stdout.startswith(f"{run_dir}: stopped (bad input: {tasks}:401:") and "resume" not in st.stdout, \
        st.stdout
    # fixed: the run ends, its earlier ids are not mistaken for duplicates
    data = tasks.read_bytes()
    tasks.write_bytes(data[: data.rindex(b'{"id": "late"')] + b'{"id": "late", "prompt": "x"}\n')
    fixed = run_cli(*_run(mock, tasks, "-w", "1", "-c", "4", "--fresh"))
    assert fixed.returncode == 0, fixed.stderr


def test_a_resume_checks_only_what_it_has_not_read_and_takes_appended_lines(tmp_path: Path, mock: MockThread,
                                                                          start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 600, extra={"mock": {"delay_s": 0.05}})
    run_dir = tmp_path / "t.run"
    p = start(*_run(mock, tasks, "-w", "1", "-c", "4"))
    deadline = time.monotonic() + 30
    while not (run_dir / "results.jsonl").exists() or (run_dir / "results.jsonl").stat().st_size < 2000:
        time.sleep(0.05)
        assert time.monotonic() < deadline and p.running()
    p.interrupt()
    assert p.returncode == 75
    write_tasks(tmp_path / "more.jsonl", 50, start=600)
    with open(tasks, "ab") as f:
        f.write((tmp_path / "more.jsonl").read_bytes())
    r = run_cli(*_run(mock, tasks, "-w", "2"))
    assert r.returncode == 0, r.stderr
    assert "duplicate" not in r.stderr
    assert_exactly_once(run_dir, {f"t{i}" for i in range(650)})
    # a duplicate of a line read before the checkpoint is still found, before any request
    with open(tasks, "ab") as f:
        f.write(b'{"id": "t1", "prompt": "again"}\n')
    before = mock.stats()["requests"]
    r = run_cli(*_run(mock, tasks, "-w", "2"))
    assert r.returncode == 2 and f"{tasks}:651: duplicate id 't1'" in r.stderr, r.stderr
    assert mock.stats()["requests"] == before
