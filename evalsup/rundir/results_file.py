"""Reading ``results.jsonl`` with its lines checked: the resume scan, the check of the lines a checkpoint
covers (line count + CRC-32, one read), and the checked reader that `merge`, `score`, `status` and `report`
use, so a damaged line is always one line of error naming ``results.jsonl:LINE`` and never a traceback.

A second record for an id is damage too (issue 39), wherever its first is: ``second_record`` finds it with
memory for the records after the checkpoint only. The lines a checkpoint covers hold each id once (the writer
wrote them so, and their CRC says they are as written), so only a record after it can repeat an id: the
records after it are put in an ``IdSet``, and the covered lines' ids (taken from each line's head in C, a
regex over 4 MiB blocks, in evalsup's own record form; any other line is parsed) are matched against them.
The resume, `status`, `score` and `report` refuse it (exit 2, one line naming both lines), and say what
`evalsup repair` does: it moves the second record to damaged.jsonl and keeps the first, so the task stays done.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.rundir.checkpoint import Checkpoint, JournalError, RunDirDamaged, load_checkpoint
from evalsup.rundir.crc import crc32
from evalsup.rundir.layout import DAMAGED, IDS, RESULTS
from evalsup.tasks.idset import IdSet, id_hash

CHUNK = 4 << 20
IDS_CHUNK = 1 << 20  # ids.bin read at a time (whole 16-byte pairs)
# the head of a record as output_line writes it: {"id":"batch_req_...","custom_id":<the id as JSON>, after a newline
_HEAD = re.compile(rb'\n\{"id":"[^"\n]*","custom_id":("(?:[^"\\\n]|\\.)*")')


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


def iter_records(path: Path, start: int = 0, first_line: int = 1,
                 once: bool = False) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """(line number, line, record) of each complete line from byte ``start`` (line ``first_line``); a torn last
    line (a run still writing, or killed) ends the file. Raises RunDirDamaged on a line that is no record; with
    ``once``, before the first line, on a second record for an id too (``second_record``, with the checkpoint
    beside a run directory's results.jsonl, whose covered lines are checked first, so that a line put among
    them is named by its own number): the tools count each id once."""
    if once:
        refuse_second_record(path, verify=True)
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


def refuse_second_record(path: Path, verify: bool = False) -> None:
    """Raise RunDirDamaged for the first second record of an id in a results file (``second_record``, with the
    checkpoint beside a run directory's results.jsonl, so that only the records after it are held), or for the
    first line before it that is no record. The check of ``iter_records(once=True)``, and of the Python API's
    readers (evalsup.api.results). ``verify``: first check the lines the checkpoint covers against its line
    count and CRC (``verify_covered``, as `evalsup status` does: one read), so a line changed or put among them
    is named by its own number, not by where the lines after the checkpoint seem to start."""
    cp = None
    if path.name == RESULTS:
        try:
            cp = load_checkpoint(path.parent)
        except JournalError:
            cp = None  # unreadable: every record is held as if after it
    if verify and cp is not None:
        verify_covered(path, cp)
    problem = second_record(path, cp)
    if problem is not None:
        raise problem


def records(path: Path, once: bool = False) -> Iterator[dict[str, Any]]:
    """The records of a results file, checked (see iter_records)."""
    for _, _, rec in iter_records(path, once=once):
        yield rec


def repeated(path: Path, line_no: int, cid: str, first_line: int) -> RunDirDamaged:
    """The damage of a second record for ``cid``, and what `evalsup repair` does with it."""
    return RunDirDamaged(f"{path}:{line_no}: a second record for {cid!r} (the first: line {first_line:,}); run "
                         f"`evalsup repair {path.parent}` to move it to {DAMAGED} (the first stays: the task is "
                         "done and does not run again)")


def second_record(path: Path, cp: Checkpoint | None) -> RunDirDamaged | None:
    """The first record (by line) whose id has a record on an earlier line, as the damage to say; None when
    each id has one. ``cp``: the lines it covers hold each id once (see the module); None: none is known to.
    Memory: an ``IdSet`` of the records after the checkpoint, and their ids as JSON. Raises RunDirDamaged on
    a line that is no record."""
    covered = cp.results_len if cp is not None else 0
    covered_lines = cp.results_lines if cp is not None and cp.results_lines is not None else None
    if covered and covered_lines is None:  # a checkpoint from before line counts were kept
        covered_lines = prefix_sums(path, covered)[0]
    first_tail = (covered_lines or 0) + 1
    tail = IdSet(1 << 8)
    ids: list[str] = []  # the ids after the checkpoint (each once)
    found: list[tuple[int, int, str]] = []  # (line, line of the first record, id) of second records
    with LineAt(path) as id_at:
        pos = covered
        lines_at: list[int] = []  # the tail's line offsets (to name a line from an IdSet's offset)
        for n, line, rec in iter_records(path, covered, first_tail):
            cid = rec["custom_id"]
            earlier = tail.add(cid, pos, id_at, log=False)
            if earlier is not None:
                found.append((n, first_tail + _index(lines_at, earlier), cid))
            elif covered:
                ids.append(cid)
            lines_at.append(pos)
            pos += len(line)
        if cp is not None and ids and _may_repeat(path.parent, cp, ids):
            keys = {orjson.dumps(cid) for cid in ids}  # as output_line writes them
            for line_no, cid in _covered_ids_in(path, covered, keys):
                at = tail.find(cid, id_at)
                if at is not None:
                    found.append((first_tail + _index(lines_at, at), line_no, cid))
    if not found:
        return None
    line_no, first, cid = min(found)
    return repeated(path, line_no, cid, first)


def _may_repeat(run_dir: Path, cp: Checkpoint, ids: list[str]) -> bool:
    """Whether a record after the checkpoint may be one of a task done before it, so that the covered lines
    must be read: its task was read before the frontier (its id's hash is in ids.bin, which logs every line read
    before it) and was not outstanding then, or it is a task past the frontier with a record already
    (``done_ahead``). A record of a task outstanding at the checkpoint, or read after it, is what a resume after
    a kill finds: then nothing more is read than ids.bin (16 bytes a task), and no id is held but these. When
    it cannot tell (ids.bin short or unreadable, or a rewrite not yet reconciled), True."""
    if cp.reconcile or not cp.ids_len:
        return True
    outstanding = {r.id for r in cp.outstanding}
    if not set(ids).isdisjoint(cp.done_ahead):
        return True
    hashes = {id_hash(cid) for cid in ids if cid not in outstanding}
    if not hashes:
        return False
    read = 0
    try:
        with open(run_dir / IDS, "rb") as f:
            while read < cp.ids_len:
                chunk = f.read(min(IDS_CHUNK, cp.ids_len - read))
                if not chunk:
                    return True  # shorter than the checkpoint says
                read += len(chunk)
                pairs = array("Q")
                pairs.frombytes(chunk[: len(chunk) - len(chunk) % 16])
                if not hashes.isdisjoint(pairs[0::2]):
                    return True
    except OSError:
        return True
    return False


def _index(offsets: list[int], offset: int) -> int:
    """The position of ``offset`` in the sorted ``offsets``."""
    import bisect

    return bisect.bisect_left(offsets, offset)


def _covered_ids_in(path: Path, covered: int, keys: set[bytes]) -> Iterator[tuple[int, str]]:
    """(line number, id) of each line before byte ``covered`` whose id (as JSON) is in ``keys``. Each 4 MiB
    block's heads are matched in C and compared as a set; a block with a line not in evalsup's own record form
    has its lines parsed."""
    line_no = 0  # lines before the block
    carry = b""
    with open(path, "rb") as f:
        left = covered
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            cut = chunk.rfind(b"\n") + 1
            if not cut:
                carry += chunk
                continue
            block, carry = carry + chunk[:cut], chunk[cut:]
            lines = block.count(b"\n")
            heads = _HEAD.findall(b"\n" + block)
            if len(heads) != lines:  # not every line in evalsup's form: each parsed
                heads = []
                for i, line in enumerate(block.splitlines(keepends=True)):
                    rec, why = record_problem(line)
                    if rec is None:
                        raise damaged(path, line_no + i + 1, why or "")
                    heads.append(orjson.dumps(rec["custom_id"]))
            if not keys.isdisjoint(heads):
                for i, head in enumerate(heads):
                    if head in keys:
                        yield line_no + i + 1, str(orjson.loads(head))
            line_no += lines


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
    ids = IdSet()
    with LineAt(path) as id_at:  # every line before the one read is a record (iter_records checked it)
        pos = 0
        for n, line, rec in iter_records(path):  # raises at the first line that is no record
            if lines is not None and n > lines:
                return
            earlier = ids.add(rec["custom_id"], pos, id_at)
            if earlier is not None:
                raise repeated(path, n, rec["custom_id"], _line_of(path, earlier))
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
    """Ids and success/failure counts of the complete records from ``start`` on, each line checked (a second
    record among them too; ``second_record`` looks before ``start`` as well)."""
    ids: dict[str, int] = {}  # id: its line
    ok = bad = 0
    for n, _line, rec in iter_records(path, start, first_line):
        cid = rec["custom_id"]
        first = ids.get(cid)
        if first is not None:
            raise repeated(path, n, cid, first)
        ids[cid] = n
        if rec.get("error") is None:
            ok += 1
        else:
            bad += 1
    return set(ids), ok, bad


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
        problem = second_record(path, cp)  # a record after the checkpoint for an id done before it
        if problem is not None:
            return str(problem)
    except RunDirDamaged as e:
        return str(e)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    return None


def _line_of(path: Path, offset: int) -> int:
    """The line number of the line that starts at byte ``offset`` (the slow path: an error is being named)."""
    return prefix_sums(path, offset)[0] + 1


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
