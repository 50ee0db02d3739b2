"""`evalsup run --batch-api --batch-provider anthropic` against the mock's Message Batches API (issue 31 item
4): the mock's shapes checked with the anthropic SDK's types, the whole path (system prompt, max_tokens,
the answer kept as a Message, its usage in the summary, the key never written), a kill -9 between the create
and its record then a rerun that creates no second batch, errored and expired requests handled as OpenAI's
error lines, and a task with no Anthropic form refused in one line before any request."""

from __future__ import annotations

import math
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import anthropic
import orjson
from anthropic.types import Message
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from evalsup.mock.server import MockThread
from tests.harness import (
    assert_exactly_once,
    ids_of,
    lines,
    run_args,
    run_cli,
    summary,
    write_tasks,
)

KEY = "sk-ant-test-1234567890"
ENV = {"ANTHROPIC_API_KEY": KEY}
FAST = ("--batch-api", "--batch-provider", "anthropic", "--max-tokens", "16", "--batch-max-requests", "40",
        "--batch-poll-interval", "0.05", "--batch-poll-max", "0.2", "-q")


def sdk(mock: MockThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=mock.url.removesuffix("/v1"), api_key="k")


def message_batches(mock: MockThread) -> list[dict[str, Any]]:
    """Every Message Batch the mock holds (the SDK pages with after_id), and each one's custom_ids."""
    c = sdk(mock)
    out = []
    for b in c.messages.batches.list(limit=3):
        ids = [r.custom_id for r in c.messages.batches.results(b.id)] if b.processing_status == "ended" else []
        out.append({**b.model_dump(), "custom_ids": ids})
    return out


def assert_no_request_twice(mock: MockThread) -> None:
    """No request was in two batches but for a follow-up of one its batch did not answer (expired)."""
    made = Counter(i for b in message_batches(mock) for i in b["custom_ids"])
    assert made and max(made.values()) == 1, f"a request was sent in two batches: {made.most_common(3)}"


def test_mock_shapes_are_the_anthropic_sdks(bmock: MockThread) -> None:
    c = sdk(bmock)
    reqs: Any = [{"custom_id": f"a{i}", "params": {"model": "mock-model", "max_tokens": 16, "messages": [
        {"role": "user", "content": f"q{i}"}], **({"mock": {"status": 400}} if i == 1 else {})}} for i in range(4)]
    b = c.messages.batches.create(requests=reqs)
    seen = {b.processing_status}
    while b.processing_status != "ended":
        b = c.messages.batches.retrieve(b.id)
        seen.add(b.processing_status)
    raw = c.messages.batches.with_raw_response.retrieve(b.id).http_response.content
    assert set(orjson.loads(raw)) == set(MessageBatch.model_fields)
    MessageBatch.model_validate_json(raw, strict=True)  # every field of its type, as the JSON gives it
    assert seen == {"in_progress", "ended"} and (b.request_counts.succeeded, b.request_counts.errored) == (3, 1)
    got = {r.custom_id: r for r in c.messages.batches.results(b.id)}
    assert sorted(got) == ["a0", "a1", "a2", "a3"] and got["a1"].result.type == "errored"
    assert b.results_url is not None
    req = urllib.request.Request(b.results_url, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(req) as f:
        res = f.read()
    for line in res.splitlines():
        MessageBatchIndividualResponse.model_validate_json(line)
        obj = orjson.loads(line)
        if obj["result"]["type"] == "succeeded":
            Message.model_validate_json(orjson.dumps(obj["result"]["message"]), strict=True)
    c.messages.batches.create(requests=reqs[:1])
    assert len(list(c.messages.batches.list(limit=1))) == 2  # newest first, paged with after_id


def test_whole_path_answers_kept_as_messages(tmp_path: Path, bmock: MockThread) -> None:
    objs = [{"id": f"t{i}", "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": f"q{i}"}],
             **({"mock": {"status": 400}} if i == 3 else {})} for i in range(50)]
    tasks = lines(tmp_path / "t.jsonl", objs)
    bmock.configure(batch_queue_full=1, batch_retrieve_500=2)  # a create refused (429) then polls failing
    r = run_cli(*run_args(bmock, tasks, *FAST), env=ENV)
    assert r.returncode == 0, r.stderr
    assert "rate limit" in r.stderr and "trying again" in r.stderr
    run_dir = tmp_path / "t.run"
    recs = {x["custom_id"]: x for x in assert_exactly_once(run_dir, ids_of(50))}
    ok = recs["t0"]
    body = ok["response"]["body"]
    assert body["type"] == "message" and body["content"][0]["type"] == "text" and body["content"][0]["text"]
    assert body["usage"]["output_tokens"] <= 16 and ok["metrics"]["batch"]["id"].startswith("msgbatch_")
    bad = recs["t3"]
    assert bad["error"]["code"] == "http_400" and bad["error"]["type"] == "invalid_request_error"
    assert bad["metrics"]["attempts"] == 1  # a 400 is not retried
    assert [x for x in recs if recs[x]["error"]] == ["t3"]
    s = summary(run_dir)
    assert s["tokens"]["prompt"] > 0 and s["tokens"]["completion"] > 0, s  # from input_tokens/output_tokens
    assert len(message_batches(bmock)) == 2  # 40 + 10
    for p in [*run_dir.rglob("*"), tmp_path / "t.jsonl"]:  # the key is in no file and no output
        assert not p.is_file() or KEY.encode() not in p.read_bytes(), p
    assert KEY not in r.stderr + r.stdout


def test_kill_between_create_and_record_then_rerun_creates_no_second_batch(tmp_path: Path,
                                                                           bmock: MockThread) -> None:
    n = 60
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    args = run_args(bmock, tasks, *FAST)
    r = run_cli(*args, env={**ENV, "EVALSUP_BATCH_CRASH_AT": "after_create"})
    assert r.returncode == -9, (r.returncode, r.stderr)
    journal = (tmp_path / "t.run" / "batches.jsonl").read_bytes()
    assert b'"event":"created"' not in journal and len(message_batches(bmock)) == 1  # created, not recorded
    first = message_batches(bmock)[0]["id"]
    r = run_cli(*args, env=ENV)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(n))
    assert len(message_batches(bmock)) == math.ceil(n / 40)  # the first one adopted, not created again
    journal = (tmp_path / "t.run" / "batches.jsonl").read_bytes()
    assert b'"chunk":1,"batch_id":"' + first.encode() + b'"' in journal
    assert_no_request_twice(bmock)


def test_errored_and_expired_requests_go_in_a_follow_up(tmp_path: Path, bmock: MockThread) -> None:
    bmock.configure(batch_expire=1)
    objs = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
             **({"mock": {"status": 529, "times": 1}} if i == 0 else {})} for i in range(20)]
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli(*run_args(bmock, tasks, *FAST), env=ENV)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(20))}
    assert all(x["error"] is None for x in recs.values())
    again = {i for i, x in recs.items() if x["metrics"]["attempts"] == 2}
    assert "t0" in again and len(again) == 1 + 10  # the overloaded one and the half the batch never ran
    made = message_batches(bmock)
    assert len(made) == 2 and sorted(Counter(made[-1]["custom_ids"]).values()) == [1] * 20
    assert made[-1]["request_counts"]["expired"] == 10
    bmock.configure(batch_expire=2)  # (a new value arms the knob again: the next batch expires part-way)
    r = run_cli(*run_args(bmock, write_tasks(tmp_path / "u.jsonl", 10), *FAST, "--batch-fallback", "fail"),
                env=ENV)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "u.run", ids_of(10))}
    failed = [x for x in recs.values() if x["error"] is not None]
    assert len(failed) == 5 and {x["error"]["code"] for x in failed} == {"batch_expired"}
    assert all(x["response"] is None and x["error"]["message"] for x in failed)


def test_a_request_with_no_anthropic_form_is_refused_before_any_request(tmp_path: Path,
                                                                        bmock: MockThread) -> None:
    objs: list[dict[str, Any]] = [{"id": f"t{i}", "messages": [{"role": "user", "content": "q"}]} for i in range(5)]
    objs[3]["metadata"] = {"x": 1}
    objs[3] = {"custom_id": "t3", "url": "/v1/chat/completions", "body": {
        "messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function"}]}}
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli(*run_args(bmock, tasks, *FAST), env=ENV)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "t.jsonl:4:" in last and "'tools' has no Anthropic equivalent" in last, last
    no_max = [x for x in FAST if x not in ("--max-tokens", "16")]
    r = run_cli(*run_args(bmock, write_tasks(tmp_path / "u.jsonl", 3), *no_max), env=ENV)
    assert r.returncode == 2 and "u.jsonl:1:" in r.stderr and "max_tokens" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and message_batches(bmock) == []


def test_fallback_online_sends_post_v1_messages(tmp_path: Path, bmock: MockThread) -> None:
    objs = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
             **({"mock": {"status": 500, "times": 1}} if i < 2 else {})} for i in range(6)]
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli(*run_args(bmock, tasks, *FAST, "--batch-fallback", "online"), env=ENV)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(6))}
    assert all(x["error"] is None and x["response"]["body"]["type"] == "message" for x in recs.values())
    assert {i for i, x in recs.items() if x["metrics"]["batch"].get("fallback") == "online"} == {"t0", "t1"}
    assert len(message_batches(bmock)) == 1  # no follow-up batch
