"""Scores by group and structured outputs with re-ask, in real runs against the mock: summary.json, the
report, the records (still the OpenAI SDK's types), and --retry-failed on schema_invalid."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

import evalsup
from evalsup.mock.server import MockThread
from tests.harness import lines, read_results, run_args, run_cli, summary

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
VALID = '{"answer": "B"}'


def test_group_by_gives_scores_per_group_in_the_summary_and_the_report(tmp_path: Path, mock: MockThread) -> None:
    pytest.importorskip("pandas")
    rows = []
    for i in range(90):
        subject = ("law", "math", "art")[i % 3]
        right = subject == "law" or (subject == "math" and i % 2 == 0)  # law 1.0, math 0.5, art 0.0
        rows.append({"id": f"t{i}", "prompt": f"q{i}", "expected": "B", "metadata": {"subject": subject},
                     "mock": {"text": "The answer is (B)." if right else "The answer is (C)."}})
    rows.append({"id": "nosubject", "prompt": "q", "expected": "B", "mock": {"text": "B"}})
    tasks = lines(tmp_path / "mmlu.jsonl", rows)
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--scorer", "choice", "--group-by", "metadata.subject"))
    assert r.returncode == 0, r.stderr
    assert re.search(r"law\s+choice\s+30\s+30\s+1\.000\s+0\.886-1\.000", r.stdout), r.stdout  # the final table
    s = summary(tmp_path / "mmlu.run")
    groups = s["groups"]
    assert groups["by"] == "metadata.subject" and list(groups["groups"]) == ["(none)", "art", "law", "math"]
    math = groups["groups"]["math"]
    assert math["tasks"] == 30 and math["scores"]["choice"]["accuracy"] == 0.5
    lo, hi = math["scores"]["choice"]["ci95"]
    assert 0.3 < lo < 0.5 < hi < 0.7
    assert groups["groups"]["art"]["scores"]["choice"]["accuracy"] == 0.0
    assert s["scores"]["choice"]["count"] == 91
    df = evalsup.to_pandas(tmp_path / "mmlu.run", group_by="metadata.subject")
    assert df.groupby("group")["score.choice"].mean().to_dict() == {"(none)": 1.0, "art": 0.0, "law": 1.0,
                                                                   "math": 0.5}

    r = run_cli("report", str(tmp_path / "mmlu.run"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "mmlu.run" / "report.html").read_text()
    assert '<table class="t" id="scores">' in page and 'id="score-chart-0"' in page
    table = page[page.index('id="scores-by-group"'):]
    assert re.search(r"<td[^>]*>math</td><td[^>]*>30</td><td[^>]*>0</td><td[^>]*>choice</td><td[^>]*>30</td>"
                     r"<td[^>]*>0\.500</td>", table)
    # another key, asked for: the report groups the records by it
    r = run_cli("report", str(tmp_path / "mmlu.run"), "--group-by", "metadata.expected")
    assert r.returncode == 0 and ">By metadata.expected<" in (tmp_path / "mmlu.run" / "report.html").read_text()


def _check_sdk(rec: dict[str, Any]) -> None:
    body = rec["response"]["body"]
    (Response if body.get("object") == "response" else ChatCompletion).model_validate(body)


def test_an_invalid_answer_is_asked_again_then_schema_invalid_then_retry_failed(tmp_path: Path,
                                                                                mock: MockThread) -> None:
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(SCHEMA))
    rows: list[dict[str, Any]] = [
        {"id": f"once{i}", "prompt": f"q{i}", "mock": {"text": VALID, "invalid_first": 1}} for i in range(4)]
    rows += [{"id": f"thrice{i}", "prompt": f"q{i}", "mock": {"text": VALID, "invalid_first": 3}} for i in range(3)]
    rows += [{"id": "valid", "prompt": "q", "mock": {"text": VALID}}]
    rows += [{"custom_id": "resp", "method": "POST", "url": "/v1/responses",  # the Responses API, re-asked too
              "body": {"model": "mock-model", "input": "q", "mock": {"text": VALID, "invalid_first": 1}}}]
    tasks = lines(tmp_path / "json.jsonl", rows)
    args = run_args(mock, tasks, "-w", "1", "--response-schema", str(schema), "--max-reasks", "2")
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "json.run")}
    for i in range(4):
        rec = recs[f"once{i}"]
        assert rec["error"] is None and rec["metrics"]["reasks"] == 1
        assert rec["response"]["body"]["choices"][0]["message"]["content"] == VALID
    assert recs["valid"]["metrics"]["reasks"] == 0 and recs["resp"]["metrics"]["reasks"] == 1
    assert recs["resp"]["error"] is None
    for i in range(3):
        rec = recs[f"thrice{i}"]
        assert rec["error"]["code"] == "schema_invalid" and rec["metrics"]["reasks"] == 2
        assert "not valid JSON" in rec["error"]["message"] and rec["response"]["status_code"] == 200
    for rec in recs.values():
        _check_sdk(rec)
    s = summary(tmp_path / "json.run")
    assert s["errors"] == {"schema_invalid": 3} and s["structured"] == {"reasks": 4 + 1 + 3 * 2, "schema_invalid": 3}

    # the failed ones are sent again: with one re-ask more they pass; the others are not touched
    r = run_cli(*run_args(mock, tasks, "-w", "1", "--response-schema", str(schema), "--max-reasks", "3",
                          "--retry-failed", "schema_invalid", "--accept-changed-settings"))
    assert r.returncode == 0, r.stderr
    again = {x["custom_id"]: x for x in read_results(tmp_path / "json.run")}
    assert len(again) == len(rows) and again["once0"]["id"] == recs["once0"]["id"]
    for i in range(3):
        assert again[f"thrice{i}"]["error"] is None and again[f"thrice{i}"]["metrics"]["reasks"] == 3


def test_a_tasks_own_schema_is_validated_max_reasks_0_never_asks_again_and_validation_can_be_off(
        tmp_path: Path, mock: MockThread) -> None:
    own = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
    rows = [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "mock-model", "messages": [{"role": "user", "content": "q"}], "response_format": own,
                      "mock": {"text": VALID, "invalid_first": 1}}} for i in range(3)]
    tasks = lines(tmp_path / "own.jsonl", rows)
    # --max-reasks 0: validated without --response-schema, recorded schema_invalid at once, nothing asked again
    r = run_cli(*run_args(mock, tasks, "-w", "1", "--max-reasks", "0"))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "own.run")
    assert [(x["error"]["code"], x["metrics"]["reasks"]) for x in recs] == [("schema_invalid", 0)] * 3
    assert mock.stats()["by_path"]["/v1/chat/completions"] == 3  # one request a task: no re-ask sent
    # --no-validate-schema: the schema is only sent; the answer is the record as it came
    r = run_cli(*run_args(mock, tasks, "-w", "1", "--no-validate-schema", "--out", str(tmp_path / "off.run")))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "off.run")
    assert all(x["error"] is None and "reasks" not in x["metrics"] for x in recs) and len(recs) == 3
    assert summary(tmp_path / "off.run")["failed"] == 0


def test_a_schema_that_cannot_be_used_is_refused_before_any_request(tmp_path: Path, mock: MockThread) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "objekt"}')
    tasks = lines(tmp_path / "t.jsonl", [{"id": "a", "prompt": "q"}])
    r = run_cli(*run_args(mock, tasks, "--response-schema", str(schema)))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"evalsup: --response-schema {schema}: not a valid JSON schema: at type: 'objekt' is not valid under any "
        "of the given schemas"]
    assert mock.stats()["by_path"].get("/v1/completions", 0) == 0


def test_the_python_api_takes_group_by_and_a_pydantic_model(tmp_path: Path, mock: MockThread) -> None:
    pydantic = pytest.importorskip("pydantic")
    pytest.importorskip("pandas")

    class Answer(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        answer: str

    tasks = [{"id": f"t{i}", "prompt": "q", "expected": "B", "metadata": {"subject": ("law", "art")[i % 2]},
              "mock": {"text": '{"answer": "B"}', "invalid_first": i % 2}} for i in range(6)]
    res = evalsup.run(tasks, base_url=mock.url, model="mock-model", out=tmp_path / "api.run", progress=False,
                      scorers=["contains"], group_by="metadata.subject", response_schema=Answer)
    assert res.total == 6 and res.succeeded == 6 and set(res.groups) == {"law", "art"}
    assert res.groups["law"]["scores"]["contains"]["accuracy"] == 1.0 and res.summary["structured"]["reasks"] == 3
    assert res.to_pandas()["group"].tolist().count("art") == 3
