"""Structured outputs: the schema an answer must follow, whether its text does, and the request that asks
again (worker/reask.py, tasks/response_schema.py); and the mock's invalid-then-valid knob."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evalsup.mock.content import INVALID_JSON, assistant_turns
from evalsup.tasks.response_schema import SchemaError, load_schema_file, schema_of_request, validation_error
from evalsup.worker import reask

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["A", "B"]},
                                                             "confidence": {"type": "number"}},
                          "required": ["answer"], "additionalProperties": False}


def _chat(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(("text", "error"), [
    ('{"answer": "A"}', None),
    ('  {"answer": "B", "confidence": 0.9}\n', None),
    ('```json\n{"answer": "A"}\n```', None),  # one Markdown fence, as models write it
    ('{"answer": "C"}', "at answer: 'C' is not one of ['A', 'B']"),
    ('{"confidence": 1}', "at (root): 'answer' is a required property"),
    ('{"answer": "A", "why": 1}', "Additional properties are not allowed"),
    ('{"answer": "A"', "the answer is not valid JSON"),
    ("The answer is A.", "the answer is not valid JSON"),
    ("", "the answer is not valid JSON"),
])
def test_an_answer_is_checked_against_its_schema(text: str, error: str | None) -> None:
    v = reask.check(_chat(text), SCHEMA)
    assert v.text == text
    if error is None:
        assert v.error is None
    else:
        assert v.error is not None and error in v.error and "\n" not in v.error


def test_the_text_of_a_responses_api_answer_is_checked() -> None:
    body = {"output": [{"type": "message", "content": [{"type": "output_text", "text": '{"answer": "B"}'}]}]}
    assert reask.check(body, SCHEMA).error is None


def test_a_chat_request_is_asked_again_with_the_answer_and_the_error() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Pick one."}], "temperature": 0}
    nxt = reask.next_request(body, "A", "the answer is not valid JSON")
    assert nxt is not None and nxt["model"] == "m" and nxt["temperature"] == 0
    assert nxt["messages"][:1] == body["messages"] and len(body["messages"]) == 1  # the task's own is untouched
    assert nxt["messages"][1] == {"role": "assistant", "content": "A"}
    assert nxt["messages"][2]["role"] == "user" and "the answer is not valid JSON" in nxt["messages"][2]["content"]
    again = reask.next_request(nxt, "B", "still not")
    assert again is not None
    assert [m["role"] for m in again["messages"]] == ["user", "assistant", "user", "assistant", "user"]


def test_a_responses_request_is_asked_again_whatever_its_input() -> None:
    nxt = reask.next_request({"input": "Pick one."}, "x", "bad")
    assert nxt is not None and [t["role"] for t in nxt["input"]] == ["user", "assistant", "user"]
    assert nxt["input"][0]["content"] == "Pick one."
    items = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Pick."}]
    nxt = reask.next_request({"input": items}, "x", "bad")
    assert nxt is not None and nxt["input"][:2] == items and len(nxt["input"]) == 4


def test_a_legacy_completion_cannot_be_asked_again() -> None:
    assert reask.next_request({"prompt": "Pick one:"}, "x", "bad") is None


def test_the_schema_is_the_runs_else_the_requests_own() -> None:
    chat = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}
    resp = {"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}}
    assert schema_of_request(chat) == SCHEMA and schema_of_request(resp) == SCHEMA
    assert schema_of_request({"messages": [], "response_format": {"type": "json_object"}}) is None
    assert reask.schema_for(chat, {"type": "string"}) == {"type": "string"}  # --response-schema wins
    assert reask.schema_for(chat, None) == SCHEMA and reask.schema_for({"messages": []}, None) is None
    bad = {"messages": [], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}}
    with pytest.raises(SchemaError, match="the task's response_format json_schema: not a valid JSON schema"):
        reask.schema_for(bad, None)


def test_the_records_error() -> None:
    assert reask.failure("at answer: bad", 2) == {"code": "schema_invalid",
                                                  "message": "at answer: bad after 2 re-asks"}
    assert reask.failure("bad", 0)["message"] == "bad"


@pytest.mark.parametrize(("content", "why"), [
    ('{"type": "object",', "not JSON (line 1 column 19"),
    ('{"type": "objekt"}', "not a valid JSON schema: at type:"),
    ('{"properties": {"a": {"minLength": -1}}}', "not a valid JSON schema: at properties/a/minLength:"),
    ("[1, 2]", "a JSON schema must be an object, not list"),
])
def test_a_schema_file_that_cannot_be_used_is_refused_in_one_line(tmp_path: Path, content: str, why: str) -> None:
    f = tmp_path / "schema.json"
    f.write_text(content)
    with pytest.raises(SchemaError) as e:
        load_schema_file(f)
    assert str(e.value).startswith(f"--response-schema {f}: ") and why in str(e.value) and "\n" not in str(e.value)


def test_a_good_schema_file_loads(tmp_path: Path) -> None:
    f = tmp_path / "schema.json"
    f.write_text('{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}')
    assert load_schema_file(f)["type"] == "object"


def test_the_mock_counts_the_reasks_of_a_conversation() -> None:
    body = {"messages": [{"role": "user", "content": "q"}]}
    assert assistant_turns(body) == 0
    nxt = reask.next_request(body, INVALID_JSON, "bad")
    assert nxt is not None and assistant_turns(nxt) == 1
    assert assistant_turns({"input": "q"}) == 0 and validation_error(INVALID_JSON, {}) is not None


def test_the_python_api_takes_a_dict_or_a_pydantic_model() -> None:
    pydantic = pytest.importorskip("pydantic")
    from evalsup.api.options import schema_dict

    class Pick(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        answer: str
        confidence: float

    schema = schema_dict(Pick)
    assert schema["required"] == ["answer", "confidence"] and schema["properties"]["confidence"]["type"] == "number"
    assert reask.check(_chat('{"answer": "A", "confidence": 1}'), schema).error is None
    assert reask.check(_chat('{"answer": "A"}'), schema).error is not None
    assert schema_dict(SCHEMA) is SCHEMA
    with pytest.raises(TypeError, match="a path, a dict or a pydantic model class"):
        schema_dict(Pick(answer="A", confidence=1.0))


def test_validation_is_on_by_default_and_off_only_without_a_run_schema(tmp_path: Path) -> None:
    """--max-reasks 0 keeps validation (schema_invalid at once); --no-validate-schema turns a task's own schema's
    validation off, cannot go with --response-schema, and is a request setting in run.json (it changes records)."""
    from evalsup.config.run_config import ConfigError, build_config
    from evalsup.rundir.run_json import differences, request_settings

    url = "http://127.0.0.1:9/v1"
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object"}')
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [url], "max_reasks": 0})
    assert cfg.worker.validate_schema and cfg.worker.max_reasks == 0
    off = build_config(tmp_path / "t.jsonl", {"base_url": [url], "validate_schema": False, "max_reasks": 0})
    assert not off.worker.validate_schema
    assert differences(request_settings(cfg), request_settings(off)) == [
        "validate_schema (--validate-schema): True then, False now"]
    with pytest.raises(ConfigError, match="--no-validate-schema cannot go with --response-schema"):
        build_config(tmp_path / "t.jsonl", {"base_url": [url], "validate_schema": False,
                                            "response_schema": str(schema)})

