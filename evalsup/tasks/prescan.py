"""The pre-scan: every line of the task file read and checked before the first request (issue 28).

One streamed pass with ``TaskReader`` itself, so it checks exactly what the run's reading checks (JSON, UTF-8,
form, id, route, method, length) and names a bad line the same way (``file:LINE: what``). Duplicate ids are
found on disk with bounded memory (issue 33): each good line's (id hash, offset) goes to an
``tasks.idindex.IndexBuilder``, whose sorted runs are merged once the pass is over; a duplicate is two equal
hashes whose lines' ids are equal when read again (a collision never is one). The ``IdIndex`` built is what the
run's reader reads on with: it knows which lines before the scan's end are duplicates, and looks up the lines
appended after it. A resume scans from the checkpoint's frontier: the lines before it were read and checked by the
run, and their pairs (ids.bin) are given to the builder first.

A task's own JSON schema (``response_format``'s, the Responses API's ``text.format``) is compiled here too when
the run validates answers against it (``response_schema.TaskSchemas``, the reader's ``check``): one that is no
JSON schema, or whose ``$ref`` points outside it or nowhere in it, is a bad line (issue 39), so no worker ever
meets it; nothing is fetched.

``should_stop`` is polled every few thousand lines (a signal during a long scan ends it early).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsup.tasks.idindex import IdIndex, IndexBuilder
from evalsup.tasks.reader import TaskError, TaskReader, read_line_at
from evalsup.tasks.response_schema import TaskSchemas

POLL_LINES = 4096


@dataclass(frozen=True, slots=True)
class Scan:
    """What the pre-scan found, from where it began to the end of the file as it was then."""

    tasks: int = 0  # good task lines (duplicates not counted)
    invalid: int = 0  # bad lines (all of them with ``keep_going``, else at most the first)
    first_bad: TaskError | None = None
    start: int = 0  # the byte offset it began at (a resume's frontier)
    end: int = 0  # the byte offset it read to
    lines: int = 0  # the physical line number of the last line read
    stopped: bool = False  # ended early by should_stop
    index: IdIndex | None = None  # the id index the run reads on with (its owner closes it)


def prescan(path: Path, max_line_bytes: int, ids: IndexBuilder, *, start: tuple[int, int, int] = (0, 0, 0),
            keep_going: bool = False, should_stop: Callable[[], bool] = lambda: False,
            each: Callable[[dict[str, Any], int], None] | None = None, schemas: TaskSchemas | None = None) -> Scan:
    """Read ``path`` from ``start`` (offset, line number, index) to its end, giving each good line's id to
    ``ids``, then build the index. Stops at the first bad line unless ``keep_going`` (``--on-invalid skip``:
    counted); a duplicate id is a bad line too. ``each(task, index)`` sees every good line parsed (the estimate
    at a run's start, issue 30); a ValueError it raises makes the line a bad one, named as the reader names its
    own (``file:LINE: what``). With ``schemas`` each line's own JSON schema is compiled (the reader's
    ``check``, as the run's reader checks it): one that cannot be used makes the line a bad one."""
    tasks = invalid = 0
    first: TaskError | None = None
    stopped = False
    with TaskReader(path, max_line_bytes, *start, ids=ids, log_ids=False,
                    check=None if schemas is None else schemas.problem) as reader:
        while True:
            if (tasks + invalid) % POLL_LINES == 0 and should_stop():
                stopped = True
                break
            try:
                got = reader.next()
            except TaskError as e:
                invalid += 1
                first = first or e
                if keep_going:
                    continue
                break
            if got is None:
                break
            if each is not None:
                try:
                    each(reader.last_obj, got[2])
                except ValueError as e:  # the caller refuses the line (a request with no form at the provider)
                    invalid += 1
                    first = first or TaskError(str(path), reader.line_no, got[0].offset, str(e))
                    if keep_going:
                        continue
                    break
            tasks += 1
        index = ids.build(reader.offset, reader.id_at)
        dup = index.first_duplicate
        if dup is not None:
            tasks -= index.duplicates
            invalid = invalid + index.duplicates if keep_going else 1
            if first is None or dup[0] < first.offset:
                first = _duplicate(reader, path, start, dup)
        return Scan(tasks, invalid, first, start[0], reader.offset, reader.line_no, stopped, index)


def _duplicate(reader: TaskReader, path: Path, start: tuple[int, int, int], dup: tuple[int, int]) -> TaskError:
    """The error for the duplicate line at ``dup[0]`` (first seen at ``dup[1]``), as the reader names it: its
    line number is counted from the scan's start (once, for the first one only)."""
    offset, earlier = dup
    line_no = start[1] + 1
    with open(path, "rb") as f:
        f.seek(start[0])
        left = offset - start[0]
        while left > 0:
            chunk = f.read(min(1 << 22, left))
            if not chunk:
                break
            line_no += chunk.count(b"\n")
            left -= len(chunk)
    body = read_line_at(path, offset, reader.max_line_bytes)
    tid = reader.id_at(offset)
    return TaskError(reader.name, line_no, offset, f"duplicate id {tid!r} (first seen at byte {earlier})", body)
