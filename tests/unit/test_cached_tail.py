"""How much of results.jsonl a run leaves in the page cache (rundir.writer.cached_tail)."""

from __future__ import annotations

import pytest

from evalsup.rundir.writer import CACHED_LEAST, CACHED_MOST, cached_tail

MiB = 1 << 20


@pytest.mark.parametrize(("memory", "tail"), [
    (128 * MiB, CACHED_LEAST),  # a small container: 16 MiB, not 8
    (512 * MiB, 32 * MiB),
    (1024 * MiB, 64 * MiB),
    (2048 * MiB, 128 * MiB),
    (24 << 30, CACHED_MOST),  # this machine: 256 MiB, not 1.5 GiB
    (None, 4 * CACHED_LEAST),  # memory unknown
])
def test_the_tail_is_a_sixteenth_of_the_runs_memory_within_bounds(memory: int | None, tail: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVALSUP_RESULTS_CACHED_MB", raising=False)
    assert cached_tail(memory) == tail


@pytest.mark.parametrize(("raw", "tail"), [("8", 8 * MiB), ("0", 0), ("0.5", MiB // 2), ("-3", 0),
                                           ("lots", 64 * MiB), ("inf", 64 * MiB)])
def test_the_environment_decides_when_set(raw: str, tail: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSUP_RESULTS_CACHED_MB", raw)
    assert cached_tail(1024 * MiB) == tail  # not a number: the rule's figure
