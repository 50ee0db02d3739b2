"""`run --batch-api` with --group-by and tasks carrying their own response_format JSON schema: the groups in the
summary as online, and each answer validated as online with --max-reasks 0 (a batch cannot ask again)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalsup.mock.server import MockThread
from tests.harness import BATCH_FAST as FAST
from tests.harness import BATCH_KEY as KEY
from tests.harness import assert_exactly_once, ids_of, lines, run_args, run_cli, summary

SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "required": ["a"]}}}


def test_groups_and_the_tasks_own_schema_in_a_batch_run(tmp_path: Path, bmock: MockThread) -> None:
    objs: list[dict[str, Any]] = []
    for i in range(8):
        body: dict[str, Any] = {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}]}
        if i < 4:  # a schema of its own: t0, t1 answered invalid JSON, t2, t3 a valid object
            body |= {"response_format": SCHEMA, "mock": {"invalid_first": 5} if i < 2 else {"text": '{"a": 1}'}}
        objs.append({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body,
                     "expected": "zzz", "metadata": {"subject": "ab"[i % 2]}})
    tasks = lines(tmp_path / "t.jsonl", objs)
    r = run_cli(*run_args(bmock, tasks, *FAST, "--scorer", "exact_match", "--group-by", "metadata.subject"),
                env=KEY)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", ids_of(8))}
    assert {i for i, x in recs.items() if x["error"] is not None} == {"t0", "t1"}
    assert {recs[i]["error"]["code"] for i in ("t0", "t1")} == {"schema_invalid"}
    assert recs["t0"]["response"]["status_code"] == 200  # the answer is kept, as online
    s = summary(tmp_path / "t.run")
    assert s["structured"] == {"reasks": 0, "schema_invalid": 2}
    groups = s["groups"]
    assert groups["by"] == "metadata.subject"
    assert {g: v["tasks"] for g, v in groups["groups"].items()} == {"a": 4, "b": 4}
