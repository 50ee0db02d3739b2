"""The pre-scan (issue 28): the scan over a task file (tasks/prescan.py) and the verdict the arbiter acts on
(supervisor/input_check.py), without a process or a socket."""

from __future__ import annotations

from pathlib import Path

import orjson

from evalsup.supervisor.input_check import judge
from evalsup.tasks.idindex import IndexBuilder
from evalsup.tasks.idset import IdSet
from evalsup.tasks.prescan import Scan, prescan
from evalsup.tasks.reader import TaskError, TaskReader

MAX = 1 << 20


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    return path


def _task(i: int | str) -> bytes:
    return orjson.dumps({"id": f"t{i}" if isinstance(i, int) else i, "prompt": "q"})


def test_a_clean_file_is_counted_and_its_ids_kept_out_of_the_log(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [_task(i) for i in range(100)] + [b"", b"  "])
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"))
    assert (scan.tasks, scan.invalid, scan.first_bad, scan.end, scan.lines) == (100, 0, None, f.stat().st_size, 102)
    assert scan.index is not None and len(scan.index) == 100
    assert scan.index.take_log() == b""  # ids.bin logs only what the run itself reads


def test_the_runs_reader_finds_each_scanned_line_its_own_and_logs_it_as_it_reads(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [_task(i) for i in range(50)])
    ids = prescan(f, MAX, IndexBuilder(tmp_path / "run")).index
    assert ids is not None
    with TaskReader(f, MAX, ids=ids) as r:
        got = [r.next() for _ in range(50)]
        assert r.next() is None
    assert [g[0].id for g in got if g is not None] == [f"t{i}" for i in range(50)]
    assert len(ids) == 50 and len(ids.take_log()) == 50 * 16


def test_the_first_bad_line_stops_the_scan_as_the_reader_names_it(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [_task(0), _task(1), _task(0), b"{", _task(2)])
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"))
    assert scan.tasks == 2 and scan.invalid == 1 and scan.first_bad is not None
    assert str(scan.first_bad) == f"{f}:3: duplicate id 't0' (first seen at byte 0)"


def test_keep_going_counts_every_bad_line(tmp_path: Path) -> None:
    long = orjson.dumps({"id": "long", "prompt": "x" * 2000})
    f = _write(tmp_path / "t.jsonl", [_task(0), b"{", b"[1]", _task(0), long, b'{"id": "u", "url": "/v1/x"}',
                                      b'{"custom_id": "c", "url": "/v1/nope", "body": {}}', _task(1)])
    scan = prescan(f, 1000, IndexBuilder(tmp_path / "run"), keep_going=True)
    assert (scan.tasks, scan.invalid) == (2, 6)
    assert scan.first_bad is not None and scan.first_bad.line_no == 2


def test_a_resume_scans_from_the_frontier_with_the_ids_read_before_it(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [_task(i) for i in range(10)] + [_task(3)])
    before = IdSet()
    with TaskReader(f, MAX, ids=before) as r:  # the first session read 5 lines
        for _ in range(5):
            r.next()
        frontier = (r.offset, r.line_no, r.index)
    ids = IndexBuilder(tmp_path / "run")
    log = before.take_log()
    ids.add_logged(lambda at, size: log[at:at + size], len(log), chunk=48)  # read as from ids.bin, in chunks
    scan = prescan(f, MAX, ids, start=frontier)
    assert scan.start == frontier[0] and scan.tasks == 5
    assert scan.first_bad is not None and scan.first_bad.line_no == 11 and "duplicate id 't3'" in str(scan.first_bad)


def test_a_stop_asked_ends_the_scan_early(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [_task(i) for i in range(10)])
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"), should_stop=lambda: True)
    assert scan.stopped and scan.tasks == 0


def test_skip_counts_each_duplicate_once_and_the_run_reads_them_as_bad_lines(tmp_path: Path) -> None:
    f = _write(tmp_path / "t.jsonl", [_task(0), _task(1), b"{", _task(0), _task(2), _task(1), _task(0)])
    scan = prescan(f, MAX, IndexBuilder(tmp_path / "run"), keep_going=True)
    assert (scan.tasks, scan.invalid) == (3, 4) and scan.first_bad is not None and scan.first_bad.line_no == 3
    assert scan.index is not None
    bad: list[str] = []
    with TaskReader(f, MAX, ids=scan.index) as r:
        while True:
            try:
                if r.next() is None:
                    break
            except TaskError as e:
                bad.append(str(e).split(": ", 1)[1])
    assert bad == ["malformed JSON (unexpected end of data: line 1 column 2 (char 1))",
                   "duplicate id 't0' (first seen at byte 0)", "duplicate id 't1' (first seen at byte 25)",
                   "duplicate id 't0' (first seen at byte 0)"]


# ----- the verdict -----

def _bad(line: int, reason: str) -> TaskError:
    return TaskError("t.jsonl", line, 0, reason)


def test_a_bad_line_refuses_the_run_in_one_line_that_never_advises_a_resume() -> None:
    v = judge(Scan(tasks=10, invalid=1, first_bad=_bad(11, "malformed JSON")), "t.jsonl", skip=False)
    assert not v.go
    assert v.say == ("t.jsonl:11: malformed JSON  (fix that line and rerun, or rerun with --on-invalid skip to "
                     "record bad lines in invalid.jsonl and go on)")
    assert v.reason == f"bad input: {v.say}" and "resume" not in v.reason


def test_skip_goes_on_and_says_how_many_in_one_line() -> None:
    v = judge(Scan(tasks=98, invalid=2, first_bad=_bad(7, "missing id")), "t.jsonl", skip=True)
    assert v.go and v.say == ("t.jsonl: 2 bad lines of 100 will be skipped (--on-invalid skip; recorded in "
                              "invalid.jsonl as the run reads them); the first: line 7: missing id")
    assert judge(Scan(tasks=5), "t.jsonl", skip=True) == judge(Scan(tasks=5), "t.jsonl", skip=False)
    assert judge(Scan(tasks=5), "t.jsonl", skip=False).say is None


def test_no_task_in_it_is_refused_only_from_the_start() -> None:
    v = judge(Scan(), "t.jsonl", skip=False)
    assert not v.go and v.say == "t.jsonl: no task in it"
    v = judge(Scan(invalid=1, first_bad=_bad(1, "missing id")), "t.jsonl", skip=True)
    assert not v.go and v.say == "t.jsonl: no task in it (1 bad line, the first: line 1: missing id)"
    assert judge(Scan(start=500), "t.jsonl", skip=False).go  # a resume with nothing new: the run ends as it is


def test_a_scan_ended_by_a_signal_leaves_it_to_the_runs_stop() -> None:
    assert judge(Scan(stopped=True), "t.jsonl", skip=False).go


# ----- what status and the table say of a run stopped on bad input -----

def _stopped_run(run_dir: Path, code: int, stopped: str, summary_first: bool) -> None:
    import os
    import time

    from evalsup.rundir.checkpoint import Checkpoint

    run_dir.mkdir()
    cp = Checkpoint(fingerprint={"size": 10, "sha256": "x"}, frontier=5, time=time.time() - 60)
    (run_dir / "checkpoint.json").write_bytes(cp.to_json())
    (run_dir / "results.jsonl").write_bytes(b"")
    summary = run_dir / "summary.json"
    summary.write_bytes(orjson.dumps({"exit_code": 75, "stopped": "interrupted"}))
    t = time.time()
    os.utime(summary, (t - 30, t - 30))
    end = {"t": t if summary_first else t - 50, "event": "end", "code": code, "stopped": stopped}
    (run_dir / "events.jsonl").write_bytes(orjson.dumps({"t": t - 59, "event": "start"}) + b"\n"
                                           + orjson.dumps(end) + b"\n")


def test_status_of_a_run_refused_for_bad_input_says_so_and_never_advises_a_resume(tmp_path: Path) -> None:
    from evalsup.tools.status import RunState, format_run, run_status

    why = "bad input: t.jsonl:9: malformed JSON  (fix that line and rerun, or ...)"
    _stopped_run(tmp_path / "r", 2, why, summary_first=True)  # the refusal's `end` came after the last summary
    st = run_status(tmp_path / "r")
    assert st.state is RunState.STOPPED and st.why == why and st.exit_code == 2
    assert "resume" not in format_run(st)
    _stopped_run(tmp_path / "s", 2, why, summary_first=False)  # an older `end`: the summary says how it ended
    st = run_status(tmp_path / "s")
    assert st.why == "interrupted; rerun the same command to resume" and st.exit_code == 75


def test_the_table_and_the_quiet_line_say_stopped_and_advise_a_resume_only_for_75() -> None:
    from evalsup.supervisor.summary import stopped_how

    assert stopped_how({"exit_code": 2, "stopped": "bad input: t.jsonl:9: x"}) == "bad input: t.jsonl:9: x"
    assert stopped_how({"exit_code": 75, "stopped": "interrupted"}) == \
        "interrupted; rerun the same command to resume"
