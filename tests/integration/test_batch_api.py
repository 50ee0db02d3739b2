"""`evalsup run --batch-api` against the mock's Files and Batches APIs (issue 31): the whole path, a kill -9 at
each step then a rerun (every task once, no chunk created twice), an expired chunk and its follow-up, an error
file merged, a validation failure, the mock's shapes checked with the openai SDK's types. The 2,000-task run
whose records match an online run's, and the kills at the other steps, are in tests/slow/test_batch_api_slow.py."""

from __future__ import annotations

import io
import re
import signal
from collections.abc import Callable
from pathlib import Path

import openai
import orjson
import pytest
from openai.types import Batch, FileObject

from evalsup.mock.server import MockThread
from tests.harness import BATCH_FAST as FAST
from tests.harness import BATCH_KEY as KEY
from tests.harness import (
    Run,
    assert_exactly_once,
    assert_no_chunk_twice,
    batches_of,
    ids_of,
    lines,
    run_args,
    run_cli,
    wait_until,
    write_tasks,
)


def test_mock_shapes_are_the_sdks(bmock: MockThread) -> None:
    c = openai.OpenAI(base_url=bmock.url, api_key="sk-test")
    data = b"".join(orjson.dumps({"custom_id": f"a{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}],
                                           **({"mock": {"status": 400}} if i == 1 else {})}}) + b"\n"
                    for i in range(4))
    f = c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert isinstance(f, FileObject) and f.bytes == len(data)
    # the mock's own JSON, not the SDK's lenient parse of it: every field the types name, of their types
    raw_file = c.files.with_raw_response.retrieve(f.id).http_response.json()
    assert set(raw_file) == set(FileObject.model_fields)
    FileObject.model_validate(raw_file, strict=True)
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         metadata={"k": "v"})
    seen = {b.status}
    while b.status not in ("completed", "failed", "expired", "cancelled"):
        b = c.batches.retrieve(b.id)
        seen.add(b.status)
    raw = c.batches.with_raw_response.retrieve(b.id).http_response.json()
    assert set(raw) == set(Batch.model_fields)
    Batch.model_validate(raw, strict=True)
    assert {"validating", "completed"} <= seen and b.request_counts is not None
    assert (b.request_counts.completed, b.request_counts.failed) == (3, 1)
    out = [orjson.loads(x) for x in c.files.content(b.output_file_id or "").content.splitlines()]
    err = [orjson.loads(x) for x in c.files.content(b.error_file_id or "").content.splitlines()]
    assert sorted(x["custom_id"] for x in out) == ["a0", "a2", "a3"]
    assert [x["response"]["status_code"] for x in err] == [400]
    bmock.configure(batch_fail_validation=1)
    bad = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    while bad.status not in ("failed", "completed"):
        bad = c.batches.retrieve(bad.id)
    assert bad.status == "failed" and bad.errors is not None and bad.errors.data
    page = c.batches.list(limit=1)
    assert page.has_more and len(list(c.batches.list(limit=1))) == 2  # the SDK pages with `after`


@pytest.mark.parametrize("step", ["after_create", "mid_collect"])  # the other steps: tests/slow
def test_kill_at_each_step_then_rerun(tmp_path: Path, bmock: MockThread, step: str) -> None:
    n = 120
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    args = run_args(bmock, tasks, *FAST)
    r = run_cli(*args, env={**KEY, "EVALSUP_BATCH_CRASH_AT": step})
    assert r.returncode == -9, (r.returncode, r.stderr)
    r = run_cli(*args, env=KEY)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert_no_chunk_twice(bmock)


def test_kill_after_upload_then_rerun_through_a_gateway_that_lists_no_files(tmp_path: Path,
                                                                             bmock: MockThread) -> None:
    # issue 39: GET /v1/files answers 405, so the upload a kill took the record of cannot be found: the rerun
    # uploads again (free) and notes it, instead of stopping on every rerun
    bmock.configure(batch_files_unlisted=True)
    n = 50
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    args = run_args(bmock, tasks, *FAST)
    r = run_cli(*args, env={**KEY, "EVALSUP_BATCH_CRASH_AT": "after_upload"})
    assert r.returncode == -9, (r.returncode, r.stderr)
    r = run_cli(*args, env=KEY)
    assert r.returncode == 0, r.stderr
    assert "does not list files" in r.stderr and "uploading its input again" in r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert_no_chunk_twice(bmock)
    events = [orjson.loads(x) for x in (tmp_path / "t.run" / "batches.jsonl").read_bytes().splitlines()]
    again = [e for e in events if e["event"] == "reupload"]
    assert again and again[0]["chunk"] == 1 and "405" in again[0]["reason"]


def test_kill_after_create_where_batches_cannot_be_listed_stops_resumably_then_adopts(tmp_path: Path,
                                                                                     bmock: MockThread) -> None:
    # whether the create took effect cannot be told without the listing: a second create could pay twice, so the
    # rerun stops (75) naming the way out, and the rerun once the listing answers adopts the batch
    n = 30
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    args = run_args(bmock, tasks, *FAST)
    r = run_cli(*args, env={**KEY, "EVALSUP_BATCH_CRASH_AT": "after_create"})
    assert r.returncode == -9, (r.returncode, r.stderr)
    bmock.configure(batch_batches_unlisted=True)
    r = run_cli(*args, env=KEY)
    assert r.returncode == 75, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "does not list batches" in last and "pay twice" in last and "rerun once" in last, last
    bmock.configure(batch_batches_unlisted=False)
    assert len(batches_of(bmock)) == 1  # not created again on a guess
    r = run_cli(*args, env=KEY)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert_no_chunk_twice(bmock)


def test_expired_chunk_and_its_follow_up(tmp_path: Path, bmock: MockThread) -> None:
    bmock.configure(batch_expire=1)
    n = 30
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    r = run_cli(*run_args(bmock, tasks, *FAST), env=KEY)
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert all(x["error"] is None for x in recs)
    followed = [x for x in recs if x["metrics"]["attempts"] == 2]
    assert len(followed) == n - n // 2  # the half the expired batch never ran went in a follow-up batch
    assert len({x["metrics"]["batch"]["id"] for x in recs}) == 2
    assert [b["status"] for b in batches_of(bmock)] == ["completed", "expired"]


def test_error_file_merged_through_5xx_a_full_queue_and_a_slow_finalize(tmp_path: Path, bmock: MockThread) -> None:
    # polled through, created again, waited out
    bmock.configure(batch_retrieve_500=3, batch_queue_full=1, batch_finalize_ms=300)
    objs = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
             **({"mock": {"status": 400}} if i % 5 == 0 else {})} for i in range(20)]
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli(*run_args(bmock, tasks, *FAST), env=KEY)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(20))}
    bad = {i for i, x in recs.items() if x["error"] is not None}
    assert bad == {f"t{i}" for i in range(0, 20, 5)}
    assert recs["t0"]["response"]["status_code"] == 400 and recs["t0"]["error"]["evalsup_code"] == "http_400"
    assert recs["t0"]["metrics"]["attempts"] == 1  # a 400 is not retried
    assert [b["status"] for b in batches_of(bmock)] == ["completed", "failed"]  # the queue-full one, then again


def test_validation_failure_stops_in_one_line(tmp_path: Path, bmock: MockThread) -> None:
    bmock.configure(batch_fail_validation=1)
    tasks = write_tasks(tmp_path / "t.jsonl", 10)
    r = run_cli(*run_args(bmock, tasks, *FAST), env=KEY)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "failed validation" in last and "invalid_request" in last and "Traceback" not in r.stderr
    r = run_cli(*run_args(bmock, tasks, *FAST), env=KEY)  # the provider takes it now: a new chunk
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(10))




def test_sigterm_leaves_the_batches_running_and_cancel_collects(tmp_path: Path, bmock: MockThread,
                                                                  start: Callable[..., Run]) -> None:
    bmock.configure(batch_step_ms=5000)  # each batch validates for 5 s (a cancel ends it at once)
    n = 60
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    run = start(*run_args(bmock, tasks, *FAST), env=KEY)
    journal = tmp_path / "t.run" / "batches.jsonl"
    wait_until(lambda: journal.exists() and journal.read_bytes().count(b'"event":"created"') == 2,
               "both batches created", proc=run)
    run.signal(signal.SIGTERM)
    assert run.finish() == 75
    assert {b["status"] for b in batches_of(bmock)} <= {"validating", "in_progress"}  # left running
    st = run_cli("status", str(tmp_path / "t.run")).stdout
    assert len(re.findall(r"batch_[0-9a-f]{24}", st)) == 2 and "validating" in st and "expires" in st, st
    # `evalsup cancel` cancels them, records what they finished (here: nothing yet), stops resumably
    r = run_cli("cancel", str(tmp_path / "t.run"), env=KEY)
    assert r.returncode == 75, r.stderr
    assert "cancelled" in r.stderr.strip().splitlines()[-1]
    assert {b["status"] for b in batches_of(bmock)} == {"cancelled"}
    bmock.configure(batch_step_ms=20)
    r = run_cli(*run_args(bmock, tasks, *FAST), env=KEY)  # the rerun sends what the cancel left
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert_no_chunk_twice(bmock)


def test_fresh_names_the_old_runs_batches_still_charged_and_how_to_cancel_them(
        tmp_path: Path, bmock: MockThread, start: Callable[..., Run]) -> None:
    # the old run's batch validates for 60 s: still running at --fresh and at the cancel (a cancel ends the
    # wait), however slow the machine
    bmock.configure(batch_step_ms=60000)
    tasks = write_tasks(tmp_path / "t.jsonl", 30)
    run = start(*run_args(bmock, tasks, *FAST), env=KEY)
    journal = tmp_path / "t.run" / "batches.jsonl"
    wait_until(lambda: journal.exists() and b'"event":"created"' in journal.read_bytes(), "a batch created", proc=run)
    run.signal(signal.SIGTERM)
    assert run.finish() == 75
    bmock.configure(batch_step_ms=20)
    r = run_cli(*run_args(bmock, tasks, *FAST[:-1], "--fresh"), env=KEY)  # not -q: --fresh speaks
    assert r.returncode == 0, r.stderr
    said = re.search(r"still run at the provider and are charged.*`(evalsup cancel (\S+) --tasks \S+)`", r.stderr)
    assert said, r.stderr
    old = Path(said.group(2))
    got = run_cli("cancel", str(old), "--tasks", str(tasks), env=KEY)  # the command it names works
    assert got.returncode == 75, got.stderr
    old_batches = [b for b in batches_of(bmock) if b["status"] == "cancelled"]
    assert len(old_batches) == 1


def test_fallback_online_and_fail(tmp_path: Path, bmock: MockThread) -> None:
    objs = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
             **({"mock": {"status": 500, "times": 1}} if i < 3 else {})} for i in range(10)]
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli(*run_args(bmock, tasks, *FAST, "--batch-fallback", "online"), env=KEY)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(10))}
    assert all(x["error"] is None for x in recs.values())  # the 500s were sent again online, and answered
    assert {i for i, x in recs.items() if x["metrics"]["attempts"] == 2} == {"t0", "t1", "t2"}
    assert len(batches_of(bmock)) == 1  # no follow-up batch
    bmock.configure(batch_expire=1)
    tasks = write_tasks(tmp_path / "u.jsonl", 10)
    r = run_cli(*run_args(bmock, tasks, *FAST, "--batch-fallback", "fail"), env=KEY)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "u.run", ids_of(10))}
    failed = [x for x in recs.values() if x["error"] is not None]
    assert len(failed) == 5 and {x["error"]["code"] for x in failed} == {"batch_expired"}
    assert all(x["response"] is None and x["error"]["message"] for x in failed)
