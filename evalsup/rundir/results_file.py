"""Reading ``results.jsonl`` with its lines checked: the resume scan, the check of the lines a checkpoint
covers (line count + CRC-32, one read), and the checked reader that `merge`, `score`, `status` and `report`
use, so a damaged line is always one line of error naming ``results.jsonl:LINE`` and never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.rundir.checkpoint import Checkpoint, RunDirDamaged, load_checkpoint
from evalsup.rundir.crc import crc32
from evalsup.rundir.layout import DAMAGED, RESULTS

CHUNK = 4 << 20


def repair_hint(run_dir: Path) -> str:
    return (f"run `evalsup repair {run_dir}` to move damaged lines to {DAMAGED} (their tasks run again, "
            "once, on the next resume)")


def record_problem(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the record, None) for a good results line (newline included or not), else (None, what is wrong)."""
    try:
        rec = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        return None, f"not JSON ({e})"
    if not isinstance(rec, dict):
        return None, f"a record must be a JSON object, not {type(rec).__name__}"
    cid = rec.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return None, "not a result record (no custom_id)"
    if "response" not in rec and "error" not in rec:  # e.g. a task line (batch form): custom_id and body only
        return None, "not a result record (neither response nor error)"
    return rec, None


def damaged(path: Path, line_no: int, why: str) -> RunDirDamaged:
    return RunDirDamaged(f"{path}:{line_no}: {why}; {repair_hint(path.parent)}")


def iter_records(path: Path, start: int = 0, first_line: int = 1) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """(line number, line, record) of each complete line from byte ``start`` (line ``first_line``); a torn last
    line (a run still writing, or killed) ends the file. Raises RunDirDamaged on a line that is no record."""
    with open(path, "rb") as f:
        f.seek(start)
        n = first_line
        for line in f:
            if not line.endswith(b"\n"):
                return
            rec, why = record_problem(line)
            if rec is None:
                raise damaged(path, n, why or "")
            yield n, line, rec
            n += 1


def records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a results file, checked (see iter_records)."""
    for _, _, rec in iter_records(path):
        yield rec


def complete_length(path: Path) -> int:
    """Length of the file up to and including its last newline (where a torn last line starts)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            step = min(pos, 1 << 16)
            f.seek(pos - step)
            chunk = f.read(step)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return pos - step + i + 1
            pos -= step
    return 0


def prefix_sums(path: Path, length: int, start: int = 0, lines: int = 0, crc: int = 0) -> tuple[int, int]:
    """(lines, CRC-32) of the first ``length`` bytes of the file, in one read; from ``start`` on, given the
    ``lines`` and ``crc`` of the bytes before it."""
    with open(path, "rb") as f:
        f.seek(start)
        left = length - start
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            crc = crc32(chunk, crc)
            left -= len(chunk)
    return lines, crc


def verify_covered(path: Path, cp: Checkpoint, keep: int | None = None) -> None:
    """Check results[:L] against the checkpoint's line count and CRC; on a mismatch, name the first line that
    is not a record (or say the covered lines were changed). ``keep``: the file's complete length, if known.
    Raises RunDirDamaged."""
    keep = complete_length(path) if keep is None else keep
    if keep < cp.results_len:
        _find_damage(path, None)
        raise RunDirDamaged(f"{path}:1-{cp.results_lines or '?'}: shorter than its checkpoint says ({keep:,} < "
                            f"{cp.results_len:,} bytes), lines were cut; {repair_hint(path.parent)}")
    if cp.results_crc is None or cp.results_lines is None or cp.results_len == 0:
        return  # a checkpoint from before these were kept: the scan after L is all there is
    lines, crc = prefix_sums(path, cp.results_len)
    if (lines, crc) == (cp.results_lines, cp.results_crc):
        return
    _find_damage(path, lines)
    raise RunDirDamaged(f"{path}:1-{lines}: the {cp.results_lines:,} lines its checkpoint covers were changed "
                        f"(line count or checksum differ: {lines:,} lines now); {repair_hint(path.parent)}")


def _find_damage(path: Path, lines: int | None) -> None:
    """Raise RunDirDamaged for the first line (of the first ``lines``) that is no record or a second record
    for an id; return if there is none. The slow path, taken only once something did not check out."""
    from evalsup.tasks.idset import IdSet

    ids = IdSet()
    with LineAt(path) as id_at:  # every line before the one read is a record (iter_records checked it)
        pos = 0
        for n, line, rec in iter_records(path):  # raises at the first line that is no record
            if lines is not None and n > lines:
                return
            earlier = ids.add(rec["custom_id"], pos, id_at)
            if earlier is not None:
                raise damaged(path, n, f"a second record for {rec['custom_id']!r}")
            pos += len(line)


@dataclass
class ResumeState:
    checkpoint: Checkpoint
    done_after: set[str]  # D: ids whose records lie after L
    succeeded_after: int
    failed_after: int
    torn_bytes: int  # bytes of a torn final line that were cut

    @property
    def done(self) -> int:
        cp = self.checkpoint
        return cp.succeeded + cp.failed + self.succeeded_after + self.failed_after


def scan_results(path: Path, start: int, first_line: int = 1) -> tuple[set[str], int, int]:
    """Ids and success/failure counts of the complete records from ``start`` on, each line checked."""
    ids: set[str] = set()
    ok = bad = 0
    for n, _line, rec in iter_records(path, start, first_line):
        cid = rec["custom_id"]
        if cid in ids:
            raise damaged(path, n, f"a second record for {cid!r}")
        ids.add(cid)
        if rec.get("error") is None:
            ok += 1
        else:
            bad += 1
    return ids, ok, bad


def check_run_dir(run_dir: Path) -> str | None:
    """For `evalsup status` and friends: None if results.jsonl checks out against its checkpoint, else the
    one-line error. Reads the file once (read-only)."""
    path = run_dir / RESULTS
    try:
        cp = load_checkpoint(run_dir)
        if not path.exists():
            return None
        if cp is None:
            scan_results(path, 0)
            return None
        verify_covered(path, cp)
        scan_results(path, cp.results_len, (cp.results_lines or 0) + 1)
    except RunDirDamaged as e:
        return str(e)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    return None


def counts_on_disk(run_dir: Path) -> tuple[int, int]:
    """(succeeded, failed) as a rerun will find them: the last checkpoint's counts plus the complete records
    after it. For the figures printed after a failed write (disk full)."""
    cp = load_checkpoint(run_dir)
    path = run_dir / RESULTS
    start = cp.results_len if cp is not None else 0
    ok, bad = (cp.succeeded, cp.failed) if cp is not None else (0, 0)
    if path.exists():
        _, ok_after, bad_after = scan_results(path, start)
        ok, bad = ok + ok_after, bad + bad_after
    return ok, bad


def json_file(path: Path) -> dict[str, Any] | None:
    """A run directory's JSON file (summary.json, run.json...) as an object; None when missing or unreadable."""
    try:
        obj = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


class LineAt:
    """The line at a byte offset of a results file, and (called) its record's id: the one reader behind every
    id -> offset index (tasks.idset.IdSet) of records. With ``writer``, the file is being written through it,
    which is flushed before each read. The offsets given are those of whole record lines."""

    def __init__(self, path: Path, writer: IO[bytes] | None = None) -> None:
        self.path = path
        self.writer = writer
        self.f: IO[bytes] | None = None

    def __call__(self, offset: int) -> str | None:
        return str(orjson.loads(self.line(offset))["custom_id"])

    def line(self, offset: int) -> bytes:
        if self.writer is not None:
            self.writer.flush()
        if self.f is None:
            self.f = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        self.f.seek(offset)
        return self.f.readline()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None

    def __enter__(self) -> LineAt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
