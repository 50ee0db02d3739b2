"""A JSON schema's references are followed only inside it (issue 39; tasks/response_schema.py): a reference
outside the schema or to nowhere in it is refused in one line saying where it is; every validator evalsup
builds (the answer's check, the json_valid scorer) retrieves nothing. ``urllib.request.urlopen`` (what
jsonschema's default retrieval calls) is replaced by a recorder, so a retrieval would be seen, not sent."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from referencing.exceptions import Unresolvable

from evalsup.scoring.scorers import ScorerOptions, json_valid
from evalsup.tasks.reader import TaskError, TaskReader
from evalsup.tasks.response_schema import SchemaError, TaskSchemas, check_schema, task_schemas, validation_error

REMOTE = "http://127.0.0.1:9/answer.json"


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every URL jsonschema's default retrieval would open (none is)."""
    seen: list[str] = []

    def record(url: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(getattr(url, "full_url", url)))
        raise OSError("not opened in a unit test")

    monkeypatch.setattr(urllib.request, "urlopen", record)
    return seen


def _chat(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


@pytest.mark.parametrize(("schema", "why"), [
    ({"properties": {"a": {"$ref": REMOTE}}}, f"$ref {REMOTE!r} at properties/a is outside the schema"),
    ({"items": {"$ref": "file:///etc/passwd"}}, "$ref 'file:///etc/passwd' at items is outside the schema"),
    ({"$id": "https://example.com/root.json", "allOf": [{"$ref": "other.json"}]},
     "$ref 'other.json' at allOf/0 is outside the schema"),  # relative to the schema's $id: another document
    ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, "at (root) is outside the schema"),
    ({"properties": {"a": {"$ref": "#/definitions/missing"}}, "definitions": {"b": {}}},
     "$ref '#/definitions/missing' at properties/a points nowhere in the schema"),
    ({"$defs": {"a": {"$anchor": "here"}}, "items": {"$ref": "#there"}}, "'#there' at items points nowhere"),
    ({"prefixItems": [{"$dynamicRef": "#nowhere"}]}, "$dynamicRef '#nowhere' at prefixItems/0 points nowhere"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "items": [{}, {"$ref": "#/definitions/x"}]},
     "'#/definitions/x' at items/1 points nowhere"),
])
def test_a_reference_outside_the_schema_or_to_nowhere_is_refused_in_one_line(
        schema: dict[str, Any], why: str, opened: list[str]) -> None:
    with pytest.raises(SchemaError) as e:
        check_schema(schema, "--response-schema s.json")
    assert str(e.value).startswith("--response-schema s.json: ") and why in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and opened == []


@pytest.mark.parametrize("schema", [
    {"properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}},
    {"$id": "https://example.com/root.json", "$defs": {"a": {"$id": "a.json", "type": "string"}},
     "properties": {"a": {"$ref": "a.json"}, "b": {"$ref": "https://example.com/a.json"}}},  # embedded by $id
    {"$defs": {"a": {"$anchor": "here", "type": "string"}}, "properties": {"a": {"$ref": "#here"}}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {"type": "string"}},
     "properties": {"a": {"$ref": "#/definitions/a"}}},
    {"type": "object", "properties": {"$ref": {"type": "string"}}},  # a property named $ref is no reference
    {"enum": [{"$ref": REMOTE}]},  # nor is a value that looks like one
])
def test_references_inside_the_schema_are_followed(schema: dict[str, Any], opened: list[str]) -> None:
    assert check_schema(schema, "w") is schema
    assert opened == []


def test_the_answers_check_retrieves_nothing_where_jsonschema_by_default_would(opened: list[str]) -> None:
    schema = {"properties": {"a": {"$ref": REMOTE}}}
    with pytest.raises(Exception):  # noqa: B017 - whatever the default retrieval's failure is called
        jsonschema.Draft202012Validator(schema).validate({"a": 1})
    assert opened == [REMOTE]  # what the validator evalsup built before would do
    opened.clear()
    why = validation_error('{"a": 1}', schema)  # never reached after check_schema; still no retrieval
    assert why is not None and REMOTE in why and opened == []


def test_the_json_valid_scorer_retrieves_nothing(opened: list[str]) -> None:
    task = {"schema": {"properties": {"a": {"$ref": REMOTE}}}}
    with pytest.raises(Unresolvable):  # a scorer error, as the worker names any
        json_valid(task, _chat('{"a": 1}'), ScorerOptions())
    assert opened == []
    local = {"schema": {"properties": {"a": {"$ref": "#/$defs/n"}}, "$defs": {"n": {"type": "integer"}}}}
    assert json_valid(local, _chat('{"a": 1}'), ScorerOptions()) == 1.0
    assert json_valid(local, _chat('{"a": "x"}'), ScorerOptions()) == 0.0


def _line(i: int, schema: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return {"custom_id": f"t{i}", "body": body}


def test_each_tasks_own_schema_is_compiled_by_the_reader_and_a_bad_one_names_its_line(tmp_path: Path) -> None:
    good = {"properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}}
    bad = {"properties": {"a": {"$ref": REMOTE}}}
    rows = [_line(0, good), _line(1, None), _line(2, good), _line(3, bad), _line(4, {"type": "objekt"})]
    rows.append({"id": "simple", "prompt": "q", "response_format": bad})  # metadata of a simple line: not sent
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    schemas = task_schemas(True, None)
    assert schemas is not None
    read: list[str] = []
    errors: list[tuple[int, str]] = []
    with TaskReader(path, 1 << 20, check=schemas.problem) as reader:
        while True:
            try:
                got = reader.next()
            except TaskError as e:
                errors.append((e.line_no, e.reason))
                continue
            if got is None:
                break
            read.append(got[0].id)
    assert read == ["t0", "t1", "t2", "simple"]
    assert [n for n, _ in errors] == [4, 5]
    assert errors[0][1].startswith(f"the task's response_format json_schema: $ref {REMOTE!r} at properties/a is "
                                   "outside the schema")
    assert errors[1][1].startswith("the task's response_format json_schema: not a valid JSON schema: at type:")


def test_the_tasks_schemas_are_compiled_only_when_answers_are_checked_against_them() -> None:
    assert task_schemas(False, None) is None  # --no-validate-schema: only sent
    assert task_schemas(True, {"type": "object"}) is None  # --response-schema is the one checked
    assert isinstance(task_schemas(True, None), TaskSchemas)


def test_a_schema_nested_past_what_can_be_checked_is_one_line_not_a_traceback() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(300):  # a task line may hold it (orjson parses 1,024 levels); jsonschema's check recurses
        deep = {"items": deep}
    assert TaskSchemas().problem(_line(0, deep)) == "the task's response_format json_schema: nested too deeply to " \
                                                    "be checked"
    with pytest.raises(SchemaError) as e:
        check_schema(deep, "--response-schema s.json")
    assert str(e.value) == "--response-schema s.json: nested too deeply to be checked"
