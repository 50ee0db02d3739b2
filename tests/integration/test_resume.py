"""Crash safety of a run directory: resume after a kill, a torn last line, SIGTERM drain, a changed input,
--fresh, `evalsup status`, and a full or read-only disk. Real processes, real signals, real files, the mock
on 127.0.0.1. The harness (`Run`, `start`, `wait_until`...) is tests/conftest.py's."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.config.exitcodes import RESUMABLE
from evalsup.mock.server import MockThread
from tests.harness import (
    Run,
    assert_clean_exit,
    assert_exactly_once,
    chat_requests,
    complete_lines,
    ids_of,
    killed_mid_run,
    quiesce,
    read_results,
    resume_line,
    resumed_done,
    run_args,
    run_cli,
    snapshot,
    summary,
    wait_until,
    write_tasks,
)
from tests.harness import mount as _mount

# ------------------------------------------------------------------------------------------- helpers




# ------------------------------------------------------------------------------------ resume after a kill


def test_rerun_after_sigkill_resumes_exactly_once(tmp_path: Path, mock: MockThread,
                                                  start: Callable[..., Run]) -> None:
    n = 2000
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n)
    done_before = complete_lines(run_dir / "results.jsonl")
    prefix = (run_dir / "results.jsonl").read_bytes()
    prefix = prefix[: prefix.rfind(b"\n") + 1]
    mock.reset_stats()
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    line = resume_line(r.stderr)
    assert resumed_done(line) == done_before, line  # it found what was there, torn line or not
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)
    # what was there is kept as it was, and only what was missing was asked for again
    assert (run_dir / "results.jsonl").read_bytes().startswith(prefix)
    assert chat_requests(mock) == n - done_before
    s = summary(run_dir)
    assert s["total"] == s["succeeded"] == n and s["failed"] == 0


def _checkpoint(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "checkpoint.json").read_bytes())  # type: ignore[no-any-return]


def test_second_crash_soon_after_a_resume_is_still_exactly_once(tmp_path: Path, mock: MockThread,
                                                                start: Callable[..., Run]) -> None:
    """Crash; rerun; crash again after the rerun wrote its first checkpoint but before it got far; rerun.
    The records written after the first run's last checkpoint must not be redone by the third run."""
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    results = run_dir / "results.jsonl"
    args = run_args(mock, tasks, "-w", "2")
    mock.configure(latency_ms=100, jitter_ms=20)
    a = start(*args)
    # kill just after a flush that came after the last checkpoint: records past the checkpoint's results_len
    wait_until(lambda: ((run_dir / "checkpoint.json").exists() and results.exists()
                        and results.stat().st_size > _checkpoint(run_dir)["results_len"] > 0) or not a.running(),
               "records written after a checkpoint")
    a.kill_group()
    assert a.wait_workers_gone() == []
    assert complete_lines(results) > 0 and results.stat().st_size > _checkpoint(run_dir)["results_len"]
    done_a = complete_lines(results)

    # the rerun: requests are slow now, so it checkpoints before it has read far
    quiesce(mock)
    mock.configure(latency_ms=5000, jitter_ms=0)
    cp_mtime = (run_dir / "checkpoint.json").stat().st_mtime_ns
    b = start(*args[:-1], "-w", "1", "-c", "1", args[-1])
    wait_until(lambda: (run_dir / "checkpoint.json").stat().st_mtime_ns != cp_mtime or not b.running(),
               "the rerun's first checkpoint")
    b.kill_group()
    assert b.wait_workers_gone() == []
    assert resumed_done(resume_line(b.stderr)) == done_a

    mock.configure(latency_ms=5, jitter_ms=2)
    done_b = complete_lines(results)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert resumed_done(resume_line(r.stderr)) == done_b
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)


def test_torn_final_line_is_cut_on_resume(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    n = 2000
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n)
    results = run_dir / "results.jsonl"
    data = results.read_bytes()
    data = data[: data.rfind(b"\n") + 1]  # the kill may itself have torn it; keep the complete lines
    last = data.splitlines(keepends=True)[-1]
    results.write_bytes(data + last[: len(last) // 2])  # half a record, as a crash in the middle of a write
    done_before = data.count(b"\n")
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    line = resume_line(r.stderr)
    assert "torn" in line, line
    assert resumed_done(line) == done_before, line
    assert results.read_bytes().startswith(data)
    recs = assert_exactly_once(run_dir, ids_of(n))  # every line parses: the half line is gone
    assert all(x["error"] is None for x in recs)


def test_status_reads_a_stopped_run_without_touching_it(tmp_path: Path, mock: MockThread,
                                                       start: Callable[..., Run]) -> None:
    n = 2000
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n)
    results = run_dir / "results.jsonl"
    with open(results, "ab") as f:
        f.write(b'{"id": "t999999", "custom_id": "t9')  # a torn last line that status must leave alone
    done = complete_lines(results)
    before = snapshot(run_dir)
    time.sleep(0.02)  # so that a rewrite would show in the mtimes
    r = run_cli("status", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    assert f"{done:,}" in r.stdout, f"status does not show the {done:,} done:\n{r.stdout}"
    assert snapshot(run_dir) == before, "evalsup status changed the run directory"

    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(run_dir, ids_of(n))
    before = snapshot(run_dir)
    r = run_cli("status", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert "finished" in r.stdout and f"{n:,}" in r.stdout, r.stdout
    assert snapshot(run_dir) == before, "evalsup status changed the run directory"


# ------------------------------------------------------------------------------------------- SIGTERM


@pytest.mark.parametrize("to", ["supervisor", "group"])
def test_sigterm_drains_exits_75_and_rerun_completes(tmp_path: Path, mock: MockThread,
                                                    start: Callable[..., Run], to: str) -> None:
    """SIGTERM to the supervisor, or to every process of the run at once (scancel, docker stop, a pod's
    deletion): the same drain, the same resumable exit, no request redone."""
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "3", "--grace", "60")
    mock.configure(latency_ms=200, jitter_ms=20)
    p = start(*args)
    p.wait_results(run_dir, 1)
    assert mock.stats()["in_flight"] > 0
    if to == "group":
        assert len(p.workers()) == 3
        os.killpg(p.pid, signal.SIGTERM)  # the supervisor and its workers, at once
    else:
        p.signal(signal.SIGTERM)
    assert p.finish() == RESUMABLE, p.stderr
    assert_clean_exit(p)
    assert any("resume" in x for x in p.stderr.splitlines()), f"no line says how to resume:\n{p.stderr}"
    assert p.wait_workers_gone() == [], "workers outlived their supervisor"
    recs = read_results(run_dir)
    done = len(recs)
    assert len({x["custom_id"] for x in recs}) == done < n  # it stopped dispatching
    assert all(x["error"] is None for x in recs)  # in-flight requests finished, none was cut off
    assert mock.stats()["in_flight"] == 0
    assert chat_requests(mock) == done, "requests were started that did not reach results.jsonl"
    assert (run_dir / "checkpoint.json").exists()

    mock.configure(latency_ms=5, jitter_ms=2)
    mock.reset_stats()
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert resumed_done(resume_line(r.stderr)) == done
    assert chat_requests(mock) == n - done, "a drained run left work to be done twice"
    assert_exactly_once(run_dir, ids_of(n))


def _hung_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run], grace: str
              ) -> tuple[Run, Path, tuple[str, ...], int]:
    """A run whose requests in flight hang (the mock stops answering) after some results came in."""
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "2", "--grace", grace)
    mock.configure(latency_ms=20, jitter_ms=5)
    p = start(*args)
    p.wait_results(run_dir, 1)
    mock.configure(latency_ms=3_600_000, jitter_ms=0)  # from now on nothing is answered
    wait_until(lambda: mock.stats()["in_flight"] >= 10, "requests hanging in the mock")
    # those may still be fast ones sent before the hang: wait until nothing more is answered (else the drain
    # finishes them, and the run ends at once)
    before = None
    while (answered := sum(mock.stats()["statuses"].values())) != before:
        before = answered
        time.sleep(0.2)
    p.signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM" in p.stderr or not p.running(), "the supervisor to take the SIGTERM")
    return p, run_dir, args, n


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_second_signal_exits_at_once_and_stays_resumable(tmp_path: Path, mock: MockThread,
                                                         start: Callable[..., Run], second: int) -> None:
    p, run_dir, args, n = _hung_run(tmp_path, mock, start, grace="3600")
    time.sleep(0.5)
    assert p.running(), f"the run did not wait for its hanging requests:\n{p.stderr}"
    p.signal(second)
    assert p.finish() == RESUMABLE, p.stderr  # an hour of grace: ending at all means it did not wait for it
    assert_clean_exit(p)
    assert any("resume" in x for x in p.stderr.splitlines()), f"no line says how to resume:\n{p.stderr}"
    assert p.wait_workers_gone() == [], "workers outlived their supervisor"
    recs = read_results(run_dir)
    assert len(recs) == len({x["custom_id"] for x in recs})

    mock.configure(latency_ms=5, jitter_ms=2)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    resume_line(r.stderr)
    assert_exactly_once(run_dir, ids_of(n))


def test_sigterm_grace_over_exits_75_and_rerun_redoes_the_rest(tmp_path: Path, mock: MockThread,
                                                              start: Callable[..., Run]) -> None:
    p, run_dir, args, n = _hung_run(tmp_path, mock, start, grace="1")
    assert p.finish() == RESUMABLE, p.stderr
    assert_clean_exit(p)
    assert any("resume" in x for x in p.stderr.splitlines()), f"no line says how to resume:\n{p.stderr}"
    assert p.wait_workers_gone() == []
    done = complete_lines(run_dir / "results.jsonl")

    mock.configure(latency_ms=5, jitter_ms=2)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert resumed_done(resume_line(r.stderr)) == done
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)


# ------------------------------------------------------------------------------- changed input, --fresh


def _edit_same_size(tasks: Path) -> None:
    st = tasks.stat()
    data = tasks.read_bytes()
    assert b'"q7"' in data
    tasks.write_bytes(data.replace(b'"q7"', b'"z7"', 1))
    os.utime(tasks, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: only the content differs


def _edit_and_append(tasks: Path) -> None:
    """An edited line and one appended: growing is fine (test_resume_guard.py), an edit is not."""
    tasks.write_bytes(tasks.read_bytes().replace(b'"q7"', b'"z7"', 1))
    with open(tasks, "ab") as f:
        f.write(orjson.dumps({"id": "t200", "prompt": "one more"}) + b"\n")


@pytest.mark.parametrize("change", [_edit_and_append, _edit_same_size], ids=["edited_and_appended",
                                                                               "edited_same_size"])
def test_changed_input_is_refused_and_fresh_moves_the_old_run_aside(tmp_path: Path, mock: MockThread,
                                                                    change: Callable[[Path], None]) -> None:
    n = 200
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "2")
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    change(tasks)
    before = snapshot(run_dir)

    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert_clean_exit(r)
    assert "changed" in r.stderr and "--fresh" in r.stderr, r.stderr
    assert snapshot(run_dir) == before, "a refused rerun changed the run directory"

    r = run_cli(*args[:-1], "--fresh", args[-1])
    assert r.returncode == 0, r.stderr
    assert "resuming:" not in r.stderr
    aside = [d for d in tmp_path.iterdir() if d.is_dir() and d.name.startswith("tasks.run") and d != run_dir]
    assert len(aside) == 1, f"old run directory not found beside the new one: {sorted(tmp_path.iterdir())}"
    assert str(aside[0]) in r.stderr, r.stderr  # the user is told where it went
    assert {k: v[0] for k, v in snapshot(aside[0]).items()} == {k: v[0] for k, v in before.items()}
    want = ids_of(n + 1) if change is _edit_and_append else ids_of(n)
    assert_exactly_once(run_dir, want)


# ------------------------------------------------------------------------------ full / read-only disk


def test_full_disk_stops_clearly_and_rerun_after_growing_completes(tmp_path: Path, mock: MockThread,
                                                                  small_fs: Path) -> None:
    n = 150  # 50 KB responses: about 7.5 MB of results, on 2 MiB
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"kb": 50}})
    run_dir = small_fs / "run"
    args = run_args(mock, tasks, "-w", "2", "-c", "8", "--out", str(run_dir))
    first = run_cli(*args)
    assert first.returncode == RESUMABLE, f"exit {first.returncode}\n{first.stderr}"
    assert "No space left on device" in first.stderr, first.stderr

    r2 = _mount("-o", "remount,size=64m", str(small_fs))
    assert r2.returncode == 0, r2.stderr
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    resume_line(r.stderr)
    recs = assert_exactly_once(run_dir, ids_of(n))  # nothing lost, nothing doubled, every line parses
    assert all(x["error"] is None for x in recs)
    s = summary(run_dir)
    assert s["total"] == s["succeeded"] == n
    assert_clean_exit(first)  # the disk-full stop was a clear message, not a traceback


def test_read_only_run_dir_is_a_clear_error(tmp_path: Path, mock: MockThread, start: Callable[..., Run],
                                            small_fs: Path) -> None:
    assert _mount("-o", "remount,size=64m", str(small_fs)).returncode == 0
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = small_fs / "run"
    args = run_args(mock, tasks, "-w", "2", "--out", str(run_dir))
    mock.configure(latency_ms=100, jitter_ms=20)
    p = start(*args)
    p.wait_results(run_dir, 200)
    p.kill_group()
    assert p.wait_workers_gone() == []
    mock.configure(latency_ms=5, jitter_ms=2)
    with open(run_dir / "results.jsonl", "ab") as f:
        f.write(b'{"id": "t1", "cust')  # as a crash in the middle of a write leaves it
    before = snapshot(run_dir)

    r = _mount("-o", "remount,ro", str(small_fs))
    assert r.returncode == 0, r.stderr
    refused = run_cli(*args)
    assert refused.returncode != 0, refused.stderr
    assert "Read-only file system" in refused.stderr, refused.stderr
    assert snapshot(run_dir) == before

    assert _mount("-o", "remount,rw", str(small_fs)).returncode == 0
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    resume_line(r.stderr)
    assert_exactly_once(run_dir, ids_of(n))
    assert_clean_exit(refused)  # the read-only stop was a clear message, not a traceback
