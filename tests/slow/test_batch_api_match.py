"""A 2,000-task --batch-api run against the mock whose records match an online run's, by custom_id and body
(issue 31; the issue's 20,000 is the same path with ten times the chunks: scripts/bench_batch.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import assert_exactly_once, ids_of, read_results, run_args, run_cli, write_tasks

KEY = {"OPENAI_API_KEY": "sk-test"}


@pytest.fixture
def bmock() -> Any:
    with MockThread(MockConfig(seed=3, batch_step_ms=20)) as m:
        yield m


def test_whole_path_records_match_online(tmp_path: Path, bmock: MockThread) -> None:
    n = 2000  # the 20,000 is left to scripts/bench: the same path, ten times the chunks
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    fast = ("--batch-api", "--batch-max-requests", "500", "--batch-poll-interval", "0.05", "--batch-poll-max", "0.2")
    r = run_cli(*run_args(bmock, tasks, *fast, "-q", "--out", str(tmp_path / "b")), env=KEY)
    assert r.returncode == 0, r.stderr
    batch = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "b", ids_of(n))}
    c = openai.OpenAI(base_url=bmock.url, api_key="sk-test")
    made = Counter((b.metadata or {}).get("evalsup_chunk") for b in c.batches.list(limit=3))
    assert len(made) == 4 and max(made.values()) == 1, made
    r = run_cli(*run_args(bmock, tasks, "-q", "--out", str(tmp_path / "o")), env=KEY)
    assert r.returncode == 0, r.stderr
    online = {x["custom_id"]: x for x in read_results(tmp_path / "o")}

    def body(rec: dict[str, Any]) -> Any:
        b = dict(rec["response"]["body"])
        b.pop("id"), b.pop("created")
        return b

    assert all(body(batch[i]) == body(online[i]) for i in online)
    assert set(batch["t0"]) == set(online["t0"])  # the same record shape
    assert batch["t0"]["metrics"]["batch"]["id"].startswith("batch_")
    assert batch["t0"]["metrics"]["batch"]["request_id"].startswith("batch_req_")
    st = run_cli("status", str(tmp_path / "b"))
    assert "batch_" in st.stdout and "completed" in st.stdout, st.stdout
