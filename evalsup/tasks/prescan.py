"""The pre-scan: every line of the task file read and checked before the first request (issue 28).

One streamed pass with ``TaskReader`` itself, so it checks exactly what the run's reading checks (JSON, UTF-8,
form, id, route, method, length, duplicate ids) and names a bad line the same way (``file:LINE: what``). It is
the first pass that builds the run's id set: each good line's (id hash, offset) goes into the ``IdSet`` the run's
reader then reads on with, which finds each line's own entry (same id, same offset: no re-read, no duplicate)
and logs it to ids.bin only as it reads it. So duplicates are decided once, here, and memory is the id set's
16 bytes a slot, nothing per line beside it. A resume scans from the checkpoint's frontier: the lines before it
were read and checked by the run, and their ids are in ids.bin, loaded into the set first.

``should_stop`` is polled every few thousand lines (a signal during a long scan ends it early).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import TaskError, TaskReader

POLL_LINES = 4096


@dataclass(frozen=True, slots=True)
class Scan:
    """What the pre-scan found, from where it began to the end of the file as it was then."""

    tasks: int = 0  # good task lines
    invalid: int = 0  # bad lines (all of them with ``keep_going``, else at most the first)
    first_bad: TaskError | None = None
    start: int = 0  # the byte offset it began at (a resume's frontier)
    end: int = 0  # the byte offset it read to
    lines: int = 0  # the physical line number of the last line read
    stopped: bool = False  # ended early by should_stop


def prescan(path: Path, max_line_bytes: int, ids: IdSet, *, start: tuple[int, int, int] = (0, 0, 0),
            keep_going: bool = False, should_stop: Callable[[], bool] = lambda: False,
            each: Callable[[dict[str, Any], int], None] | None = None) -> Scan:
    """Read ``path`` from ``start`` (offset, line number, index) to its end, adding each good line's id to
    ``ids`` (not to its log). Stops at the first bad line unless ``keep_going`` (``--on-invalid skip``: counted).
    ``each(task, index)`` sees every good line parsed (the estimate at a run's start, issue 30); a ValueError
    it raises makes the line a bad one, named as the reader names its own (``file:LINE: what``)."""
    tasks = invalid = 0
    first: TaskError | None = None
    ids.reserve(len(ids) + _lines_ahead(path, start[0]))
    with TaskReader(path, max_line_bytes, *start, ids=ids, log_ids=False) as reader:
        while True:
            if (tasks + invalid) % POLL_LINES == 0 and should_stop():
                return Scan(tasks, invalid, first, start[0], reader.offset, reader.line_no, stopped=True)
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
        return Scan(tasks, invalid, first, start[0], reader.offset, reader.line_no)


def _lines_ahead(path: Path, offset: int, sample: int = 1 << 20) -> int:
    """About how many lines the file holds from ``offset``: its size over the mean length of the lines of its
    first MiB from there (so the id set is sized once; an estimate off by a lot only costs a growth or room)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2) - offset
        f.seek(offset)
        head = f.read(sample)
    n = head.count(b"\n")
    return 0 if size <= 0 or not n else size * n // len(head)
