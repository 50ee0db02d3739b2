"""Reading the task file: lines streamed with their byte offsets, each validated, ids checked for duplicates.

Two input forms are accepted, one JSON object per line:

* OpenAI Batch API: ``{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``
* simple: ``{"id": "...", "messages": [...]}`` or ``{"id": "...", "prompt": "..."}``

Any other top-level key is carried to the output record's ``metadata``, and a line's own ``metadata`` object
is that metadata as given, the other keys beside it (a key in both is refused; see ``requests.to_request``). The
supervisor reads and validates with this module; the worker never reads the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from evalsup.tasks.body_types import body_problem, messages_problem
from evalsup.tasks.idset import IdSet
from evalsup.tasks.requests import BATCH_URLS, metadata_problem
from evalsup.tasks.routes import DEFAULT


class IdCheck(Protocol):
    """What the reader checks ids with: ``IdSet`` (in memory), ``tasks.idindex.IdIndex`` (the run's, on disk) or
    the pre-scan's ``IndexBuilder`` (collects, finds duplicates afterwards)."""

    def add(self, task_id: str, offset: int, id_at: Callable[[int], str | None], log: bool = True) -> int | None: ...

    def take_log(self) -> bytes: ...


class TaskError(Exception):
    """A bad task line. ``str(e)`` is the one-line message: ``file:line: what is wrong``."""

    def __init__(self, path: str, line_no: int, offset: int, reason: str, raw: bytes = b"") -> None:
        super().__init__(f"{path}:{line_no}: {reason}")
        self.path = path
        self.line_no = line_no
        self.offset = offset
        self.reason = reason
        self.raw = raw


@dataclass(slots=True)
class TaskRef:
    """What the supervisor keeps of an outstanding task: where it is, not what it says."""

    offset: int
    line_no: int
    id: str
    crashes: int = 0
    started: bool = False  # the worker holding it has begun it (not kept in the checkpoint)


def task_id_of(obj: dict[str, Any]) -> str | None:
    tid = obj.get("custom_id", obj.get("id"))
    if isinstance(tid, bool) or not isinstance(tid, str | int):
        return None
    return str(tid)


def validate(obj: Any) -> str:
    """Check one parsed line; return its id or raise ValueError with the reason."""
    if not isinstance(obj, dict):
        raise ValueError(f"a task line must be a JSON object, not {type(obj).__name__}")
    problem = metadata_problem(obj)
    if problem:
        raise ValueError(problem)
    if "custom_id" in obj:
        tid = task_id_of(obj)
        if tid is None or tid == "":
            raise ValueError("custom_id must be a non-empty string")
        url = obj.get("url", DEFAULT.path)
        if url not in BATCH_URLS:
            raise ValueError(f"url {url!r} is not one of {', '.join(BATCH_URLS)}")
        if not isinstance(obj.get("body"), dict):
            raise ValueError("a batch line needs a 'body' object")
        method = obj.get("method", "POST")
        if method != "POST":
            raise ValueError(f"method {method!r} is not supported (only POST)")
        problem = body_problem(url, obj["body"])  # a type the endpoint would refuse (issue 44)
        if problem:
            raise ValueError(problem)
        return tid
    if "id" not in obj:
        raise ValueError("missing id: a line needs 'custom_id' (batch form) or 'id' (simple form)")
    tid = task_id_of(obj)
    if tid is None or tid == "":
        raise ValueError("id must be a non-empty string")
    if "messages" in obj:
        problem = messages_problem(obj["messages"], "'messages'")
        if problem:
            raise ValueError(problem)
    elif "prompt" in obj:
        if not isinstance(obj["prompt"], str):
            raise ValueError("'prompt' must be a string")
    else:
        raise ValueError("a simple line needs 'messages' or 'prompt'")
    return tid


class TaskReader:
    """Streams a task file line by line, with byte offsets; memory stays flat in the file's size.

    Raises TaskError for a bad line; the reader can go on after it (``--on-invalid skip``).
    """

    def __init__(self, path: Path, max_line_bytes: int, start_offset: int = 0, start_line: int = 0,
                 start_index: int = 0, ids: IdCheck | None = None, log_ids: bool = True,
                 check: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        self.path = path
        self.name = str(path)
        self.max_line_bytes = max_line_bytes
        self._f: IO[bytes] = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self._f.seek(start_offset)
        self._peek: IO[bytes] | None = None
        self.offset = start_offset  # every line before it has been read
        self.line_no = start_line  # physical lines read (1-based numbering of the last one)
        self.index = start_index  # non-blank lines read, counting from 0 (for sharding)
        self.ids: IdCheck = ids if ids is not None else IdSet()
        self.log_ids = log_ids  # False for the pre-scan: ids.bin logs the ids of the lines the run itself read
        self.check = check  # a further check of a valid line (its own JSON schema): why it is bad, or None
        self.exhausted = False
        self._last = (start_offset, start_line, start_index)
        self.last_obj: dict[str, Any] = {}  # the line last returned, parsed (the estimate reads it: no second parse)

    def unread(self) -> None:
        """Step back over the line last read (the bad one), so the frontier stays before it."""
        self.offset, self.line_no, self.index = self._last
        self._f.seek(self.offset)
        self.exhausted = False

    def close(self) -> None:
        self._f.close()
        if self._peek is not None:
            self._peek.close()

    def __enter__(self) -> TaskReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def id_at(self, offset: int) -> str | None:
        """The id of the line at ``offset`` (None if it has none), read again from the file."""
        if self._peek is None:
            self._peek = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        self._peek.seek(offset)
        line = self._peek.readline(self.max_line_bytes + 1)
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        return task_id_of(obj) if isinstance(obj, dict) else None

    def next(self) -> tuple[TaskRef, bytes, int] | None:
        """The next task as (ref, line bytes without newline, shard index); None at the end."""
        f = self._f
        while True:
            start = self.offset
            self._last = (start, self.line_no, self.index)
            line = f.readline(self.max_line_bytes + 1)
            if not line:
                self.exhausted = True
                return None
            self.line_no += 1
            if len(line) > self.max_line_bytes and not line.endswith(b"\n"):
                while True:  # skip the rest of the huge line so the reader can go on
                    chunk = f.readline(1 << 20)
                    if not chunk or chunk.endswith(b"\n"):
                        self.offset = f.tell()
                        break
                self.index += 1
                mb = self.max_line_bytes / (1 << 20)
                raise TaskError(self.name, self.line_no, start, f"line is longer than --max-line-mb {mb:g}")
            self.offset = start + len(line)
            body = line.rstrip(b"\r\n")
            if not body.strip():
                continue
            index = self.index
            self.index += 1
            try:
                obj = orjson.loads(body)
            except orjson.JSONDecodeError as e:
                reason = "invalid UTF-8" if "UTF-8" in str(e) else f"malformed JSON ({e})"
                raise TaskError(self.name, self.line_no, start, reason, body) from None
            try:
                tid = validate(obj)
            except ValueError as e:
                raise TaskError(self.name, self.line_no, start, str(e), body) from None
            why = None if self.check is None else self.check(obj)
            if why is not None:
                raise TaskError(self.name, self.line_no, start, why, body)
            earlier = self.ids.add(tid, start, self.id_at, self.log_ids)
            if earlier is not None:
                raise TaskError(self.name, self.line_no, start, f"duplicate id {tid!r} (first seen at byte {earlier})",
                                body)
            self.last_obj = obj
            return TaskRef(start, self.line_no, tid), body, index


def read_line_at(path: Path, offset: int, max_line_bytes: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.readline(max_line_bytes + 1).rstrip(b"\r\n")
