"""A task's group for ``--group-by metadata.KEY``: the value of one key of its record's metadata.

The worker names each result's group in its RESULT meta (the supervisor never reads a record), and
`evalsup report`, `evalsup score` and ``to_pandas`` read the same key from the records: one rule for all.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_GROUP_CHARS = 200  # a group's name is cut to this length
MISSING = "(none)"  # the group of a task whose metadata lacks the key
PREFIX = "metadata."


class GroupByError(ValueError):
    """A --group-by that names no metadata key; the message says what to give."""


def parse_group_by(spec: str) -> tuple[str, ...]:
    """``metadata.KEY`` (or ``metadata.KEY.SUB`` for a nested object) as the key path (KEY, SUB)."""
    path = tuple(spec[len(PREFIX):].split(".")) if spec.startswith(PREFIX) else ()
    if not path or not all(path):
        raise GroupByError(f"--group-by {spec!r}: give metadata.KEY, a key of the tasks' metadata "
                           "(e.g. metadata.subject)")
    return path


def group_of(metadata: Any, path: tuple[str, ...]) -> str:
    """The group of a task whose record's metadata is ``metadata``: the value at ``path`` as a string (a number
    or an object as JSON), cut to MAX_GROUP_CHARS; MISSING when the task has none."""
    v = metadata
    for key in path:
        v = v.get(key) if isinstance(v, dict) else None
    if v is None:
        return MISSING
    s = v if isinstance(v, str) else orjson.dumps(v).decode()
    return s[:MAX_GROUP_CHARS]
