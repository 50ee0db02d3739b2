"""The unit tier: no process, no socket. Every test here runs under the guard of tests/unit/guard.py (what it
refuses and what it allows are listed there): a test that starts a process or opens a socket fails, naming
itself and what it tried; such a test belongs in tests/integration/ (or tests/slow/)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.guard import UnitGuard, install

_GUARD = pytest.StashKey[UnitGuard]()


@pytest.fixture(autouse=True)
def unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[UnitGuard]:
    guard = UnitGuard(request.node.nodeid)
    install(guard, monkeypatch)
    request.node.stash[_GUARD] = guard
    yield guard


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Fail a test whose attempt the code under test caught and went on from."""
    result = yield
    guard = item.stash.get(_GUARD, None)
    if guard is not None and guard.attempts:
        pytest.fail("\n".join(guard.attempts), pytrace=False)
    return result
