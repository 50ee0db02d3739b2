"""Task lines: streaming them with byte offsets, validating them, and the output record format.

Two input forms are accepted, one JSON object per line:

* OpenAI Batch API: ``{"custom_id": "...", "method": "POST", "url": "/v1/chat/completions", "body": {...}}``
* simple: ``{"id": "...", "messages": [...]}`` or ``{"id": "...", "prompt": "..."}``

Any other top-level key is carried to the output record's ``metadata``. This module is a pure library:
the supervisor uses it to read and validate lines, the worker to turn a line into a request and a result
into an output line.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.idset import IdSet

BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
_BATCH_KEYS = frozenset(("custom_id", "method", "url", "body"))
_SIMPLE_KEYS = frozenset(("id", "messages", "prompt"))


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
    if "custom_id" in obj:
        tid = task_id_of(obj)
        if tid is None or tid == "":
            raise ValueError("custom_id must be a non-empty string")
        url = obj.get("url", "/v1/chat/completions")
        if url not in BATCH_URLS:
            raise ValueError(f"url {url!r} is not one of {', '.join(BATCH_URLS)}")
        if not isinstance(obj.get("body"), dict):
            raise ValueError("a batch line needs a 'body' object")
        method = obj.get("method", "POST")
        if method != "POST":
            raise ValueError(f"method {method!r} is not supported (only POST)")
        return tid
    if "id" not in obj:
        raise ValueError("missing id: a line needs 'custom_id' (batch form) or 'id' (simple form)")
    tid = task_id_of(obj)
    if tid is None or tid == "":
        raise ValueError("id must be a non-empty string")
    if "messages" in obj:
        if not isinstance(obj["messages"], list) or not obj["messages"]:
            raise ValueError("'messages' must be a non-empty list")
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
                 start_index: int = 0, ids: IdSet | None = None) -> None:
        self.path = path
        self.name = str(path)
        self.max_line_bytes = max_line_bytes
        self._f: IO[bytes] = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed in close()
        self._f.seek(start_offset)
        self._peek: IO[bytes] | None = None
        self.offset = start_offset  # every line before it has been read
        self.line_no = start_line  # physical lines read (1-based numbering of the last one)
        self.index = start_index  # non-blank lines read, counting from 0 (for sharding)
        self.ids = ids if ids is not None else IdSet()
        self.exhausted = False
        self._last = (start_offset, start_line, start_index)

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

    def _id_at(self, offset: int) -> str | None:
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
            earlier = self.ids.add(tid, start, self._id_at)
            if earlier is not None:
                raise TaskError(self.name, self.line_no, start, f"duplicate id {tid!r} (first seen at byte {earlier})",
                                body)
            return TaskRef(start, self.line_no, tid), body, index


def read_line_at(path: Path, offset: int, max_line_bytes: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.readline(max_line_bytes + 1).rstrip(b"\r\n")


_FAST_KEYS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def fingerprint(path: Path, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The input's identity: its size and the SHA-256 of its content. ``known`` is the fingerprint recorded
    by the run being resumed: when size, mtime, ctime, inode and device all match it, the file was not
    written since and the hash is not recomputed (the only use of the times: a ``touch`` or a copy is
    hashed, and is the same input when its bytes are). When the file is longer than ``known`` says, the
    hash of its first ``known["size"]`` bytes is taken in the same pass (``prefix``), so a file that only
    grew by appending is recognised without reading it twice (see same_input)."""
    import hashlib

    st = os.stat(path)
    fast = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}
    if known is not None and "sha256" in known and all(known.get(k) == fast[k] for k in _FAST_KEYS):
        return {k: v for k, v in known.items() if k != "prefix"}
    cut = known.get("size") if known is not None else None
    cut = cut if isinstance(cut, int) and 0 < cut < st.st_size else None
    h = hashlib.sha256()
    prefix: dict[str, Any] | None = None
    done = 0
    with open(path, "rb") as f:
        if cut is not None:  # the old length first, to know the hash of what was there before
            while done < cut and (chunk := f.read(min(1 << 20, cut - done))):
                h.update(chunk)
                done += len(chunk)
            if done == cut:
                prefix = {"size": cut, "sha256": h.copy().hexdigest()}
        while chunk := f.read(1 << 20):
            h.update(chunk)
            done += len(chunk)
    fp: dict[str, Any] = {**fast, "size": done, "sha256": h.hexdigest()}
    if prefix is not None and done > cut:  # type: ignore[operator]
        fp["prefix"] = prefix
    return fp


def _legacy_fingerprint(path: Path) -> dict[str, Any]:
    """The fingerprint of evalsup before content hashing (size, mtime, the first and last MiB)."""
    import hashlib

    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if st.st_size > 1 << 20:
            f.seek(max(1 << 20, st.st_size - (1 << 20)))
            h.update(f.read(1 << 20))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256_ends": h.hexdigest()}


def same_input(old: dict[str, Any], new: dict[str, Any], path: Path | None = None) -> str:
    """"same" (the same bytes), "grown" (the old bytes with lines appended) or "changed"."""
    if old.get("shard") != new.get("shard"):
        return "changed"
    if old.get("sha256") is None:  # a run directory of an older evalsup: its own, stricter test
        legacy = {k: v for k, v in old.items() if k != "shard"}
        return "same" if path is not None and _legacy_fingerprint(path) == legacy else "changed"
    if old.get("size") == new.get("size") and old.get("sha256") == new.get("sha256"):
        return "same"
    if new.get("prefix") == {"size": old.get("size"), "sha256": old.get("sha256")}:
        return "grown"
    return "changed"


# ----- requests (worker side) -----

def public_url(url: str) -> str:
    """An endpoint's URL as records, logs and the summary show it: no user:password@ and no query (either may
    hold a credential)."""
    u = urllib.parse.urlsplit(url)
    host = u.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((u.scheme, host, u.path, "", ""))


def join_url(base_url: str, path: str) -> str:
    """base ".../v1" + "/v1/chat/completions" -> ".../v1/chat/completions" (no doubled /v1), as the openai SDK."""
    base = base_url.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False


def to_request(obj: dict[str, Any], defaults: RequestDefaults) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A parsed task line as (url path, request body, metadata of extra keys)."""
    if "custom_id" in obj:
        url = obj.get("url", "/v1/chat/completions")
        body = dict(obj["body"])
        meta = {k: v for k, v in obj.items() if k not in _BATCH_KEYS}
    else:
        url = "/v1/chat/completions"
        messages = obj["messages"] if "messages" in obj else [{"role": "user", "content": obj["prompt"]}]
        body = {"messages": messages}
        meta = {k: v for k, v in obj.items() if k not in _SIMPLE_KEYS}
        if "mock" in meta:  # the project's mock server reads per-request test behaviour from the body
            body["mock"] = meta.pop("mock")
    if defaults.model is not None:
        body.setdefault("model", defaults.model)
    if defaults.max_tokens is not None and url != "/v1/embeddings":
        body.setdefault("max_tokens", defaults.max_tokens)
    if defaults.temperature is not None and url != "/v1/embeddings":
        body.setdefault("temperature", defaults.temperature)
    if defaults.stream and url in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        body.setdefault("stream", True)
    return url, body, meta


# ----- output records -----

def record_id() -> str:
    """A record's ``id``, as OpenAI's Batch output has it: ``batch_req_`` and 24 random hex digits (unique per
    record; a task written again after a crash gets a new one)."""
    return "batch_req_" + os.urandom(12).hex()


def record_error(error: dict[str, str] | None) -> dict[str, Any] | None:
    """The record's ``error``: the server's own code (when it sent one) and message, its type and param (or
    null), and evalsup's code in ``evalsup_code`` (``http_400``, ``timeout_read``, ``stream_cut``, ...)."""
    if error is None:
        return None
    own = error["code"]
    return {"code": error.get("server_code") or own, "message": error.get("message", ""),
            "type": error.get("type"), "param": error.get("param"), "evalsup_code": own}


def output_line(task_id: str, *, status: int | None, request_id: str | None, body: Any,
                error: dict[str, str] | None, metrics: dict[str, Any], metadata: dict[str, Any] | None,
                scores: dict[str, float | None] | None = None, score_errors: dict[str, str] | None = None) -> bytes:
    """One line of results.jsonl (OpenAI Batch output format plus metrics and metadata), newline included.

    ``body`` may be an ``orjson.Fragment`` holding the endpoint's raw JSON, so it is not encoded twice.
    """
    rec: dict[str, Any] = {
        "id": record_id(),
        "custom_id": task_id,
        "response": None if status is None else {"status_code": status, "request_id": request_id or None,
                                                  "body": body},
        "error": record_error(error),
        "metrics": metrics,
    }
    if metadata:
        rec["metadata"] = metadata
    if scores is not None:
        rec["scores"] = scores
    if score_errors:
        rec["score_errors"] = score_errors
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)


def output_line_around(task_id: str, **fields: Any) -> tuple[bytes, bytes]:
    """The output line for a response whose body is the endpoint's own one-line JSON, as (head, tail): the
    line is head + body + tail, so a large body is written as it came, never copied into a line. ``fields``
    are output_line's, without ``body``."""
    # orjson writes a NUL byte only as the contents of a Fragment (in strings it is escaped as \u0000)
    head, _, tail = output_line(task_id, body=orjson.Fragment(b"\0"), **fields).partition(b"\0")
    return head, tail


def grew_at_line_end(path: Path, old_size: int) -> bool:
    """A grown file whose old part ended a line (or whose new part starts one): the old last line is intact."""
    if old_size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(old_size - 1)
        two = f.read(2)
    return two[:1] == b"\n" or two[1:2] in (b"\n", b"\r")
