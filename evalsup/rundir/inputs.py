"""Inputs that are not a plain JSONL file: ``.jsonl.gz``, ``.jsonl.zst``, ``-`` (stdin), a FIFO, or (from the
Python API) an iterable of task dicts.

Each is streamed once into the run directory's own plain copy, ``RUN_DIR/tasks.jsonl``, and the run reads
that copy like any task file: byte offsets, ``read_line_at`` for redone tasks, the fingerprint check, resume
after ``kill -9``, all unchanged. Offsets are those of the decompressed stream. The copy costs disk (the
decompressed size) but no memory (1 MiB at a time), and it is what makes a one-shot stream resumable at all.

On a rerun the input is compared with the copy, never trusted blindly:

* a compressed file whose size, mtime and ends are unchanged since it was copied is not read again;
* anything else is streamed again beside the copy and hashed: the same content keeps the existing copy (so the
  run resumes); different content is refused once the run has results (``--fresh`` starts over); without
  results the new copy replaces the old.

``RUN_DIR/input.json`` records where the copy came from and its hash (``evalsup.read_results(..., ordered=True)``
reads it to find the task file).
"""

from __future__ import annotations

import enum
import hashlib
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.rundir import layout
from evalsup.rundir.checkpoint import fsync_dir, write_atomic
from evalsup.tasks.fingerprint import fingerprint

COPY_NAME = layout.INPUT_COPY
INFO_NAME = layout.INPUT_INFO
_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class InputError(Exception):
    """The input cannot be read; ``str(e)`` is one line naming it and the cause."""


class InputKind(enum.StrEnum):
    """What an input is (input.json's "kind")."""

    FILE = "file"  # a plain JSONL file, read in place
    GZIP = "gzip"
    ZSTD = "zstd"
    STDIN = "stdin"
    FIFO = "fifo"
    ITERABLE = "iterable"  # task dicts given to evalsup.run() from Python


@dataclass(frozen=True)
class Source:
    kind: InputKind
    name: str  # what messages call it
    path: Path | None = None


def classify(path: Path) -> Source:
    """What kind of input ``path`` is (by its content's magic bytes, not only its name)."""
    if str(path) == "-":
        return Source(InputKind.STDIN, "stdin")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):  # a named pipe, /dev/stdin, <(...)
        return Source(InputKind.FIFO, str(path), path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: not a regular file, FIFO or '-'")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    name = path.name
    if head.startswith(GZIP_MAGIC):
        return Source(InputKind.GZIP, str(path), path)
    if head.startswith(ZSTD_MAGIC):
        return Source(InputKind.ZSTD, str(path), path)
    if name.endswith(".gz") or name.endswith(".zst"):
        what = "gzip" if name.endswith(".gz") else "zstandard"
        raise InputError(f"{path}: not a {what} file (its first bytes are not {what}'s)")
    return Source(InputKind.FILE, str(path), path)


def _chunks(src: Source) -> Iterator[bytes]:
    """The input's (decompressed) bytes, a chunk at a time."""
    try:
        if src.kind == InputKind.STDIN:
            if sys.stdin is None or sys.stdin.isatty():
                raise InputError("stdin (-) is a terminal: pipe the tasks in, e.g. `... | evalsup run - --out DIR`")
            f: IO[bytes] = sys.stdin.buffer
            yield from iter(lambda: f.read(_CHUNK), b"")
            return
        assert src.path is not None
        with open(src.path, "rb") as raw:
            if src.kind == InputKind.GZIP:
                import gzip
                import zlib

                try:
                    with gzip.GzipFile(fileobj=raw) as g:
                        yield from iter(lambda: g.read(_CHUNK), b"")
                except (OSError, EOFError, zlib.error) as e:
                    raise InputError(f"{src.name}: not a valid gzip stream ({e})") from None
            elif src.kind == InputKind.ZSTD:
                try:
                    import zstandard
                except ImportError:
                    raise InputError(f"{src.name}: reading .zst needs the zstandard package: "
                                     "pip install 'evalsup[zstd]'") from None
                try:
                    with zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True) as z:
                        yield from iter(lambda: z.read(_CHUNK), b"")
                except zstandard.ZstdError as e:
                    raise InputError(f"{src.name}: not a valid zstandard stream ({e})") from None
            else:
                yield from iter(lambda: raw.read(_CHUNK), b"")
    except OSError as e:
        raise InputError(f"{src.name}: cannot read: {e.strerror or e}") from None


def _encode(obj: Any) -> Any:
    """orjson's fallback for values of dataframes and datasets: numpy scalars and arrays, dates."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def iter_lines(tasks: Iterable[Any]) -> Iterator[bytes]:
    """Task dicts as JSONL, about a MiB at a time (one dict in memory at a time).

    Each line is copied into the chunk at once rather than kept until the chunk is joined: orjson's output for
    a 1 KB task holds a 16 KB allocation (orjson 3.13 does not shrink its buffer), so a list of a chunk's
    thousand lines held 16 MB of heap for 1 MiB of text, 10 MB of it resident, as much as the heap's earlier
    pages made it (measured: the API's copy of 5,000 1 KB tasks peaked 10 MB above its start; now 3-4 MB)."""
    buf = bytearray()
    for i, obj in enumerate(tasks):
        if not isinstance(obj, dict):
            raise InputError(f"tasks[{i}]: a task must be a dict, not {type(obj).__name__}")
        try:
            buf += orjson.dumps(obj, default=_encode, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)
        except TypeError as e:
            raise InputError(f"tasks[{i}]: cannot be written as JSON ({e})") from None
        if len(buf) >= _CHUNK:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _copy_hash(run_dir: Path, info: dict[str, Any] | None) -> str | None:
    """The sha256 of the existing copy: from input.json when it still describes the file, else hashed again
    (a kill between the copy's rename and input.json's write leaves input.json behind)."""
    copy = run_dir / COPY_NAME
    try:
        st = os.stat(copy)
    except FileNotFoundError:
        return None
    if info and info.get("copy_size") == st.st_size and info.get("copy_mtime_ns") == st.st_mtime_ns:
        return str(info["sha256"])
    return _hash_file(copy)


def load_info(run_dir: Path) -> dict[str, Any] | None:
    try:
        d = orjson.loads((run_dir / INFO_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return d if isinstance(d, dict) else None


def _has_results(run_dir: Path) -> bool:
    r = run_dir / layout.RESULTS
    return (run_dir / layout.CHECKPOINT).exists() or (r.exists() and r.stat().st_size > 0)


def materialize(src: Source, run_dir: Path, chunks: Iterable[bytes] | None = None, log: Any = None) -> Path:
    """The plain task file the run reads: ``src.path`` itself for a plain file, else RUN_DIR/tasks.jsonl,
    written (or checked) as the module's docstring says. Raises InputError."""
    if src.kind == InputKind.FILE:
        assert src.path is not None
        return src.path
    say = log or (lambda msg: None)
    copy = run_dir / COPY_NAME
    info = load_info(run_dir)
    source_fp = fingerprint(src.path) if src.kind in (InputKind.GZIP, InputKind.ZSTD) and src.path is not None else None
    if (source_fp is not None and info is not None and info.get("source_fingerprint") == source_fp
            and copy.exists() and _copy_hash(run_dir, info) == info.get("sha256")):
        return copy  # the same compressed file, already copied: not read again
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create run directory {run_dir}: {e.strerror}") from None
    partial = run_dir / (COPY_NAME + ".partial")
    h = hashlib.sha256()
    n = 0
    try:
        with open(partial, "wb") as f:
            for chunk in chunks if chunks is not None else _chunks(src):
                h.update(chunk)
                f.write(chunk)
                n += len(chunk)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise InputError(f"cannot write {partial}: {e.strerror}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    sha = h.hexdigest()
    old = _copy_hash(run_dir, info)
    if old == sha:
        partial.unlink()
        say(f"{src.name}: the same {n:,} bytes as the run directory's copy; resuming from it")
    else:
        if old is not None and _has_results(run_dir):
            partial.unlink()
            raise InputError(f"{src.name}: not the tasks the run in {run_dir} started with (its copy {copy}); "
                             "rerun with --fresh (fresh=True) to start over, or use another --out")
        os.replace(partial, copy)
        fsync_dir(run_dir)
    st = os.stat(copy)
    record = {"kind": src.kind, "source": str(src.path.resolve()) if src.path is not None else src.name,
              "tasks": str(copy.resolve()), "sha256": sha, "bytes": n, "copy_size": st.st_size,
              "copy_mtime_ns": st.st_mtime_ns, "source_fingerprint": source_fp}
    write_atomic(run_dir / INFO_NAME, orjson.dumps(record, option=orjson.OPT_INDENT_2))
    return copy
