"""The batch planner: a room that decides and never acts (no I/O, no clock of its own: time is passed in).

It says which tasks make the next chunk (within the provider's limits: requests and bytes a file), what state
each chunk is in (``Step``, folded from the intent journal's events), what to do on each state the provider
reports (``on_status``), what becomes of each line of the output and error files (``on_line``), when to look
again (``PollBackoff``), and which of the provider's batches and files is a chunk's own when a resume adopts it
(``adopt_batch``, ``adopt_file``). ``evalsup.batch.driver`` carries its decisions out.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evalsup.worker.errors import RETRYABLE_KINDS, status_kind

MAX_REQUESTS = 50_000  # OpenAI's limits for one batch input file
MAX_BYTES = 200 * 1024 * 1024


class Step(enum.Enum):
    """Where one chunk is, as its journal says (each step is recorded, fsynced, before the next begins)."""

    PLANNED = "planned"  # its input file is written and its intent recorded: nothing sent yet
    UPLOADED = "uploaded"  # the provider has its input file (file id recorded)
    CREATED = "created"  # the batch exists (batch id recorded): only polling and collecting are left
    COLLECTED = "collected"  # its output and error files are on disk: its results go out from there
    DONE = "done"  # every line of it turned into a record or a follow-up: nothing left to do
    FAILED = "failed"  # the provider refused it as a whole (validation): its tasks go to a new chunk


class Act(enum.Enum):
    """What to do on a state the provider reports."""

    WAIT = "wait"  # still working: poll again after the backoff
    COLLECT = "collect"  # ended with files to read (completed, expired, cancelled): download, then record
    STOP = "stop"  # failed validation as a whole: the run stops with the provider's reason
    RECREATE = "recreate"  # failed for the provider's queue (enqueued tokens), not the file: create it again later


class Verdict(enum.Enum):
    """What becomes of one task's line in the output or error file."""

    RECORD = "record"  # written as it is (an answer, or an error that retrying will not change)
    RETRY = "retry"  # into a follow-up chunk (attempts left)
    ONLINE = "online"  # sent as one online request (--batch-fallback online)


ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
ENDED = frozenset({"completed", "expired", "cancelled"})
NOT_RUN = frozenset({"batch_expired", "batch_cancelled", "batch_missing"})  # the provider never ran it


# a batch failed for these is refused for the account's queue (OpenAI's enqueued-token limit), not its file
QUEUE_FULL = frozenset({"token_limit_exceeded", "rate_limit_exceeded"})


def on_status(status: str, failure_code: str | None = None) -> Act:
    """The act on the provider's ``status`` (``failure_code``: the first of a failed batch's errors)."""
    if status in ENDED:
        return Act.COLLECT
    if status == "failed":
        return Act.RECREATE if failure_code in QUEUE_FULL else Act.STOP
    return Act.WAIT


def retryable(status: int | None, code: str | None) -> bool:
    """An answer worth another attempt: the provider never ran it, flow control, or the server's fault."""
    if status is None:
        return code in NOT_RUN or code is None
    return status_kind(status) in RETRYABLE_KINDS  # the client's reading of a status (worker.errors)


def on_line(status: int | None, code: str | None, attempts: int, max_attempts: int, fallback: str) -> Verdict:
    """A line's fate. ``status`` None: the provider never answered it (expired, cancelled, missing from both
    files). 200 is recorded; a failure that another attempt may mend goes to a follow-up batch while attempts
    are left (``fallback`` "batch"), or online ("online"); otherwise, or with "fail", it is recorded as failed
    with the provider's code and message. A request that was never run uses no attempt of its own only in that
    it is retried; the count still bounds it."""
    if status == 200:
        return Verdict.RECORD
    if fallback == "fail" or not retryable(status, code) or attempts >= max_attempts:
        return Verdict.RECORD
    return Verdict.ONLINE if fallback == "online" else Verdict.RETRY


@dataclass
class Pending:
    """One task waiting for a chunk: its key (the supervisor's), id, request line (the batch file's) and the
    attempts it has used."""

    key: int
    tid: str
    line: bytes
    attempts: int = 0


@dataclass
class Chunker:
    """The tasks gathered for the next chunk, and when it closes: full (requests or bytes), or nothing new came
    for ``linger_s`` (the input is read, the supervisor's window is full, or a cap leaves no room) while no
    earlier chunk's results are still going out (``hold``)."""

    max_requests: int = MAX_REQUESTS
    max_bytes: int = MAX_BYTES
    linger_s: float = 0.3
    tasks: list[Pending] = field(default_factory=list)
    nbytes: int = 0
    last_add: float = 0.0

    def fits(self, p: Pending) -> bool:
        return len(self.tasks) < self.max_requests and self.nbytes + len(p.line) + 1 <= self.max_bytes

    def add(self, p: Pending, now: float) -> list[Pending] | None:
        """Add a task; returns the chunk it closed (the tasks before it) when it did not fit, else None."""
        closed = None
        if self.tasks and not self.fits(p):
            closed = self.take()
        self.tasks.append(p)
        self.nbytes += len(p.line) + 1
        self.last_add = now
        if len(self.tasks) >= self.max_requests and closed is None:
            closed = self.take()
        return closed

    def hold(self, now: float) -> None:
        """An earlier chunk's results are still going to the supervisor. Each settles its task's reservation, and
        under a cap (--max-cost, --max-total-tokens...) the supervisor hands out the tasks the settled ones make
        room for only then, a few at a time, with pauses as long as the results take: the linger starts again
        from now, so they gather into one chunk (one batch a round the cap allows) instead of one chunk a pause."""
        self.last_add = max(self.last_add, now)

    def due(self, now: float) -> list[Pending] | None:
        """The gathered tasks as a chunk, when nothing came for the linger time."""
        if self.tasks and now - self.last_add >= self.linger_s:
            return self.take()
        return None

    def take(self) -> list[Pending]:
        out, self.tasks, self.nbytes = self.tasks, [], 0
        return out

    def oversized(self, p: Pending) -> bool:
        """A single request larger than a whole file may be: it cannot go in any batch."""
        return len(p.line) + 1 > self.max_bytes


@dataclass
class ChunkInfo:
    """One chunk as the journal's events describe it (``fold``)."""

    chunk: int
    step: Step = Step.PLANNED
    sha256: str = ""
    file: str = ""  # the input file's name in the run directory's batches/ and on the provider
    keys: list[list[Any]] = field(default_factory=list)  # [key, id, attempts] per task
    endpoint: str = "/v1/chat/completions"  # the route every request of it goes to
    planned_at: float = 0.0  # unix time of its intent
    file_id: str | None = None
    batch_id: str | None = None
    status: str | None = None  # the provider's, last seen
    counts: dict[str, int] = field(default_factory=dict)
    created_at: int | None = None
    expires_at: int | None = None
    output: str | None = None  # downloaded files (names in batches/)
    errors: str | None = None
    reason: str | None = None  # why it failed


def fold(events: Iterable[dict[str, Any]]) -> dict[int, ChunkInfo]:
    """The chunks' states from the journal's events, in order (a later event of a chunk moves it on)."""
    chunks: dict[int, ChunkInfo] = {}
    for ev in events:
        n = ev.get("chunk")
        if not isinstance(n, int):
            continue
        kind = ev.get("event")
        if kind == "intent":
            chunks[n] = ChunkInfo(n, Step.PLANNED, ev["sha256"], ev["file"], ev["keys"], ev["endpoint"], ev["t"])
            continue
        c = chunks.get(n)
        if c is None:
            continue
        if kind == "uploaded":
            c.file_id, c.step = ev["file_id"], Step.UPLOADED
        elif kind == "created":
            c.batch_id, c.step = ev["batch_id"], Step.CREATED
            c.file_id = ev.get("file_id", c.file_id)
        elif kind == "state":
            c.status, c.counts = ev.get("status"), ev.get("counts") or {}
            c.created_at, c.expires_at = ev.get("created_at"), ev.get("expires_at")
        elif kind == "collected":
            c.output, c.errors, c.step = ev.get("output"), ev.get("errors"), Step.COLLECTED
        elif kind == "done":
            c.step = Step.DONE
        elif kind == "failed":
            c.step, c.reason = Step.FAILED, ev.get("reason")
    return chunks


def open_chunks(chunks: dict[int, ChunkInfo]) -> list[ChunkInfo]:
    """The chunks a (resumed) driver must carry on with: everything not done or failed, oldest first."""
    return [c for n, c in sorted(chunks.items()) if c.step not in (Step.DONE, Step.FAILED)]


def next_chunk(chunks: dict[int, ChunkInfo]) -> int:
    return max(chunks, default=0) + 1


def file_name(run_id: str, chunk: int, sha256: str) -> str:
    """A chunk's input file's name: the run, the chunk and its checksum, so a resume knows its upload."""
    return f"evalsup-{run_id}-chunk{chunk:05d}-{sha256[:16]}.jsonl"


def batch_metadata(run_id: str, chunk: int) -> dict[str, str]:
    return {"evalsup_run": run_id, "evalsup_chunk": str(chunk)}


def adopt_batch(batches: Iterable[dict[str, Any]], run_id: str, chunk: int) -> dict[str, Any] | None:
    """The provider's batch that is this chunk's (created before a crash took the record of it), if any: the
    newest whose metadata names the run and the chunk and that has not failed."""
    want = batch_metadata(run_id, chunk)
    for b in batches:
        meta = b.get("metadata") or {}
        if all(meta.get(k) == v for k, v in want.items()) and b.get("status") != "failed":
            return b
    return None


def adopt_file(files: Iterable[dict[str, Any]], name: str, size: int) -> dict[str, Any] | None:
    """The provider's file that is this chunk's upload (same name, hence same checksum; same size)."""
    for f in files:
        if f.get("filename") == name and f.get("bytes") == size and f.get("status") != "error":
            return f
    return None


@dataclass
class PollBackoff:
    """Polling intervals: from ``first_s``, times ``factor`` each poll that saw no change, up to ``max_s``; a
    change starts it again from ``first_s``."""

    first_s: float = 5.0
    max_s: float = 60.0
    factor: float = 1.5
    current: float = 0.0

    def next(self, changed: bool) -> float:
        if changed or self.current == 0.0:
            self.current = self.first_s
        else:
            self.current = min(self.max_s, self.current * self.factor)
        return self.current
