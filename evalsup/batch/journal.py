"""The intent journal of a Batch API run: ``batches.jsonl`` in the run directory, and the chunks' files in
``batches/``.

One JSON event a line, appended and fsynced before the step it announces may cost anything: ``run`` (the run's
id, once), then per chunk ``intent`` (its number, checksum, file name and tasks, written after its input file is
on disk and before the upload), ``uploaded`` (file id), ``created`` (batch id), ``state`` (the provider's status,
counts, created and expiry times, when they change), ``collected`` (the output and error files are on disk),
``done``, ``failed``; ``reupload`` (the provider would not list files, so a resumed chunk's input was uploaded
again rather than looked for: a note, no step). ``evalsup.batch.plan.fold`` turns the events into each chunk's
state; ``evalsup status`` reads the same. Design invariant 11: intent before anything that costs money. The batch
driver is the only writer (a lock on the journal's own file keeps a replacement driver waiting for its
predecessor).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from evalsup.batch.plan import ChunkInfo, fold
from evalsup.rundir.layout import BATCH_FILES, BATCHES


def read_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The journal's complete events (a torn last line, from a kill mid-write, is not an event)."""
    try:
        f = open(run_dir / BATCHES, "rb")  # noqa: SIM115  (a generator's file, closed by the with below)
    except FileNotFoundError:
        return
    with f:
        for line in f:
            if not line.endswith(b"\n"):
                return
            with contextlib.suppress(orjson.JSONDecodeError):
                ev = orjson.loads(line)
                if isinstance(ev, dict):
                    yield ev


def chunks_of(run_dir: Path) -> dict[int, ChunkInfo]:
    return fold(read_events(run_dir))


def run_id_of(run_dir: Path) -> str | None:
    for ev in read_events(run_dir):
        if ev.get("event") == "run":
            return str(ev["run_id"])
    return None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """The driver's writer of batches.jsonl (held under an exclusive lock for the driver's life)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.files = run_dir / BATCH_FILES
        self.files.mkdir(exist_ok=True)
        self.f = open(run_dir / BATCHES, "ab")  # noqa: SIM115  (held for the driver's life, with its lock)
        fcntl.flock(self.f.fileno(), fcntl.LOCK_EX)  # a predecessor driver still going: wait for its end
        self._truncate_torn()  # a line a kill cut short (under the lock: no writer is mid-line)
        fsync_dir(run_dir)
        run_id = run_id_of(run_dir)
        if run_id is None:
            run_id = os.urandom(8).hex()
            self.append({"event": "run", "run_id": run_id})
        self.run_id = run_id

    def _truncate_torn(self) -> None:
        path = self.run_dir / BATCHES
        with contextlib.suppress(FileNotFoundError), open(path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def append(self, ev: dict[str, Any]) -> None:
        self.f.write(orjson.dumps(ev) + b"\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def chunks(self) -> dict[int, ChunkInfo]:
        return chunks_of(self.run_dir)

    def write_file(self, name: str, data: bytes) -> str:
        """A chunk's file, durably (temp, fsync, rename, fsync of the directory); its sha256."""
        path = self.files / name
        tmp = path.with_name(name + ".partial")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(self.files)
        return hashlib.sha256(data).hexdigest()

    def close(self) -> None:
        self.f.close()
