"""The workers' processes start while the input is read (their interpreters import while the pre-scan runs):
a run refused at the start (a bad line, an endpoint that does not answer) sends nothing and leaves none of them
behind, and a run that goes ahead gives them their settings and leaves none behind either."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import uuid
from pathlib import Path

from evalsup.mock.server import MockThread
from evalsup.supervisor.workers import launch, worker_module
from tests.harness import assert_exactly_once, chat_requests, run_cli


def _ours(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (the run's and its children's, nobody else's)."""
    found = []
    needle = f"EVALSUP_TEST_MARK={mark}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if needle in env.split(b"\0") and not zombie:
            found.append(int(pid))
    return found


def _tasks(path: Path, n: int, bad_at: int | None = None) -> Path:
    rows = [b'{"id": "t%d", "prompt": "q%d"}' % (i, i) if i != bad_at else b'{"id": "t%d", "prompt": ' % i
            for i in range(n)]
    path.write_bytes(b"\n".join(rows) + b"\n")
    return path


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_run_refused_for_a_bad_line_leaves_no_worker_behind(tmp_path: Path, mock: MockThread) -> None:
    mark = uuid.uuid4().hex
    tasks = _tasks(tmp_path / "bad.jsonl", 20_000, bad_at=19_999)  # the pre-scan reads to the end first
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                env={"EVALSUP_TEST_MARK": mark})
    assert r.returncode == 2, r.stderr
    assert "bad.jsonl:20000" in r.stderr and "Traceback" not in r.stderr
    assert chat_requests(mock) == 0
    assert _ours(mark) == []  # both workers' processes were started during the pre-scan: killed and reaped
    assert not (tmp_path / "bad.run").exists()


def test_a_run_refused_by_the_endpoint_check_leaves_no_worker_behind(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    tasks = _tasks(tmp_path / "t.jsonl", 50)
    r = run_cli("run", "-w", "3", "--model", "m", "--base-url", f"http://127.0.0.1:{_closed_port()}/v1",
                "--max-wait-down", "0", str(tasks), env={"EVALSUP_TEST_MARK": mark})
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert _ours(mark) == []


def test_a_run_uses_the_workers_it_started_ahead_and_leaves_none(tmp_path: Path, mock: MockThread) -> None:
    mark = uuid.uuid4().hex
    tasks = _tasks(tmp_path / "t.jsonl", 300)
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                env={"EVALSUP_TEST_MARK": mark})
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(300)})
    assert chat_requests(mock) == 300
    assert _ours(mark) == []


def test_a_process_launched_ahead_and_never_given_its_settings_is_killed_and_its_pipes_closed() -> None:
    async def go() -> tuple[int | None, list[int]]:
        started = await launch(worker_module(False), 1 << 20)
        started.discard()  # while its interpreter still imports
        code = await asyncio.wait_for(started.proc.wait(), 30)
        still_open = []
        for fd in (started.to_child, started.from_child):
            try:
                os.fstat(fd)
                still_open.append(fd)
            except OSError:
                pass
        started.discard()  # twice: nothing closed again (a descriptor may have been reused)
        return code, still_open

    code, still_open = asyncio.run(go())
    assert code == -signal.SIGKILL
    assert still_open == []
