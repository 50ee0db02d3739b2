"""Structured outputs: the JSON schema an answer must follow, and whether its text does.

The schema is ``--response-schema FILE`` (loaded and checked here before the first request: a file that is
not JSON, or not a JSON schema, is refused in one line), else the task's own request: chat's
``response_format: {"type": "json_schema", "json_schema": {"schema": ...}}`` or the Responses API's
``text: {"format": {"type": "json_schema", "schema": ...}}``. Validation is the ``jsonschema`` package (the
schema's own ``$schema`` draft, else 2020-12, as OpenAI's structured outputs take). An answer's text is JSON
as given or inside one Markdown code fence (```json ... ```), as models often write it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

MAX_ERROR_CHARS = 500
_FENCE = re.compile(r"^```(?:json|JSON)?\s*(.*?)\s*```$", re.DOTALL)


class SchemaError(ValueError):
    """A schema that cannot be used; the message names the file (or the task's field) and why, in one line."""


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """``schema`` if it is a valid JSON schema (an object), else SchemaError naming ``where``."""
    import jsonschema

    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a JSON schema must be an object, not {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise SchemaError(f"{where}: not a valid JSON schema: at {path}: {_one_line(e.message)}") from None
    return schema


def load_schema_file(path: str | Path) -> dict[str, Any]:
    """The JSON schema in ``path``, checked; SchemaError (one line, naming the file) if it cannot be used."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise SchemaError(f"--response-schema {path}: cannot read it ({e.strerror})") from None
    try:
        schema = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise SchemaError(f"--response-schema {path}: not JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    return check_schema(schema, f"--response-schema {path}")


def schema_of_request(body: Any) -> dict[str, Any] | None:
    """The JSON schema a request asks its answer to follow (chat's ``response_format``, the Responses API's
    ``text.format``), or None."""
    if not isinstance(body, dict):
        return None
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema" and isinstance(rf.get("json_schema"), dict):
        schema = rf["json_schema"].get("schema")
        return schema if isinstance(schema, dict) else None
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return dict(fmt["schema"])
    return None


def validation_error(text: str, schema: dict[str, Any]) -> str | None:
    """Why ``text`` is not a JSON value that ``schema`` accepts (one line), or None when it is."""
    import jsonschema

    t = text.strip()
    m = _FENCE.match(t)
    if m:
        t = m.group(1)
    try:
        value = orjson.loads(t)
    except orjson.JSONDecodeError as e:
        return _one_line(f"the answer is not valid JSON: {e.msg} (line {e.lineno} column {e.colno})")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    err = jsonschema.exceptions.best_match(cls(schema).iter_errors(value))
    if err is None:
        return None
    path = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return _one_line(f"the answer does not match the JSON schema: at {path}: {err.message}")


def _one_line(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= MAX_ERROR_CHARS else s[: MAX_ERROR_CHARS - 3] + "..."
