"""Structured outputs: the JSON schema an answer must follow, and whether its text does.

The schema is ``--response-schema FILE`` (loaded and checked here before the first request: a file that is
not JSON, or not a JSON schema, is refused in one line), else the task's own request: chat's
``response_format: {"type": "json_schema", "json_schema": {"schema": ...}}`` or the Responses API's
``text: {"format": {"type": "json_schema", "schema": ...}}``. Validation is the ``jsonschema`` package (the
schema's own ``$schema`` draft, else 2020-12, as OpenAI's structured outputs take). An answer's text is JSON
as given or inside one Markdown code fence (```json ... ```), as models often write it.

References (``$ref``, ``$dynamicRef``) are followed only inside the schema itself (issue 39): every validator
is built on ``NO_RETRIEVAL``, a ``referencing`` registry whose retrieval refuses every URI, so no URL and no
file is ever read for a schema; ``check_schema`` looks every reference up before any request (the flag's at
the start, each task's in the pre-scan) and refuses one that points outside the schema or nowhere in it.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from referencing import Registry, Resource
from referencing.exceptions import NoSuchAnchor, NoSuchResource, PointerToNowhere, Unresolvable

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

MAX_ERROR_CHARS = 500
_FENCE = re.compile(r"^```(?:json|JSON)?\s*(.*?)\s*```$", re.DOTALL)


class SchemaError(ValueError):
    """A schema that cannot be used; the message names the file (or the task's field) and why, in one line."""


def _refuse(uri: str) -> Resource[Any]:
    """The registry's retrieval: nothing outside the schema is ever read (no network, no file)."""
    raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class


NO_RETRIEVAL: Registry[Any] = Registry(retrieve=_refuse)  # type: ignore[call-arg]  # an attrs class


def validator(schema: dict[str, Any]) -> Validator:
    """The validator of ``schema`` (its ``$schema`` draft, else 2020-12), its references resolved only inside
    it (the drafts' own meta-schemas, which jsonschema ships, aside)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, registry=NO_RETRIEVAL)


def check_schema(schema: Any, where: str) -> dict[str, Any]:
    """``schema`` if it is a valid JSON schema (an object) whose every reference points inside it, else
    SchemaError naming ``where``."""
    import jsonschema

    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a JSON schema must be an object, not {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
        problem = unresolved_reference(schema, cls.META_SCHEMA.get("$schema", ""))
    except jsonschema.SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        raise SchemaError(f"{where}: not a valid JSON schema: at {path}: {_one_line(e.message)}") from None
    except RecursionError:  # jsonschema checks a schema recursively: past ~130 levels, Python's stack is out
        raise SchemaError(f"{where}: nested too deeply to be checked") from None
    if problem is not None:
        raise SchemaError(f"{where}: {problem}")
    return schema


def unresolved_reference(schema: dict[str, Any], dialect: str) -> str | None:
    """Why the first reference of ``schema`` that cannot be followed inside it cannot (one line, with where it
    is), or None when every ``$ref`` and ``$dynamicRef`` can. Subschemas are walked as the ``referencing``
    library walks them for ``dialect`` (so an ``$id`` moves the base URI as the validator's lookups will);
    nothing is retrieved."""
    import referencing.jsonschema
    from referencing import Specification

    spec = referencing.jsonschema.specification_with(dialect, default=Specification.OPAQUE)
    root = spec.create_resource(schema)
    where: dict[int, str] = {}
    _paths(schema, "", where)
    todo = [(root, NO_RETRIEVAL.resolver_with_root(root))]
    while todo:
        resource, resolver = todo.pop()
        contents = resource.contents
        if isinstance(contents, dict):
            for keyword in ("$ref", "$dynamicRef"):
                ref = contents.get(keyword)
                if not isinstance(ref, str):
                    continue
                try:
                    resolver.lookup(ref)
                except (PointerToNowhere, NoSuchAnchor):
                    return _one_line(f"{keyword} {ref!r} at {where.get(id(contents)) or '(root)'} points nowhere "
                                     "in the schema")
                except Unresolvable:
                    return _one_line(f"{keyword} {ref!r} at {where.get(id(contents)) or '(root)'} is outside the "
                                     "schema: references are followed only inside it, nothing is fetched")
        todo.extend((sub, resolver.in_subresource(sub)) for sub in reversed(list(resource.subresources())))
    return None


def _paths(node: Any, path: str, where: dict[int, str]) -> None:
    """Each object's and array's path in ``node`` (``properties/a``), by identity, to name where a reference
    is."""
    if isinstance(node, dict):
        where[id(node)] = path
        for k, v in node.items():
            if isinstance(v, dict | list):
                _paths(v, f"{path}/{k}" if path else str(k), where)
    elif isinstance(node, list):
        where[id(node)] = path
        for i, v in enumerate(node):
            if isinstance(v, dict | list):
                _paths(v, f"{path}/{i}" if path else str(i), where)


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


MEMO = 1024  # distinct schemas remembered (at most 1 KiB each: the schema's bytes, or their digest), each verdict
WHERE = "the task's response_format json_schema"


class TaskSchemas:
    """Each task's own JSON schema compiled (``check_schema``: valid, every reference inside it), each distinct
    one once."""

    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, str | None] = OrderedDict()

    def problem(self, obj: dict[str, Any]) -> str | None:
        """Why the line's own schema cannot be used (one line), or None (it has none, or it can be)."""
        body = obj.get("body") if "custom_id" in obj else None  # only the batch form carries a request's fields
        schema = schema_of_request(body)
        if schema is None:
            return None
        try:
            key = orjson.dumps(schema)  # as written (a file's schemas are written alike): itself, or its digest
        except TypeError:  # nested past orjson's 255 levels: compiled (and refused) without the memo
            return _problem(schema)
        key = b"=" + key if len(key) <= 1024 else b"#" + hashlib.blake2b(key, digest_size=16).digest()
        if key in self._seen:
            self._seen.move_to_end(key)
            return self._seen[key]
        why = _problem(schema)
        self._seen[key] = why
        if len(self._seen) > MEMO:
            self._seen.popitem(last=False)
        return why


def _problem(schema: dict[str, Any]) -> str | None:
    try:
        check_schema(schema, WHERE)
    except SchemaError as e:
        return str(e)
    return None


def task_schemas(validate: bool, run_schema: dict[str, Any] | None) -> TaskSchemas | None:
    """What compiles each task's own schema, when the run validates answers against it (validation on, no
    --response-schema over it); None: the tasks' schemas are only sent."""
    return TaskSchemas() if validate and run_schema is None else None


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
    try:
        err = jsonschema.exceptions.best_match(validator(schema).iter_errors(value))
    except Unresolvable as e:  # check_schema refuses such a schema first; never fetched either way
        return _one_line(f"the JSON schema's reference {e.ref!r} cannot be followed inside it")
    except RecursionError:  # an answer nested deeper than Python's stack lets jsonschema check
        return "the answer is nested too deeply to be checked against the JSON schema"
    if err is None:
        return None
    path = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return _one_line(f"the answer does not match the JSON schema: at {path}: {err.message}")


def _one_line(s: str) -> str:
    s = " ".join(s.split())
    return s if len(s) <= MAX_ERROR_CHARS else s[: MAX_ERROR_CHARS - 3] + "..."
