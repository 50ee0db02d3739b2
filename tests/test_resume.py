"""Crash safety of a run directory: resume after a kill, a torn last line, SIGTERM drain, a changed input,
--fresh, `evalsup status`, and a full or read-only disk. Real processes, real signals, real files, the mock
on 127.0.0.1. Helpers here (`Proc`, `start`, ...) are also used by test_chaos.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from conftest import assert_exactly_once, env_for, evalsup_cmd, read_results, run_cli, write_tasks

from evalsup.mock.server import MockThread

PLUGIN = Path(__file__).resolve().parent / "plugins" / "faults.py"
LIVENESS_S = 90.0  # how long a step may take before the test calls it stuck (not a performance bound)


# ------------------------------------------------------------------------------------------- helpers


class Proc:
    """One evalsup command in its own session (its workers share its process group), output to files.
    Remembers every worker it saw, so teardown can kill leftovers by PID (and only those)."""

    _count = 0

    def __init__(self, where: Path, *args: str, env: dict[str, str] | None = None) -> None:
        Proc._count += 1
        self.out_path = where / f"evalsup-{Proc._count}.stdout"
        self.err_path = where / f"evalsup-{Proc._count}.stderr"
        self.args = args
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(evalsup_cmd(*args), stdout=out, stderr=err, env=env_for(env),
                                      start_new_session=True)
        self.pid = self.p.pid
        self.seen: dict[int, psutil.Process] = {}

    def workers(self) -> list[psutil.Process]:
        """The live (non-zombie) children of the supervisor, remembered for teardown."""
        try:
            kids = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []
        live = []
        for k in kids:
            try:
                if k.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.NoSuchProcess:
                continue
            self.seen.setdefault(k.pid, k)
            live.append(k)
        return live

    def running(self) -> bool:
        return self.p.poll() is None

    def wait(self, timeout: float = LIVENESS_S) -> int:
        deadline = time.monotonic() + timeout
        while self.p.poll() is None:
            self.workers()
            if time.monotonic() > deadline:
                raise AssertionError(f"evalsup {' '.join(self.args[:1])} still running after {timeout:g}s; "
                                     f"stderr:\n{self.stderr[-3000:]}")
            time.sleep(0.05)
        return self.p.returncode

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL the supervisor and its workers at once (the whole process group, as the OOM killer or a
        node failure would)."""
        self.workers()
        os.killpg(self.pid, signal.SIGKILL)
        self.p.wait()

    def leftovers(self) -> list[int]:
        """Workers seen earlier that still run."""
        out = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def wait_workers_gone(self, timeout: float = 20.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def cleanup(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for proc in self.seen.values():
            try:
                if proc.is_running():  # psutil checks it is still the same process (create time)
                    proc.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """start(*evalsup_args, env=None) -> Proc; everything started is cleaned up (by PID) at teardown."""
    procs: list[Proc] = []

    def _start(*args: str, env: dict[str, str] | None = None) -> Proc:
        p = Proc(tmp_path, *args, env=env)
        procs.append(p)
        return p

    yield _start
    for p in procs:
        p.cleanup()


def run_args(mock: MockThread, tasks: Path, *extra: str) -> tuple[str, ...]:
    # a fixed concurrency (issue 21 made the default adaptive, up to 256): these runs are killed mid-way, and
    # their pace must leave the moment to do it (a later -c in extra wins)
    return ("run", "--model", "mock-model", "--base-url", mock.url, "-c", "64", *extra, str(tasks))


def ids_of(n: int, start: int = 0) -> set[str]:
    return {f"t{i}" for i in range(start, start + n)}


def complete_lines(path: Path) -> int:
    """Complete (newline-terminated) lines of a file; 0 if it does not exist."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def wait_for_lines(proc: Proc, results: Path, at_least: int = 1, timeout: float = LIVENESS_S) -> int:
    """Wait until results.jsonl holds at_least complete lines, while the run is still going."""
    deadline = time.monotonic() + timeout
    while (n := complete_lines(results)) < at_least:
        assert proc.running(), f"run ended (exit {proc.p.returncode}) before {at_least} results:\n{proc.stderr}"
        assert time.monotonic() < deadline, f"no {at_least} results after {timeout:g}s:\n{proc.stderr}"
        proc.workers()
        time.sleep(0.02)
    return n


def wait_until(cond: Callable[[], bool], what: str, timeout: float = LIVENESS_S) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def quiesce(mock: MockThread) -> None:
    """Wait until the mock has nothing in flight and no request of a killed run still arrives (bytes a
    worker wrote just before it died can reach the server after)."""
    last = -1
    deadline = time.monotonic() + LIVENESS_S
    while True:
        st = mock.stats()
        if st["in_flight"] == 0 and st["requests"] == last:
            return
        assert time.monotonic() < deadline, "the mock never went quiet"
        last = st["requests"] if st["in_flight"] == 0 else -1
        time.sleep(0.3)


def chat_requests(mock: MockThread) -> int:
    """Generation requests the mock has seen (not counting the start-up check of /v1/models)."""
    return int(mock.stats()["by_path"].get("/v1/chat/completions", 0))


def resume_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if "resuming:" in x]
    assert len(lines) == 1, f"expected one 'resuming:' line, got {len(lines)}:\n{stderr}"
    return lines[0]


def resumed_done(line: str) -> int:
    m = re.search(r"resuming:\D*([\d,]+) done", line)
    assert m, f"the resume line does not say how many are done: {line!r}"
    return int(m.group(1).replace(",", ""))


def snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under d with its bytes and mtime."""
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}


def summary_of(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "summary.json").read_bytes())  # type: ignore[no-any-return]


def assert_clean_exit(proc: Proc | subprocess.CompletedProcess[str]) -> None:
    err = proc.stderr
    assert "Traceback" not in err, err


def killed_mid_run(tmp_path: Path, mock: MockThread, start: Callable[..., Proc], n: int = 2000,
                   at_least: int = 300) -> tuple[Path, Path, tuple[str, ...]]:
    """A run SIGKILLed (whole process group) while results were coming in; the mock is fast again after."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "3")
    mock.configure(latency_ms=100, jitter_ms=20)
    p = start(*args)
    wait_for_lines(p, run_dir / "results.jsonl", at_least)
    time.sleep(0.3)  # somewhere between flushes and checkpoints
    p.kill_group()
    assert p.wait_workers_gone() == []
    assert complete_lines(run_dir / "results.jsonl") < n, "the run finished before it could be killed"
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    return tasks, run_dir, args


# ------------------------------------------------------------------------------------ resume after a kill


def test_rerun_after_sigkill_resumes_exactly_once(tmp_path: Path, mock: MockThread,
                                                  start: Callable[..., Proc]) -> None:
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
    s = summary_of(run_dir)
    assert s["total"] == s["succeeded"] == n and s["failed"] == 0


def _checkpoint(run_dir: Path) -> dict[str, Any]:
    return orjson.loads((run_dir / "checkpoint.json").read_bytes())  # type: ignore[no-any-return]


def test_second_crash_soon_after_a_resume_is_still_exactly_once(tmp_path: Path, mock: MockThread,
                                                                start: Callable[..., Proc]) -> None:
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


def test_torn_final_line_is_cut_on_resume(tmp_path: Path, mock: MockThread, start: Callable[..., Proc]) -> None:
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
                                                       start: Callable[..., Proc]) -> None:
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


def test_sigterm_drains_exits_0_and_rerun_completes(tmp_path: Path, mock: MockThread,
                                                   start: Callable[..., Proc]) -> None:
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "3", "--grace", "60")
    mock.configure(latency_ms=200, jitter_ms=20)
    p = start(*args)
    wait_for_lines(p, run_dir / "results.jsonl", 1)
    assert mock.stats()["in_flight"] > 0
    p.signal(signal.SIGTERM)
    assert p.wait() == 0, p.stderr
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


def _hung_run(tmp_path: Path, mock: MockThread, start: Callable[..., Proc], grace: str
              ) -> tuple[Proc, Path, tuple[str, ...], int]:
    """A run whose requests in flight hang (the mock stops answering) after some results came in."""
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "2", "--grace", grace)
    mock.configure(latency_ms=20, jitter_ms=5)
    p = start(*args)
    wait_for_lines(p, run_dir / "results.jsonl", 1)
    mock.configure(latency_ms=3_600_000, jitter_ms=0)  # from now on nothing is answered
    wait_until(lambda: mock.stats()["in_flight"] >= 10, "requests hanging in the mock")
    p.signal(signal.SIGTERM)
    wait_until(lambda: "SIGTERM" in p.stderr or not p.running(), "the supervisor to take the SIGTERM")
    return p, run_dir, args, n


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_second_signal_exits_at_once_and_stays_resumable(tmp_path: Path, mock: MockThread,
                                                         start: Callable[..., Proc], second: int) -> None:
    p, run_dir, args, n = _hung_run(tmp_path, mock, start, grace="3600")
    time.sleep(0.5)
    assert p.running(), f"the run did not wait for its hanging requests:\n{p.stderr}"
    p.signal(second)
    p.wait()  # an hour of grace: ending at all means it did not wait for it
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


def test_sigterm_grace_over_exits_0_and_rerun_redoes_the_rest(tmp_path: Path, mock: MockThread,
                                                             start: Callable[..., Proc]) -> None:
    p, run_dir, args, n = _hung_run(tmp_path, mock, start, grace="1")
    assert p.wait() == 0, p.stderr
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


def _append_task(tasks: Path) -> None:
    with open(tasks, "ab") as f:
        f.write(orjson.dumps({"id": "t200", "prompt": "one more"}) + b"\n")


@pytest.mark.parametrize("change", [_append_task, _edit_same_size], ids=["appended", "edited_same_size"])
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
    want = ids_of(n + 1) if change is _append_task else ids_of(n)
    assert_exactly_once(run_dir, want)


# ------------------------------------------------------------------------------ full / read-only disk


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of our own (root only), unmounted at teardown."""
    d = tmp_path / "fs"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d))
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True, timeout=30)


def test_full_disk_stops_clearly_and_rerun_after_growing_completes(tmp_path: Path, mock: MockThread,
                                                                  small_fs: Path) -> None:
    n = 150  # 50 KB responses: about 7.5 MB of results, on 2 MiB
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"kb": 50}})
    run_dir = small_fs / "run"
    args = run_args(mock, tasks, "-w", "2", "-c", "8", "--out", str(run_dir))
    first = run_cli(*args)
    assert first.returncode == 1, f"exit {first.returncode}\n{first.stderr}"
    assert "No space left on device" in first.stderr, first.stderr

    r2 = _mount("-o", "remount,size=64m", str(small_fs))
    assert r2.returncode == 0, r2.stderr
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    resume_line(r.stderr)
    recs = assert_exactly_once(run_dir, ids_of(n))  # nothing lost, nothing doubled, every line parses
    assert all(x["error"] is None for x in recs)
    s = summary_of(run_dir)
    assert s["total"] == s["succeeded"] == n
    assert_clean_exit(first)  # the disk-full stop was a clear message, not a traceback


def test_read_only_run_dir_is_a_clear_error(tmp_path: Path, mock: MockThread, start: Callable[..., Proc],
                                            small_fs: Path) -> None:
    assert _mount("-o", "remount,size=64m", str(small_fs)).returncode == 0
    n = 2000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = small_fs / "run"
    args = run_args(mock, tasks, "-w", "2", "--out", str(run_dir))
    mock.configure(latency_ms=100, jitter_ms=20)
    p = start(*args)
    wait_for_lines(p, run_dir / "results.jsonl", 200)
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
