"""The server's state on disk under --data DIR, one small JSON per object, each written temp + fsync + rename
(+ fsync of the directory), so a kill -9 at any moment leaves every object either as it was or as it became:

    files/<file-id>.json      the FileObject and its owner      files/<file-id>.data   its bytes
    batches/<batch-id>.json   the Batch, its owner, how it ends
    runs/<batch-id>/          the batch's run: input.jsonl (a hard link to the input's bytes), run/ (the evalsup
                              run directory: `evalsup status` and `report` read it), child.err
    tmp/                      uploads being received (removed at start: an upload is visible only once whole)

A file is visible once its .json exists, which is written only after its .data is complete and fsynced. The
state is held in memory too (read at start) and changed only through this class."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from evalsup.rundir.checkpoint import fsync_dir


def write_json(path: Path, obj: Any) -> None:
    """``obj`` to ``path`` atomically and durably: a temp file beside it, fsynced, renamed, the directory fsynced."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(obj))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


@dataclass
class FileRec:
    owner: str
    file: dict[str, Any]


@dataclass
class BatchRec:
    owner: str
    batch: dict[str, Any]
    ending: str | None = None  # the end a finalizing is for: completed, cancelled or expired
    total: int = 0  # lines in the input, counted by the validation
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"owner": self.owner, "batch": self.batch, "ending": self.ending, "total": self.total, **self.extra}


class Store:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.files_dir, self.batches_dir = root / "files", root / "batches"
        self.runs_dir, self.tmp_dir = root / "runs", root / "tmp"
        for d in (self.files_dir, self.batches_dir, self.runs_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, FileRec] = {}
        self.batches: dict[str, BatchRec] = {}

    def load(self) -> list[str]:
        """Read every object; remove what a crash left half done (uploads in tmp/, a .data without its .json,
        temp files). The names of what was removed."""
        removed: list[str] = []
        for p in self.tmp_dir.iterdir():
            _remove(p)
            removed.append(str(p))
        for d in (self.files_dir, self.batches_dir):
            for p in d.glob(".tmp-*"):
                p.unlink(missing_ok=True)
        for p in sorted(self.files_dir.glob("*.json")):
            obj = orjson.loads(p.read_bytes())
            self.files[p.stem] = FileRec(obj["owner"], obj["file"])
        for p in self.files_dir.glob("*.data"):
            if p.stem not in self.files:
                p.unlink(missing_ok=True)
                removed.append(str(p))
        for p in sorted(self.batches_dir.glob("*.json")):
            obj = orjson.loads(p.read_bytes())
            owner, batch, ending, total = obj.pop("owner"), obj.pop("batch"), obj.pop("ending"), obj.pop("total")
            self.batches[p.stem] = BatchRec(owner, batch, ending, total, obj)
        for p in self.runs_dir.iterdir():  # a batch whose record was never written (a crash in its create)
            if p.name not in self.batches:
                _remove(p)
                removed.append(str(p))
        return removed

    # files
    def data_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.data"

    def upload_path(self) -> Path:
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="upload-")
        os.close(fd)
        return Path(name)

    def link_input(self, file_id: str, dest: Path) -> None:
        """The file's bytes at ``dest`` too (a batch's input: a hard link, a copy where links are refused), so a
        DELETE of the file never takes a running batch's input away; durable before the batch is recorded."""
        try:
            os.link(self.data_path(file_id), dest)
        except OSError:
            shutil.copyfile(self.data_path(file_id), dest)
            with open(dest, "rb+") as f:
                os.fsync(f.fileno())
        fsync_dir(dest.parent)

    def add_file(self, owner: str, file: dict[str, Any], data: Path) -> None:
        """``data`` (complete, fsynced) becomes the file's bytes, then the file is recorded: visible from then."""
        os.replace(data, self.data_path(file["id"]))
        fsync_dir(self.files_dir)
        write_json(self.files_dir / f"{file['id']}.json", {"owner": owner, "file": file})
        self.files[file["id"]] = FileRec(owner, file)

    def delete_file(self, file_id: str) -> None:
        self.files.pop(file_id, None)
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)
        fsync_dir(self.files_dir)
        self.data_path(file_id).unlink(missing_ok=True)

    # batches
    def save_batch(self, batch_id: str, rec: BatchRec) -> None:
        write_json(self.batches_dir / f"{batch_id}.json", rec.as_json())
        self.batches[batch_id] = rec

    def delete_batch(self, batch_id: str) -> None:
        self.batches.pop(batch_id, None)
        (self.batches_dir / f"{batch_id}.json").unlink(missing_ok=True)
        _remove(self.runs_dir / batch_id)

    def run_home(self, batch_id: str) -> Path:
        return self.runs_dir / batch_id

    def owned_files(self, owner: str) -> Iterator[dict[str, Any]]:
        return (r.file for r in self.files.values() if r.owner == owner)

    def owned_batches(self, owner: str) -> Iterator[dict[str, Any]]:
        return (r.batch for r in self.batches.values() if r.owner == owner)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
