"""The unit tier's guard: no process, no socket. Every test in tests/unit/ runs under it (an autouse fixture in
tests/unit/conftest.py): starting a process or opening a network connection fails the test, naming it and what
it tried; a test that needs either belongs in tests/integration/ (or tests/slow/).

Refused while a unit test runs (setup, call and teardown):

* processes: ``subprocess.Popen`` (so ``subprocess.run``/``check_output`` and asyncio's subprocesses on the
  standard loop), ``os.fork``, ``os.forkpty``, ``os.posix_spawn``/``posix_spawnp``, ``os.system``, ``os.popen``,
  ``multiprocessing`` process start (so ``ProcessPoolExecutor``), and an event loop's ``subprocess_exec`` /
  ``subprocess_shell`` (uvloop spawns through libuv, not ``Popen``);
* sockets: ``socket.socket.connect``/``connect_ex``/``bind``/``sendto`` (a client, a server, UDP; TCP and
  unix-domain alike), and an event loop's ``create_connection``/``create_server``/``create_unix_connection``/
  ``create_unix_server``/``create_datagram_endpoint``/``sock_connect`` (uvloop opens its sockets in C).

Allowed: threads, ``os.pipe``, ``socket.socketpair`` (an anonymous, in-process pair: no address, nothing to
connect to, and how an event loop wakes itself), FIFOs and files under ``tmp_path``, name lookups that never
connect. The refusal raises ``ProcessOrSocketInUnitTest``; in case the code under test swallows it (a broad
``except``), the attempt is also recorded and fails the test after its call all the same. A test that means
to trip the guard (tests/unit/test_unit_guard.py) takes the ``unit_guard`` fixture and clears what it
recorded.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any

import pytest


class ProcessOrSocketInUnitTest(RuntimeError):
    """A unit test started a process or opened a socket."""


class UnitGuard:
    def __init__(self, test: str) -> None:
        self.test = test
        self.attempts: list[str] = []

    def refuse(self, what: str) -> None:
        msg = (f"{self.test}: {what} in the unit tier (no process, no socket here); "
               f"move the test to tests/integration/ or tests/slow/")
        self.attempts.append(msg)
        raise ProcessOrSocketInUnitTest(msg)


def _refusing(guard: UnitGuard, what: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        guard.refuse(what)

    return refused


def _loops() -> list[type]:
    loops: list[type] = [asyncio.BaseEventLoop]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency of evalsup
        return loops
    return [*loops, uvloop.Loop]


_PROCESS_CALLS = {
    os: ["fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen"],
}
_SOCKET_METHODS = ["connect", "connect_ex", "bind", "sendto"]
_LOOP_METHODS = ["create_connection", "create_server", "create_unix_connection", "create_unix_server",
                 "create_datagram_endpoint", "sock_connect", "subprocess_exec", "subprocess_shell"]


def install(guard: UnitGuard, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refuse processes and sockets until ``monkeypatch`` is undone (the end of the test)."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refusing(guard, "subprocess.Popen (a process)"))
    for module, names in _PROCESS_CALLS.items():
        for name in names:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _refusing(guard, f"{module.__name__}.{name} (a process)"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        _refusing(guard, "multiprocessing start (a process)"))
    for name in _SOCKET_METHODS:
        monkeypatch.setattr(socket.socket, name, _refusing(guard, f"socket.{name} (a socket)"))
    for loop in _loops():
        for name in _LOOP_METHODS:
            what = "a process" if name.startswith("subprocess") else "a socket"
            monkeypatch.setattr(loop, name, _refusing(guard, f"event loop {name} ({what})"))
