"""A run's results.jsonl does not fill the page cache: once a checkpoint has made them safe, its pages but the
last EVALSUP_RESULTS_CACHED_MB are dropped from it (rundir.writer), and every answer is still there, once."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import assert_exactly_once, run_cli

N = 100  # answers of ~1 MB: ~100 MB of results


def resident_bytes(path: Path) -> int:
    """How much of ``path`` is in the page cache now (mincore(2) over a private mapping; nothing is read)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    page = os.sysconf("SC_PAGE_SIZE")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec) * page


@pytest.fixture
def big() -> Iterator[MockThread]:
    with MockThread(MockConfig(latency_ms=5, response_kb=1024, seed=2)) as m:
        yield m


def _run(tmp_path: Path, mock: MockThread, name: str, cached_mb: int) -> tuple[int, int]:
    """The results' size and how much of them the page cache holds, as the run left it; then every answer is
    checked to be there once (a read, which brings the pages back)."""
    tasks = tmp_path / f"{name}.jsonl"
    tasks.write_text("".join(f'{{"id": "t{i}", "prompt": "q{i}"}}\n' for i in range(N)))
    r = run_cli("run", "-w", "1", "-c", "8", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                env={"EVALSUP_RESULTS_CACHED_MB": str(cached_mb)})
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / f"{name}.run"
    results = run_dir / "results.jsonl"
    got = results.stat().st_size, resident_bytes(results)
    assert_exactly_once(run_dir, {f"t{i}" for i in range(N)})
    return got


def test_a_run_leaves_only_the_results_tail_in_the_page_cache(tmp_path: Path, big: MockThread) -> None:
    size, resident = _run(tmp_path, big, "dropped", 8)
    assert size > 90 << 20
    assert resident <= (8 + 1) << 20  # the tail kept, and less than DROP_LEAST not yet dropped


def test_with_a_tail_larger_than_the_results_the_page_cache_keeps_them(tmp_path: Path, big: MockThread) -> None:
    size, resident = _run(tmp_path, big, "kept", 1024)
    # nothing dropped: what the page cache holds is up to the machine (at least half of it on any machine that
    # is not short of memory), not the 8 MiB above
    assert resident > size // 2
