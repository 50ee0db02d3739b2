"""Inputs that are not a plain JSONL file (.jsonl.gz, .jsonl.zst, stdin, a FIFO), each resumed after a kill -9
exactly once; run options defined once, with an explicit 0 honoured. Real processes, pipes and files, the mock
on 127.0.0.1."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import LIVENESS_S, Run, assert_exactly_once, env_for, evalsup_cmd, run_cli, wait_until, write_tasks


@pytest.fixture
def slow_mock() -> Iterator[MockThread]:
    """20 ms a request: a run of a few hundred tasks at concurrency 8 lasts long enough to be killed mid-way."""
    with MockThread(MockConfig(latency_ms=20, seed=1)) as m:
        yield m


def complete_lines(path: Path) -> int:
    if not path.exists():
        return 0
    data = path.read_bytes()
    return data.count(b"\n")


def fifo_writer(fifo: Path, data: bytes) -> threading.Thread:
    def write() -> None:
        with open(fifo, "wb") as f:  # blocks until evalsup opens the FIFO for reading
            f.write(data)
    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


# ----------------------------------------------------------------------------------------- each input kind

def _compress(kind: str, data: bytes, dest: Path) -> Path:
    if kind == "gz":
        dest.write_bytes(gzip.compress(data))
    else:
        import zstandard

        dest.write_bytes(zstandard.ZstdCompressor().compress(data))
    return dest


@pytest.mark.parametrize("kind", ["gz", "zst", "stdin", "fifo"])
def test_input_kind_resumes_after_kill9_exactly_once(tmp_path: Path, slow_mock: MockThread, kind: str,
                                                     start: Callable[..., Run]) -> None:
    n = 400
    plain = write_tasks(tmp_path / "plain.jsonl", n)
    data = plain.read_bytes()
    run_dir = tmp_path / "out.run"
    feed: bytes | None = None
    if kind in ("gz", "zst"):
        src = str(_compress(kind, data, tmp_path / f"tasks.jsonl.{kind}"))
    elif kind == "stdin":
        src, feed = "-", data
    else:
        os.mkfifo(tmp_path / "fifo")
        src = str(tmp_path / "fifo")
    args = ["run", src, "--out", str(run_dir), "--base-url", slow_mock.url, "--model", "mock-model",
            "--workers", "1", "--concurrency", "8", "--quiet"]

    def go() -> Run:
        if kind == "fifo":
            fifo_writer(tmp_path / "fifo", data)
        return start(*args, stdin=feed)

    p = go()
    results = run_dir / "results.jsonl"
    wait_until(lambda: complete_lines(results) >= 40, "the first results")
    p.kill_group()  # the supervisor and its workers at once, as the OOM killer would
    p.wait_workers_gone(LIVENESS_S)
    done_before = complete_lines(results)
    assert done_before < n, "the run finished before it could be killed"
    copy = run_dir / "tasks.jsonl"
    assert copy.read_bytes() == data  # the run read its own plain copy of the (decompressed) input
    mtime = copy.stat().st_mtime_ns

    p = go()
    out, err = p.communicate()
    assert p.returncode == 0, err
    assert err == ""  # --quiet: no "resuming:" line (issue 28), only the final line, which says it resumed
    this_session = re.search(rf"finished: {n} done \(\d+ ok, \d+ failed\), (\d+) this session", out)
    assert this_session is not None and int(this_session.group(1)) <= n - done_before, out
    assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    assert copy.stat().st_mtime_ns == mtime  # resumed from the same copy, not a new one


def test_gz_is_not_decompressed_again_on_resume_and_default_run_dir(tmp_path: Path, mock: MockThread) -> None:
    data = write_tasks(tmp_path / "plain.jsonl", 30).read_bytes()
    src = _compress("gz", data, tmp_path / "tasks.jsonl.gz")
    args = ("run", str(src), "--base-url", mock.url, "--model", "mock-model", "--quiet")
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tasks.run"  # tasks.jsonl.gz -> tasks.run, as tasks.jsonl -> tasks.run
    info = orjson.loads((run_dir / "input.json").read_bytes())
    assert info["kind"] == "gzip" and info["bytes"] == len(data)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert orjson.loads((run_dir / "input.json").read_bytes()) == info  # the same copy, untouched
    assert_exactly_once(run_dir, {f"t{i}" for i in range(30)})


def test_stdin_with_other_content_is_refused_once_the_run_has_results(tmp_path: Path, mock: MockThread) -> None:
    run_dir = tmp_path / "r"
    args = ["run", "-", "--out", str(run_dir), "--base-url", mock.url, "--model", "mock-model", "--quiet"]
    first = write_tasks(tmp_path / "a.jsonl", 10).read_bytes()
    p = subprocess.run(evalsup_cmd(*args), input=first, capture_output=True, env=env_for(), timeout=LIVENESS_S)
    assert p.returncode == 0, p.stderr
    before = (run_dir / "results.jsonl").read_bytes()
    other = write_tasks(tmp_path / "b.jsonl", 12).read_bytes()
    p = subprocess.run(evalsup_cmd(*args), input=other, capture_output=True, env=env_for(), timeout=LIVENESS_S)
    err = p.stderr.decode().strip()
    assert p.returncode == 2
    assert err == (f"evalsup: stdin: not the tasks the run in {run_dir} started with (its copy {run_dir}/tasks.jsonl); "
                   "rerun with --fresh (fresh=True) to start over, or use another --out")
    assert (run_dir / "results.jsonl").read_bytes() == before and (run_dir / "tasks.jsonl").read_bytes() == first


@pytest.mark.parametrize("case", ["not_gzip", "truncated", "stdin_without_out", "missing", "bad_line"])
def test_bad_inputs_are_one_clear_line(tmp_path: Path, mock: MockThread, case: str) -> None:
    data = write_tasks(tmp_path / "plain.jsonl", 50).read_bytes()
    src = tmp_path / "tasks.jsonl.gz"
    extra: list[str] = []
    if case == "not_gzip":
        src.write_bytes(data)
        want = f"evalsup: {src}: not a gzip file (its first bytes are not gzip's)"
    elif case == "truncated":
        src.write_bytes(gzip.compress(data)[:-40])
        want = f"evalsup: {src}: not a valid gzip stream (Compressed file ended before the end-of-stream marker"
    elif case == "stdin_without_out":
        src = Path("-")
        want = "evalsup: reading tasks from stdin (-) needs --out RUN_DIR (where its copy and the results go)"
    elif case == "missing":
        src = tmp_path / "nope.jsonl.gz"
        want = f"evalsup: {src}: no such file"
    else:
        src.write_bytes(gzip.compress(data.replace(b'"t3"', b't3')))
        extra = ["--out", str(tmp_path / "r")]
        want = f"evalsup: {tmp_path}/r/tasks.jsonl:4: malformed JSON"
    r = run_cli("run", str(src), "--base-url", mock.url, "--model", "mock-model", "--quiet", *extra)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(want), r.stderr


# --------------------------------------------------------------------------------- options defined once


def test_scorer_timeout_zero_in_a_run_times_every_scorer_out(tmp_path: Path, mock: MockThread) -> None:
    """--scorer-timeout 0 was read as 30 s (`x or 30.0`): every score was computed. Now each times out."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 20, extra={"expected": "x"})
    r = run_cli("run", str(tasks), "--base-url", mock.url, "--model", "mock-model", "--quiet",
                "--scorer", "exact_match", "--scorer-timeout", "0")
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(tmp_path / "tasks.run", {f"t{i}" for i in range(20)})
    assert all("longer than --scorer-timeout 0s" in rec["score_errors"]["exact_match"] for rec in recs)


def test_a_compressed_input_is_not_copied_into_a_run_directory_another_run_holds(tmp_path: Path,
                                                                                    mock: MockThread) -> None:
    from evalsup.rundir.lock import RunDirLock

    src = tmp_path / "t.jsonl.gz"
    src.write_bytes(gzip.compress(write_tasks(tmp_path / "t.jsonl", 20).read_bytes()))
    run_dir = tmp_path / "held.run"
    other = RunDirLock(run_dir)  # another evalsup's run holds the directory
    other.acquire()
    try:
        r = run_cli("run", str(src), "--out", str(run_dir), "--base-url", mock.url, "--model", "mock-model")
    finally:
        other.release()
    assert r.returncode == 73, r.stderr
    assert "in use by another evalsup" in r.stderr and "Traceback" not in r.stderr
    assert not (run_dir / "tasks.jsonl").exists()  # nothing written under the other run
    r = run_cli("run", str(src), "--out", str(run_dir), "--base-url", mock.url, "--model", "mock-model")
    assert r.returncode == 0, r.stderr
    assert_exactly_once(run_dir, {f"t{i}" for i in range(20)})
