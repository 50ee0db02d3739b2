"""Fixtures for every tier: the project's mock endpoint on 127.0.0.1, ``start`` (the ``Run`` harness, torn
down by PID) and a small tmpfs. Helpers that are not fixtures live in ``tests/harness.py``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, mount


@pytest.fixture
def mock() -> Iterator[MockThread]:
    with MockThread(MockConfig(latency_ms=5, jitter_ms=2, seed=1)) as m:
        yield m


@pytest.fixture
def bmock() -> Iterator[MockThread]:
    """A mock whose batches move on every 20 ms (--batch-api tests)."""
    with MockThread(MockConfig(seed=3, batch_step_ms=20)) as m:
        yield m


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """start(*evalsup_args, env=None, argv=None, stdin=None, tty=None) -> Run (see ``Run``); whatever still runs
    at teardown is killed by PID."""
    procs: list[Run] = []

    def _start(*args: str, **kwargs: Any) -> Run:
        p = Run(tmp_path, *args, **kwargs)
        procs.append(p)
        return p

    yield _start
    for p in procs:
        p.cleanup()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of our own (root only), unmounted at teardown."""
    d = tmp_path / "fs"
    d.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d))
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], capture_output=True, timeout=30)



_TIERS = ("unit", "integration", "slow")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (its directory under tests/), so ``-m unit`` or ``-m "not slow"`` work as
    well as the paths do."""
    for item in items:
        parts = item.path.relative_to(Path(__file__).parent).parts
        if len(parts) > 1 and parts[0] in _TIERS:
            item.add_marker(parts[0])
