"""--batch-api against the mock, the slow part (issue 31): a 2,000-task run whose records match an online run's, by
custom_id and body (the issue's 20,000 is the same path with ten times the chunks: scripts/bench_batch.py), and a
kill -9 at the steps tests/integration/test_batch_api.py leaves out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evalsup.mock.server import MockThread
from tests.harness import (
    BATCH_FAST,
    BATCH_KEY,
    assert_exactly_once,
    assert_no_chunk_twice,
    batches_of,
    ids_of,
    read_results,
    run_args,
    run_cli,
    write_tasks,
)


def test_whole_path_records_match_online(tmp_path: Path, bmock: MockThread) -> None:
    n = 2000  # the 20,000 is left to scripts/bench: the same path, ten times the chunks
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    fast = ("--batch-api", "--batch-max-requests", "500", "--batch-poll-interval", "0.05", "--batch-poll-max", "0.2")
    r = run_cli(*run_args(bmock, tasks, *fast, "-q", "--out", str(tmp_path / "b")), env=BATCH_KEY)
    assert r.returncode == 0, r.stderr
    batch = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "b", ids_of(n))}
    assert len(batches_of(bmock)) >= 4  # four full chunks, or more when a pause in the dispatch cut one short
    assert_no_chunk_twice(bmock)
    r = run_cli(*run_args(bmock, tasks, "-q", "--out", str(tmp_path / "o")), env=BATCH_KEY)
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


@pytest.mark.parametrize("step", ["before_upload", "after_upload", "while_downloading"])
def test_kill_at_a_step_then_rerun(tmp_path: Path, bmock: MockThread, step: str) -> None:
    n = 120
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    args = run_args(bmock, tasks, *BATCH_FAST)
    r = run_cli(*args, env={**BATCH_KEY, "EVALSUP_BATCH_CRASH_AT": step})
    assert r.returncode == -9, (r.returncode, r.stderr)
    r = run_cli(*args, env=BATCH_KEY)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert_no_chunk_twice(bmock)

