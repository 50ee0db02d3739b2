"""The unit tier's guard (tests/unit/guard.py) refuses processes and sockets, and lets in-process pipes by."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import subprocess
import sys

import pytest

from tests.unit.guard import ProcessOrSocketInUnitTest, UnitGuard


def test_starting_a_process_fails_naming_the_test(unit_guard: UnitGuard) -> None:
    with pytest.raises(ProcessOrSocketInUnitTest, match=r"test_starting_a_process_fails_naming_the_test: "
                                                        r"subprocess\.Popen"):
        subprocess.Popen([sys.executable, "-c", "pass"])
    with pytest.raises(ProcessOrSocketInUnitTest, match=r"subprocess\.Popen"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(ProcessOrSocketInUnitTest, match=r"os\.fork"):
        os.fork()
    with pytest.raises(ProcessOrSocketInUnitTest, match=r"os\.posix_spawn"):
        os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], dict(os.environ))
    with pytest.raises(ProcessOrSocketInUnitTest, match="multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    assert len(unit_guard.attempts) == 5
    unit_guard.attempts.clear()  # tripped on purpose


def test_opening_a_socket_fails(unit_guard: UnitGuard) -> None:
    with socket.socket() as s, pytest.raises(ProcessOrSocketInUnitTest, match=r"socket\.bind"):
        s.bind(("127.0.0.1", 0))
    with socket.socket() as s, pytest.raises(ProcessOrSocketInUnitTest, match=r"socket\.connect"):
        s.connect(("127.0.0.1", 9))

    async def client() -> None:
        await asyncio.open_connection("127.0.0.1", 9)

    async def server() -> None:
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)

    import uvloop

    for run in (asyncio.run, uvloop.run):
        with pytest.raises(ProcessOrSocketInUnitTest, match="create_connection"):
            run(client())
        with pytest.raises(ProcessOrSocketInUnitTest, match="create_server"):
            run(server())
    assert len(unit_guard.attempts) == 6
    unit_guard.attempts.clear()


def test_a_swallowed_attempt_is_recorded(unit_guard: UnitGuard) -> None:
    """Code that catches the refusal and goes on does not pass: the attempt is recorded, and the guard's
    pytest_runtest_call fails the test after its call for it."""
    with contextlib.suppress(Exception):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    assert len(unit_guard.attempts) == 1
    assert "test_a_swallowed_attempt_is_recorded: socket.connect (a socket) in the unit tier" in unit_guard.attempts[0]
    unit_guard.attempts.clear()


def test_in_process_pipes_are_allowed(unit_guard: UnitGuard) -> None:
    r, w = os.pipe()
    os.write(w, b"x")
    assert os.read(r, 1) == b"x"
    os.close(r)
    os.close(w)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"y")
        assert b.recv(1) == b"y"

    async def loop_runs() -> int:
        await asyncio.sleep(0)
        return 1

    assert asyncio.run(loop_runs()) == 1
    assert unit_guard.attempts == []
