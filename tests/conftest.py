"""Shared fixtures: the project's mock endpoint on 127.0.0.1, task files, and running the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockConfig, MockThread

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def mock() -> Iterator[MockThread]:
    with MockThread(MockConfig(latency_ms=5, jitter_ms=2, seed=1)) as m:
        yield m


def write_tasks(path: Path, n: int, form: str = "simple", extra: dict[str, Any] | None = None,
                start: int = 0) -> Path:
    with open(path, "wb") as f:
        for i in range(start, start + n):
            if form == "simple":
                obj: dict[str, Any] = {"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}]}
            elif form == "prompt":
                obj = {"id": f"t{i}", "prompt": f"q{i}"}
            else:
                obj = {"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}]}}
            if extra:
                obj.update(extra)
            f.write(orjson.dumps(obj) + b"\n")
    return path


def evalsup_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "evalsup", *args]


def env_for(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(evalsup_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env_for(env))


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    with open(run_dir / "results.jsonl", "rb") as f:
        return [orjson.loads(line) for line in f]


def assert_exactly_once(run_dir: Path, ids: set[str]) -> list[dict[str, Any]]:
    recs = read_results(run_dir)
    got = [r["custom_id"] for r in recs]
    dupes = {i for i, c in Counter(got).items() if c > 1}
    assert not dupes, f"ids written twice: {sorted(dupes)[:10]}"
    assert set(got) == ids, f"missing {sorted(ids - set(got))[:10]}, extra {sorted(set(got) - ids)[:10]}"
    return recs
