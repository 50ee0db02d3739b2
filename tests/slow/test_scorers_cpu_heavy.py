"""A CPU-heavy scorer scales with the workers (slow). (The other scorer tests: integration/test_scorers.py.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import ROOT, run_cli

PLUGIN = ROOT / "tests" / "plugins" / "score_user.py"


def _tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


@pytest.mark.slow
def test_cpu_heavy_scorer_scales_with_workers(tmp_path: Path, mock: MockThread) -> None:
    """A benchmark figure, printed (not asserted): CPU-heavy scoring runs in parallel across workers."""
    rows = [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(80)]
    tasks = _tasks(tmp_path / "cpu.jsonl", rows)
    walls = {}
    for w in (1, 4):
        t0 = time.monotonic()
        r = run_cli("run", "-w", str(w), "--fresh", "--model", "mock-model", "--base-url", mock.url,
                    "--scorer", f"{PLUGIN}:cpu_heavy", str(tasks))
        walls[w] = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
    print(f"\ncpu_heavy scorer, 80 tasks: 1 worker {walls[1]:.1f}s, 4 workers {walls[4]:.1f}s "
          f"(ratio {walls[1] / walls[4]:.2f}x on {__import__('os').cpu_count()} cores)")
