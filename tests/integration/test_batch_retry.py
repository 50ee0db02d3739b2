"""`run --batch-api --retry-failed`: the failed tasks go out again in a follow-up batch (never answered again
from the files of the batch that failed them), exactly once across a kill -9 of the retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalsup.mock.server import MockThread
from tests.harness import BATCH_FAST as FAST
from tests.harness import BATCH_KEY as KEY
from tests.harness import assert_exactly_once, assert_no_chunk_twice, batches_of, ids_of, lines, run_args, run_cli


def test_retry_failed_sends_the_failed_tasks_in_one_new_batch_across_a_kill(tmp_path: Path,
                                                                          bmock: MockThread) -> None:
    n = 10  # the odd tasks are refused (400) the first time only
    objs: list[dict[str, Any]] = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
                                   **({"mock": {"status": 400, "times": 1}} if i % 2 else {})} for i in range(n)]
    args = run_args(bmock, lines(tmp_path / "t.jsonl", objs), *FAST)
    r = run_cli(*args, env=KEY)
    assert r.returncode == 0, r.stderr
    first = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(n))}
    failed = {i for i, x in first.items() if x["error"] is not None}
    assert len(failed) == n // 2 and len(batches_of(bmock)) == 1
    # the retry creates a batch for them (killed right after: the rerun adopts it, never creates another)
    r = run_cli(*args, "--retry-failed", env={**KEY, "EVALSUP_BATCH_CRASH_AT": "after_create"})
    assert r.returncode == -9, (r.returncode, r.stderr)
    r = run_cli(*args, "--retry-failed", env=KEY)  # the same command again
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(n))}
    assert all(x["error"] is None for x in recs.values())  # sent again, and answered this time
    assert {recs[i]["metrics"]["batch"]["id"] for i in failed}.isdisjoint(
        {first[i]["metrics"]["batch"]["id"] for i in failed})
    assert all(recs[i]["metrics"]["batch"]["request_id"] != first[i]["metrics"]["batch"]["request_id"] for i in failed)
    assert len(batches_of(bmock)) == 2
    assert_no_chunk_twice(bmock)
