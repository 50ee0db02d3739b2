"""The batch driver: the process a ``--batch-api`` run starts in the place of its workers (``python -m
evalsup.batch``). It speaks the workers' frames (CONFIG, TASK, DRAIN, RELEASE in; READY, RESULT, RETURNED,
HEARTBEAT, FATAL, BYE out), so the supervisor, its ledger, the journal, checkpoints, scorers, summary, status,
merge and shards hold unchanged: the supervisor stays the only writer of results.jsonl (design invariant 3).

A task handed to it joins the next chunk (``plan.Chunker``); a closed chunk's input file is written to the run
directory and its intent recorded (``journal``, fsynced) before the upload; then the upload, the create (with
``metadata`` naming the run and the chunk), each recorded as it returns; polling with backoff
(``plan.PollBackoff``); the output and error files downloaded to the run directory, recorded; then each line
becomes a RESULT (``records.build``), a follow-up chunk or an online request (``plan.on_line``). A resume adopts
what the journal names and the provider already has (``plan.adopt_batch``/``adopt_file``) instead of paying
again; every provider call goes through ``calls.call`` (retries, a listing the provider does not serve, a
refusal's stop). A chunk gathering stays open while another's results are handed on (``Chunker.hold``). A task's
own ``response_format`` JSON schema is validated as online with ``--max-reasks 0`` (an answer that fails it is
recorded ``schema_invalid``: a batch cannot ask again), and ``--group-by`` names each result's group as a worker
does. A task of a collected chunk whose record is missing (a crash took it, or `evalsup repair`) is answered
again from the chunk's files, but not one whose record from that chunk `run --retry-failed` took out
(replaced.jsonl names the chunk): that task is sent again (``_forget_replaced``). A chunk is marked done once the
checkpoint settles every task of it (``settle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from evalsup.batch.anthropic import AnthropicClient, anthropic_headers
from evalsup.batch.anthropic_shapes import Ambiguous, as_batch, candidates, choose_running, parse_result
from evalsup.batch.calls import RESUME, Stop, Unlisted, call
from evalsup.batch.client import BatchClient, ProviderError
from evalsup.batch.journal import Journal, fsync_dir
from evalsup.batch.plan import (
    Act,
    Chunker,
    ChunkInfo,
    Pending,
    PollBackoff,
    Step,
    Verdict,
    adopt_batch,
    adopt_file,
    batch_metadata,
    file_name,
    next_chunk,
    on_line,
    on_status,
    open_chunks,
)
from evalsup.batch.records import Answer, build, not_run, parse_line
from evalsup.common.process import quiet_gc
from evalsup.config import exitcodes as ex
from evalsup.ipc import FrameKind, FrameWriter, decode_json, encode_json, split_meta
from evalsup.ipc.frames import FrameParser
from evalsup.ipc.messages import WorkerConfig
from evalsup.ipc.ring import POS
from evalsup.rundir.checkpoint import load_checkpoint
from evalsup.rundir.layout import CHECKPOINT, REPLACED
from evalsup.scoring.scorers import ScorerOptions
from evalsup.tasks.anthropic import MESSAGES_PATH, Untranslatable, custom_id, task_params
from evalsup.tasks.group_key import group_of, parse_group_by
from evalsup.tasks.headers import api_key, build_headers, key_source, request_headers
from evalsup.tasks.requests import RequestDefaults, credentials, public_url, to_request
from evalsup.tasks.response_schema import SchemaError
from evalsup.tasks.secrets import run_scrubber
from evalsup.worker import reask
from evalsup.worker.pipes import FLUSH_DELAY_S, Outbox, fatal_start, open_pipes, read_config
from evalsup.worker.scoring import Scoring

CRASH_ENV = "EVALSUP_BATCH_CRASH_AT"  # testing hook: kill -9 the run at this step (see ``_crash_at``)


@dataclass
class Held:
    """A task the supervisor handed over: its id, metadata, attempts used and the chunk it is in."""

    tid: str
    metadata: dict[str, Any]
    attempts: int = 0
    chunk: int | None = None
    schema: dict[str, Any] | None = None  # the request's own response_format JSON schema, validated on its answer
    bad_schema: dict[str, str] | None = None  # the record's error when that schema is no JSON schema
    model: str | None = None  # the model its request asks (an answer is priced by its response's, else this one)
    own_model: bool = False  # the task named it (not the run's --model): kept in the record's metrics.model


@dataclass
class Invalid(Answer):
    """A 200 whose answer fails its task's JSON schema: the record keeps the answer, its error is ``why``
    (schema_invalid), as an online run's with --max-reasks 0."""

    why: dict[str, str] = field(default_factory=dict)

    @property
    def error(self) -> dict[str, Any] | None:
        return self.why


def checked(a: Answer, h: Held) -> Answer:
    """``a`` against its task's schema (when it has one and the answer is a 200): as it is, or ``Invalid``."""
    if a.status != 200 or (h.schema is None and h.bad_schema is None):
        return a
    why = h.bad_schema
    if why is None:
        assert h.schema is not None
        verdict = reask.check(a.body, h.schema)
        why = None if verdict.error is None else reask.failure(verdict.error, 0)
    if why is None:
        return a
    return Invalid(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Answer)}, why=why)


def _crash_at(step: str) -> None:
    """Testing hook: with EVALSUP_BATCH_CRASH_AT=step, SIGKILL the supervisor and this process here (a kill -9
    of the whole run at that moment)."""
    if os.environ.get(CRASH_ENV) == step:
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class Driver:
    def __init__(self, cfg: WorkerConfig, reader: asyncio.StreamReader, out: FrameWriter, journal: Journal) -> None:
        assert cfg.batch is not None
        b = cfg.batch
        self.cfg = cfg
        self.reader = reader
        self.out = out
        self.outbox = Outbox(out, cfg.ring_fd, cfg.ring_size)
        self.journal = journal
        self.run_dir = Path(b["run_dir"])
        self.max_requests = int(b["max_requests"])
        self.max_bytes = int(b["max_bytes"])
        self.window = str(b.get("completion_window", "24h"))
        self.fallback = str(b.get("fallback", "batch"))
        self.cancel = bool(b.get("cancel", False))
        self.linger_s = float(b.get("linger_s", 0.3))
        self.poll = (float(b["poll_s"]), float(b["poll_max_s"]))
        self.defaults = RequestDefaults(cfg.model, cfg.max_tokens, cfg.temperature, False)
        base, _ = credentials(cfg.endpoints[0])
        self.base = base
        self.endpoint_info = {"index": 0, "url": public_url(cfg.endpoints[0])}
        # every secret the run knows, out of each record and message (issue 39: the workers' one list)
        self.scrub = run_scrubber(cfg.endpoints, cfg.headers, cfg.api_key_env, cfg.api_key_file)
        key = api_key(cfg.api_key_env, cfg.api_key_file)
        self.provider = str(b.get("provider", "openai"))  # "openai" (Files and Batches) or "anthropic" (Messages)
        self.anthropic = self.provider == "anthropic"
        if self.anthropic:
            self.headers = anthropic_headers(build_headers(cfg.headers), key)
        else:
            self.headers = request_headers(cfg.endpoints[0], build_headers(cfg.headers), key,
                                           key_source(cfg.api_key_env, cfg.api_key_file))
        self.aclient: AnthropicClient | None = None
        self.adopting = asyncio.Lock()  # one Anthropic adoption (or create) at a time: a batch is claimed once
        self.unadopted: set[int] = set()  # resumed Anthropic chunks with no batch id yet (their adoption pending)
        self.scoring: Scoring | None = None
        if cfg.scorers:
            opts = ScorerOptions(cfg.score_strip, cfg.score_ignore_case, cfg.score_pattern, cfg.score_normalize)
            self.scoring = Scoring(list(cfg.scorers), opts, cfg.scorer_timeout_s, cfg.scorer_threads)
        self.group_path = parse_group_by(cfg.group_by) if cfg.group_by else None  # --group-by metadata.KEY
        self.pid = os.getpid()
        self.held: dict[int, Held] = {}
        self.chunks: dict[int, ChunkInfo] = journal.chunks()
        self.next_n = next_chunk(self.chunks)
        self.key_chunk: dict[int, int] = {}  # the open chunk each task of it belongs to (a resume's tasks)
        # chunk -> answers whose task is not (yet) handed over: the answer, or where it is in the chunk's files
        self.pending: dict[int, dict[int, Answer | tuple[str, int]]] = {}
        self._cp_seen = -1  # the checkpoint's mtime last read by ``settle``
        self._where: dict[int, dict[str, int]] = {}  # chunk -> where each request is in its input file
        self.chunkers: dict[str, Chunker] = {}
        self.live: set[asyncio.Task[None]] = set()
        self.client: BatchClient | None = None
        self.session: aiohttp.ClientSession | None = None
        self.done = 0
        self.draining = False
        self.stopped = asyncio.Event()
        self.last_task = time.monotonic()  # when the last TASK came (`evalsup cancel` waits for the redo)
        self.key_att: dict[int, int] = {}  # the attempts each of them had used (from its chunk's intent)
        self.sending = 0  # RESULTs being built: the pipe is flushed when none is left
        self.collecting = 0  # chunks whose results are being handed on (a chunk gathering waits for them)
        for c in open_chunks(self.chunks):  # oldest first: a follow-up chunk's claim on a task wins
            for k, _tid, att in c.keys:
                self.key_chunk[int(k)] = c.chunk
                self.key_att[int(k)] = int(att)
        self._forget_replaced()

    def _forget_replaced(self) -> None:
        """The tasks whose record from a chunk still open here `run --retry-failed` took out of results.jsonl
        (replaced.jsonl holds that record, its ``metrics.batch.chunk`` naming the chunk): they are to be sent
        again, in a new chunk, never answered again from that chunk's files. A crash after the new chunk's intent
        leaves that chunk the task's claim (it is younger), so the retry is sent once."""
        collected = {c.chunk for c in open_chunks(self.chunks) if c.step is Step.COLLECTED}
        if not collected:
            return
        taken: set[tuple[int, str]] = set()
        with contextlib.suppress(FileNotFoundError), open(self.run_dir / REPLACED, "rb") as f:
            for line in f:
                with contextlib.suppress(orjson.JSONDecodeError, KeyError, AttributeError, TypeError):
                    rec = orjson.loads(line)
                    n = rec["metrics"]["batch"].get("chunk")
                    if n in collected:
                        taken.add((n, str(rec["custom_id"])))
        for n in collected:
            for k, tid, _a in self.chunks[n].keys:
                if (n, str(tid)) in taken and self.key_chunk.get(int(k)) == n:
                    del self.key_chunk[int(k)]
                    self.key_att.pop(int(k), None)

    # ----- tasks in -----

    def on_task(self, meta: Any, line: bytes | memoryview) -> None:
        self.last_task = time.monotonic()
        k = int(meta["k"])
        obj = orjson.loads(line)
        tid = str(obj.get("custom_id", obj.get("id")))
        url, body, metadata = to_request(obj, self.defaults)
        schema, bad = self._schema(body)
        asked = body.get("model")
        asked = asked if isinstance(asked, str) and asked else None
        own = asked is not None and asked != self.defaults.model
        n = self.key_chunk.get(k)
        if n is not None:  # a task of a chunk already under way (a resume): its answer comes from that chunk
            self.held[k] = Held(tid, metadata, self.key_att.get(k, 0), n, schema, bad, asked, own)
            got = self.pending.get(n, {}).pop(k, None)
            if got is not None:
                self._spawn(self._answer(n, k, got if isinstance(got, Answer) else self._reread(*got)))
            return
        self.held[k] = Held(tid, metadata, schema=schema, bad_schema=bad, model=asked, own_model=own)
        if self.cancel:
            return  # `evalsup cancel`: nothing new is sent; the task stays outstanding for a rerun
        if self.anthropic:  # the request translated (the pre-scan refused what cannot be, unless skipped)
            try:
                params, _ = task_params(obj, self.defaults)
            except Untranslatable as e:
                self._record(not_run(tid, "batch_untranslatable", str(e)), k, 0, {}, 0.0)
                return
            req = orjson.dumps({"custom_id": custom_id(tid), "params": params})
            self._gather(Pending(k, tid, req, 0), MESSAGES_PATH)
            return
        body.pop("stream", None)  # a batch answers whole
        body.pop("stream_options", None)
        req = orjson.dumps({"custom_id": tid, "method": "POST", "url": url, "body": body})
        self._gather(Pending(k, tid, req, 0), url)

    def _cid(self, tid: str) -> str:
        """A task's custom_id in the chunk's input file (Anthropic's takes fewer characters)."""
        return custom_id(tid) if self.anthropic else tid

    def _parse(self, obj: dict[str, Any]) -> Answer:
        """One line of a chunk's output or error file (``Answer.tid``: its custom_id)."""
        return parse_result(obj) if self.anthropic else parse_line(obj)

    def _schema(self, body: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
        """The request's own JSON schema (--response-schema is refused with --batch-api), or the error of one that
        is not a JSON schema; (None, None) with --no-validate-schema or without one."""
        if not self.cfg.validate_schema:
            return None, None
        try:
            return reask.schema_for(body, None), None
        except SchemaError as e:
            return None, reask.bad_schema(e)

    def _gather(self, p: Pending, url: str) -> None:
        chunker = self.chunkers.get(url)
        if chunker is None:
            chunker = self.chunkers[url] = Chunker(self.max_requests, self.max_bytes, self.linger_s)
        if chunker.oversized(p):
            self._record(not_run(p.tid, "batch_request_too_large", f"the request is larger than a batch file "
                                 f"may be ({self.max_bytes} bytes)"), p.key, p.attempts, {}, 0.0)
            return
        closed = chunker.add(p, time.monotonic())
        if closed:
            self._plan(closed, url)

    def tick(self) -> None:
        now = time.monotonic()
        busy = self.collecting > 0 or self.sending > 0  # results going out: the tasks they make room for follow
        for url, chunker in self.chunkers.items():
            if busy:
                chunker.hold(now)
            closed = chunker.due(now)
            if closed:
                self._plan(closed, url)

    # ----- a chunk's life -----

    def _plan(self, tasks: list[Pending], url: str) -> None:
        """Write the chunk's input file, record the intent (fsynced): only then does anything go out."""
        n = self.next_n
        self.next_n += 1
        data = b"\n".join(p.line for p in tasks) + b"\n"
        sha = hashlib.sha256(data).hexdigest()
        name = file_name(self.journal.run_id, n, sha)
        self.journal.write_file(name, data)
        keys = [[p.key, p.tid, p.attempts] for p in tasks]
        t = time.time()
        self.journal.append({"event": "intent", "chunk": n, "sha256": sha, "file": name, "endpoint": url,
                             "count": len(tasks), "bytes": len(data), "t": t, "keys": keys})
        c = ChunkInfo(n, Step.PLANNED, sha, name, keys, url, t)
        self.chunks[n] = c
        for p in tasks:
            self.key_chunk[p.key] = n
            h = self.held.get(p.key)
            if h is not None:
                h.chunk, h.attempts = n, p.attempts
        self._spawn(self.drive(c, adopting=False))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.create_task(coro)
        self.live.add(t)
        t.add_done_callback(self._finished)

    def _finished(self, t: asyncio.Task[None]) -> None:
        self.live.discard(t)
        if t.cancelled():
            return
        e = t.exception()
        if isinstance(e, Stop):
            self.fatal(str(e), e.code)
        elif e is not None:
            self.fatal(f"batch driver: {type(e).__name__}: {e}; {RESUME}", ex.RESUMABLE)

    def fatal(self, message: str, code: int) -> None:
        self.out.send(encode_json(FrameKind.FATAL, {"message": self.scrub.text(message), "code": code}))
        self.out.flush()
        self.stopped.set()

    async def drive(self, c: ChunkInfo, adopting: bool) -> None:
        """One chunk from its intent to its records, each step recorded as it returns."""
        client = self.client
        assert client is not None
        n = c.chunk
        path = self.journal.files / c.file
        if c.step is Step.COLLECTED and not all((self.journal.files / x).is_file() for x in (c.output, c.errors)
                                                if x):
            c.step = Step.CREATED  # a download the crash took with it: fetch it again
        while True:
            if c.step is Step.PLANNED and self.anthropic:
                c.step = Step.UPLOADED  # no upload: the create call carries the requests (the journal skips it)
            elif c.step is Step.PLANNED:
                if self.cancel:
                    return
                data = path.read_bytes()
                _crash_at("before_upload")
                f = await self._find_upload(c, len(data)) if adopting else None
                if f is None:
                    f = await call(f"the upload of chunk {n}", partial(client.upload, c.file, data))
                _crash_at("after_upload")
                c.file_id, c.step = str(f["id"]), Step.UPLOADED
                self.journal.append({"event": "uploaded", "chunk": n, "file_id": c.file_id})
            elif c.step is Step.UPLOADED and self.anthropic:
                async with self.adopting:  # creates one at a time, each recorded before the next (adoption)
                    b = await self._find_message_batch(c) if adopting else None
                    self.unadopted.discard(n)
                    if b is None:
                        if self.cancel:
                            return
                        b = await self._create_message_batch(c, path.read_bytes())
                    _crash_at("after_create")
                    c.batch_id, c.step = str(b["id"]), Step.CREATED
                    self.journal.append({"event": "created", "chunk": n, "batch_id": c.batch_id})
                self._note_state(c, b)
            elif c.step is Step.UPLOADED:
                b = None
                if adopting:  # a batch whose record a crash took: its metadata names the run and the chunk
                    b = await self._find_batch(c)
                if b is None:
                    if self.cancel:
                        return
                    fid = c.file_id
                    assert fid is not None
                    # a create whose answer was lost may have made the batch: looked for before trying again
                    b = await call(f"creating the batch of chunk {n}", partial(
                        client.create, fid, c.endpoint, self.window, batch_metadata(self.journal.run_id, n)),
                        again=partial(self._find_batch, c))
                _crash_at("after_create")
                c.batch_id, c.step = str(b["id"]), Step.CREATED
                self.journal.append({"event": "created", "chunk": n, "batch_id": c.batch_id, "file_id": c.file_id})
                self._note_state(c, b)
            elif c.step is Step.CREATED:
                await self._poll(c)  # to COLLECTED, or back to UPLOADED (the provider's queue was full)
                adopting = False
            elif c.step is Step.COLLECTED:
                self.collecting += 1
                try:
                    await self._collect(c)
                finally:
                    self.collecting -= 1
                return
            else:
                return

    async def _find_upload(self, c: ChunkInfo, size: int) -> dict[str, Any] | None:
        """The upload of chunk ``c`` that a crash took the record of (the provider has it under the chunk's
        file name), or None: then it is uploaded (again). A provider or gateway that does not list files (405,
        say) costs one more upload, never the run: an upload is free, and only a create is adopted."""
        client = self.client
        assert client is not None
        try:
            files = await call("listing files", client.files, listing=True)
        except Unlisted as e:
            self.journal.append({"event": "reupload", "chunk": c.chunk, "reason": f"GET /files: {e}"})
            print(f"evalsup batch: chunk {c.chunk}: the provider does not list files ({e}); uploading its input "
                  "again (an upload costs nothing; its batch is created once)", file=sys.stderr, flush=True)
            return None
        return adopt_file(files, c.file, size)

    def _unlisted_batches(self, c: ChunkInfo, e: Unlisted) -> Stop:
        """The provider does not list batches: whether chunk ``c``'s create took effect cannot be told, and
        creating it again could pay twice."""
        return Stop(f"chunk {c.chunk}: the provider does not list batches ({e}), so whether its batch was created "
                    "before the interruption cannot be told, and creating it again could pay twice; rerun once "
                    "the batch listing answers (a --base-url straight to the provider, not a gateway without it): "
                    "the batch is then found by its metadata", ex.RESUMABLE)

    async def _listed(self, c: ChunkInfo, since: Callable[[dict[str, Any]], int | None]) -> list[dict[str, Any]]:
        """The account's batches, newest first, down to those older than chunk ``c``'s intent (``since(b)``:
        a batch's creation time)."""
        client = self.aclient or self.client
        assert client is not None
        seen: list[dict[str, Any]] = []

        async def listing() -> None:
            seen.clear()
            async for b in client.batches():
                seen.append(b)
                if (since(b) or 0) < c.planned_at - 600:  # older than the chunk: stop reading
                    return

        try:
            await call("listing batches", listing, listing=True)
        except Unlisted as e:
            raise self._unlisted_batches(c, e) from None
        return seen

    async def _find_batch(self, c: ChunkInfo) -> dict[str, Any] | None:
        """The batch of chunk ``c`` created before a crash (or a lost answer) took the record of it: its
        metadata names the run and the chunk."""
        seen = await self._listed(c, lambda b: int(b.get("created_at") or 0))
        return adopt_batch(seen, self.journal.run_id, c.chunk)

    async def _create_message_batch(self, c: ChunkInfo, data: bytes) -> dict[str, Any]:
        """The chunk's Message Batch created; a create that failed transiently (no answer, 429, 5xx) is tried
        again with backoff, but first the account's batches are searched for it: the provider may have made
        it before the answer was lost (a retry must not pay twice)."""
        client = self.aclient
        assert client is not None

        async def create() -> dict[str, Any]:
            return as_batch(await client.create(data))

        return await call(f"creating the batch of chunk {c.chunk}", create,
                          again=partial(self._find_message_batch, c))

    async def _find_message_batch(self, c: ChunkInfo) -> dict[str, Any] | None:
        """The Message Batch that is this chunk's, created before a crash took the record of it (it has no
        metadata: ``anthropic_shapes.candidates``): an ended candidate is the chunk's when its first result's
        custom_id is one of the chunk's; a running one as ``choose_running`` says (else the run stops
        resumably, and a rerun reads their results once they end: never a second batch on a guess). None: the
        create never reached the provider (or made no batch of this size)."""
        client = self.aclient
        assert client is not None
        seen = await self._listed(c, lambda b: as_batch(b)["created_at"])
        claimed = {x.batch_id for x in self.chunks.values() if x.batch_id}
        ids = {self._cid(str(tid)) for _k, tid, _a in c.keys}
        running = []
        for raw in candidates(seen, len(c.keys), c.planned_at, claimed):
            b = as_batch(raw)
            url = b["output_file_id"]
            if url is None:
                running.append(b)
                continue
            first = await call(f"reading the results of {b['id']}", partial(client.first_result, str(url)))
            if first is not None and str(first.get("custom_id")) in ids:
                return b
        earlier = [n for n in self.unadopted if n < c.chunk and len(self.chunks[n].keys) == len(c.keys)]
        try:
            return choose_running(running, len(earlier))
        except Ambiguous as e:
            raise Stop(f"chunk {c.chunk}: the running Message Batch(es) {e} may be the one created for it before "
                       "the crash, or another's (a Message Batch has no metadata to tell); rerun once they have "
                       "ended: their results tell (nothing is created on a guess)", ex.RESUMABLE) from None

    def _note_state(self, c: ChunkInfo, b: dict[str, Any]) -> bool:
        """Record the provider's state when it changed (status shows it); True when it did."""
        counts = b.get("request_counts") or {}
        if b.get("status") == c.status and counts == c.counts:
            return False
        c.status, c.counts = str(b.get("status")), dict(counts)
        c.created_at, c.expires_at = b.get("created_at"), b.get("expires_at")
        self.journal.append({"event": "state", "chunk": c.chunk, "batch_id": c.batch_id, "status": c.status,
                             "counts": c.counts, "created_at": c.created_at, "expires_at": c.expires_at})
        return True

    async def _poll(self, c: ChunkInfo) -> None:
        client = self.client
        assert client is not None and c.batch_id is not None
        bid = c.batch_id
        backoff = PollBackoff(*self.poll)
        cancel_sent = False
        while True:
            if self.cancel and not cancel_sent and c.status not in ("completed", "expired", "cancelled", "failed"):
                with contextlib.suppress(ProviderError):
                    if self.aclient is not None:
                        await self.aclient.cancel(bid)
                    else:
                        await client.cancel(bid)
                cancel_sent = True
            b = await call(f"retrieving batch {bid} (chunk {c.chunk})", self._retrieve(bid),
                           waits=lambda: backoff.next(False))
            changed = self._note_state(c, b)
            errs = (b.get("errors") or {}).get("data") or []
            first = errs[0] if errs and isinstance(errs[0], dict) else {}
            act = on_status(str(b.get("status")), first.get("code"))
            if act is Act.RECREATE:  # the account's queue is full: the same file, a new batch, later
                wait = self.poll[1]
                print(f"evalsup batch: batch {bid} (chunk {c.chunk}) refused for the provider's queue "
                      f"({first.get('code')}); creating it again in {wait:g}s", file=sys.stderr, flush=True)
                c.step = Step.UPLOADED
                self.journal.append({"event": "uploaded", "chunk": c.chunk, "file_id": c.file_id})
                await asyncio.sleep(wait)
                return
            if act is Act.STOP:
                line = f" (line {first['line']})" if first.get("line") else ""
                reason = f"{first.get('code') or 'failed'}: {first.get('message') or 'no reason given'}{line}"
                c.step, c.reason = Step.FAILED, reason
                self.journal.append({"event": "failed", "chunk": c.chunk, "reason": reason})
                for k, _tid, _a in c.keys:  # a rerun sends its tasks in a new chunk
                    if self.key_chunk.get(int(k)) == c.chunk:
                        del self.key_chunk[int(k)]
                raise Stop(f"batch {bid} (chunk {c.chunk}) failed validation: {reason}; its requests are in "
                           f"{self.journal.files / c.file} (a line number is that file's): fix what it names in the "
                           "tasks or the settings, then rerun: its tasks go in a new batch (one that failed "
                           "validation was not charged)", ex.BAD_INPUT)
            if act is Act.COLLECT:
                await self._download(c, b)
                return
            await asyncio.sleep(backoff.next(changed))

    def _retrieve(self, bid: str) -> Callable[[], Awaitable[dict[str, Any]]]:
        """The call that reads batch ``bid``'s state, in OpenAI's shape whichever the provider."""
        aclient, client = self.aclient, self.client

        async def retrieve() -> dict[str, Any]:
            if aclient is not None:
                return as_batch(await aclient.retrieve(bid))
            assert client is not None
            return await client.retrieve(bid)

        return retrieve

    async def _download(self, c: ChunkInfo, b: dict[str, Any]) -> None:
        client = self.client
        assert client is not None
        names: dict[str, str | None] = {"output": None, "errors": None}
        for kind, fid in (("output", b.get("output_file_id")), ("errors", b.get("error_file_id"))):
            if not fid:
                continue
            name = f"chunk{c.chunk:05d}.{kind}.jsonl"
            part = self.journal.files / (name + ".partial")
            if self.aclient is not None:
                aclient = self.aclient
                await call(f"downloading the results of {b.get('id')}", partial(aclient.download, str(fid), part))
            else:
                await call(f"downloading {fid}", partial(client.download, str(fid), part))
            _crash_at("while_downloading")
            with open(part, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(part, self.journal.files / name)
            fsync_dir(self.journal.files)
            names[kind] = name
        c.output, c.errors, c.step = names["output"], names["errors"], Step.COLLECTED
        self.journal.append({"event": "collected", "chunk": c.chunk, **names})

    async def _collect(self, c: ChunkInfo) -> None:
        """Every line of the chunk's files to its task, streamed: a record, a follow-up chunk or an online
        request. An answer whose task is not handed over (a resume) is remembered by where it is in its file."""
        n = c.chunk
        ids = {self._cid(str(tid)): int(k) for k, tid, _a in c.keys}  # custom_id -> key
        tids = {self._cid(str(tid)): str(tid) for _k, tid, _a in c.keys}
        seen: set[str] = set()
        waiting = self.pending.setdefault(n, {})
        half = len(ids) // 2 or -1

        async def one(k: int, a: Answer | tuple[str, int]) -> None:
            if len(seen) == half:
                self.out.flush()
                if os.environ.get(CRASH_ENV) == "mid_collect":
                    await asyncio.sleep(0.5)  # let the supervisor write what went out
                    _crash_at("mid_collect")
            if self.key_chunk.get(k) != n:
                return  # moved on to a later chunk already (a resume)
            h = self.held.get(k)
            if h is not None and h.chunk == n:
                await self._answer(n, k, a if isinstance(a, Answer) else self._reread(*a))
            else:
                waiting[k] = a  # its task comes (a resume), or is already recorded
            if self.out.must_drain():
                await self.out.drain()
            elif len(seen) % 512 == 0:
                await asyncio.sleep(0)  # heartbeats and frames go on while a large file is read

        for name in (c.output, c.errors):
            if name is None:
                continue
            with open(self.journal.files / name, "rb") as f:
                pos = 0
                for raw in f:
                    at, pos = pos, pos + len(raw)
                    if not raw.strip():
                        continue
                    a = self._parse(orjson.loads(raw))
                    k = ids.get(a.tid)
                    if k is None or a.tid in seen:
                        continue  # not a request of this chunk, or said twice: the first answer counts
                    seen.add(a.tid)
                    h = self.held.get(k)
                    await one(k, a if h is not None and h.chunk == n else (name, at))
        for cid, k in ids.items():  # in neither file: the provider never ran it
            if cid not in seen:
                seen.add(cid)
                await one(k, not_run(tids[cid], "batch_missing", "the provider's files have no line for it"))
        self.out.flush()

    def _reread(self, name: str, at: int) -> Answer:
        with open(self.journal.files / name, "rb") as f:
            f.seek(at)
            return self._parse(orjson.loads(f.readline()))

    async def _answer(self, n: int, k: int, a: Answer) -> None:
        h = self.held.get(k)
        if h is None:
            return
        if a.tid != h.tid:  # a custom_id that is not the task's id (Anthropic's): the record names the task
            a = dataclasses.replace(a, tid=h.tid)
        attempts = h.attempts + 1
        c = self.chunks[n]
        verdict = on_line(a.status, a.code, attempts, self.cfg.max_attempts, self.fallback)
        if self.cancel and verdict is not Verdict.RECORD:  # `evalsup cancel`: left outstanding for a rerun
            h.chunk = None
            self.key_chunk.pop(k, None)
            return
        if verdict is Verdict.RETRY:
            line = self._request_line(c, a.tid)
            if line is not None:
                h.chunk, h.attempts = None, attempts
                del self.key_chunk[k]
                self._gather(Pending(k, a.tid, line, attempts), c.endpoint)
                return
        batch: dict[str, Any] = {"id": c.batch_id, "chunk": n}
        if verdict is Verdict.ONLINE:
            line = self._request_line(c, a.tid)
            if line is not None:  # one more attempt, online; the record keeps the batch that did not answer
                a = await self._online(orjson.loads(line), a)
                attempts += 1
                batch["fallback"] = "online"
        self._record(a, k, attempts, batch, time.time() - c.planned_at)

    def _request_line(self, c: ChunkInfo, tid: str) -> bytes | None:
        """The request of ``tid`` as the chunk's input file holds it (for a follow-up or an online attempt):
        found through an index of where each request is (kept for the chunk's life in this process)."""
        tid = self._cid(tid)
        index = self._where.get(c.chunk)
        path = self.journal.files / c.file
        if index is None:
            index = self._where[c.chunk] = {}
            with open(path, "rb") as f:
                pos = 0
                for raw in f:
                    if raw.strip():
                        index[str(orjson.loads(raw)["custom_id"])] = pos
                    pos += len(raw)
        at = index.get(tid)
        if at is None:
            return None
        with open(path, "rb") as f:
            f.seek(at)
            return f.readline().rstrip(b"\n")

    async def _online(self, req: dict[str, Any], before: Answer) -> Answer:
        """--batch-fallback online: the request sent once as an online request (its answer, or the batch's)."""
        assert self.session is not None
        from evalsup.tasks.requests import join_url

        url, body_out = (MESSAGES_PATH, req["params"]) if self.anthropic else (req["url"], req["body"])
        headers = {**self.headers, "Content-Type": "application/json"}
        try:
            async with self.session.post(join_url(self.base, url), data=orjson.dumps(body_out),
                                         headers=headers) as r:
                raw = await r.read()
                body = orjson.loads(raw)
                err = body.get("error") if isinstance(body, dict) and r.status != 200 else None
                code = (err.get("type") if self.anthropic else err.get("code")) if isinstance(err, dict) else None
                return Answer(before.tid, r.status, body, r.headers.get("x-request-id") or r.headers.get("request-id"),
                              None, code, "")
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as e:
            return Answer(before.tid, None, None, None, before.line_id, "online_failed", f"{type(e).__name__}: {e}")

    def _record(self, a: Answer, k: int, attempts: int, batch: dict[str, Any], waited_s: float) -> None:
        h = self.held.pop(k, None)
        if h is None:
            return
        a = checked(a, h)
        if self.scoring is None:  # at once: nothing to wait for
            self._emit(a, k, attempts, batch, waited_s, h, None)
        else:
            self._spawn(self._scored(a, k, attempts, batch, waited_s, h))

    async def _scored(self, a: Answer, k: int, attempts: int, batch: dict[str, Any], waited_s: float,
                      h: Held) -> None:
        assert self.scoring is not None
        self.sending += 1
        try:
            scored = await self.scoring.score({"id": h.tid, **h.metadata}, a.body) if a.error is None else None
            self._emit(a, k, attempts, batch, waited_s, h, scored)
        finally:
            self.sending -= 1
        if not self.sending:
            self.out.flush()

    def _emit(self, a: Answer, k: int, attempts: int, batch: dict[str, Any], waited_s: float, h: Held,
              scored: Any) -> None:
        out_line, info = build(a, k, attempts, self.pid, self.endpoint_info, batch, h.metadata, scored, waited_s,
                               self.scrub, model=h.model, own_model=h.own_model)
        if self.group_path is not None:  # the supervisor's groups come from the meta, as a worker's (records.build)
            info["g"] = group_of(h.metadata, self.group_path)
        self.done += 1
        self.outbox.result(out_line, info, 256, True)

    # ----- done marks -----

    def settle(self) -> None:
        """Mark done each collected chunk whose tasks are all settled in the latest checkpoint: before its
        frontier and not outstanding, which means their records are in results.jsonl (design notes, "Exactly-once
        resume"). A resume need not look at a done chunk again. Read once a checkpoint is new."""
        if not any(c.step is Step.COLLECTED for c in self.chunks.values()):
            return
        try:
            mtime = (self.run_dir / CHECKPOINT).stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self._cp_seen:
            return
        self._cp_seen = mtime
        cp = load_checkpoint(self.run_dir)
        if cp is None or cp.reconcile:  # a rewritten results file: its O is worked out when the run opens
            return
        outstanding = {t.offset for t in cp.outstanding}
        for n, c in list(self.chunks.items()):
            if c.step is not Step.COLLECTED:
                continue
            mine = [int(k) for k, _t, _a in c.keys if self.key_chunk.get(int(k)) == n]
            if any(k >= cp.frontier or k in outstanding for k in mine):
                continue
            c.step = Step.DONE
            self.journal.append({"event": "done", "chunk": n})
            self.pending.pop(n, None)
            self._where.pop(n, None)
            for k in mine:
                self.key_chunk.pop(k, None)

    # ----- the process -----

    def on_frame(self, kind: FrameKind, payload: memoryview) -> None:
        if kind is FrameKind.TASK:
            meta, line = split_meta(payload)
            self.on_task(meta, line)
        elif kind is FrameKind.RELEASE:
            self.outbox.release(POS.unpack(payload)[0])
        elif kind is FrameKind.DRAIN:  # SIGTERM or a recycle: the batches run on at the provider; a rerun
            keys = list(self.held)  # (or the replacement) adopts them
            self.held.clear()
            for chunker in self.chunkers.values():
                chunker.take()
            if keys:
                self.outbox.returned(keys)
            self.draining = True
            self.stopped.set()

    async def read_loop(self) -> None:
        frames: list[tuple[FrameKind, memoryview]] = []
        parser = FrameParser(lambda kind, payload: frames.append((kind, payload)))
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                return
            parser.feed(data)
            for kind, payload in frames:
                self.on_frame(kind, payload)
            frames.clear()

    async def heartbeat(self) -> None:
        while True:
            self.out.send(encode_json(FrameKind.HEARTBEAT, {
                "inflight": len(self.held), "queued": 0, "done": self.done, "t": time.time(), "parked": 0,
                "retries": 0, "wire": 0, "limit": 0, "eps": None}))
            await self.out.drain()
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def ticker(self) -> None:
        last_settle = 0.0
        while True:
            await asyncio.sleep(0.05)
            self.tick()
            now = time.monotonic()
            if now - last_settle >= 0.5:
                last_settle = now
                self.settle()
            if (self.cancel and not self.live and now - self.last_task >= 1.0
                    and not any(c.step is Step.CREATED for c in self.chunks.values())):
                left = len(self.held)
                self.fatal(f"cancelled: the run's batches are cancelled and what they finished is recorded; "
                           f"{left} task(s) left: rerun the run (evalsup run, same command) to send them", ex.RESUMABLE)
                return

    async def run(self) -> None:
        cfg = self.cfg
        timeout = aiohttp.ClientTimeout(total=cfg.total_timeout_s, sock_connect=cfg.connect_timeout_s,
                                        sock_read=cfg.read_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout,
                                         connector=aiohttp.TCPConnector(ssl=not cfg.insecure)) as session:
            self.session = session
            self.client = BatchClient(session, self.base, self.headers)
            if self.anthropic:
                self.aclient = AnthropicClient(session, self.base, self.headers)
            self.settle()  # a resume: collected chunks whose records are all in (a finished run's, say) are done
            for c in open_chunks(self.chunks):  # the journal's other chunks, adopted before anything new
                if self.anthropic and c.step in (Step.PLANNED, Step.UPLOADED):
                    self.unadopted.add(c.chunk)
                self._spawn(self.drive(c, adopting=True))
            loops = [asyncio.create_task(x) for x in (self.heartbeat(), self.ticker())]
            reading = asyncio.create_task(self.read_loop())
            stopped = asyncio.create_task(self.stopped.wait())
            await asyncio.wait([reading, stopped], return_when=asyncio.FIRST_COMPLETED)
            if self.draining:
                self.out.send(encode_json(FrameKind.BYE, {"done": self.done}))
            for t in [*loops, *self.live, reading, stopped]:
                t.cancel()
            await asyncio.gather(*loops, *self.live, reading, stopped, return_exceptions=True)
            await self.out.finish()


async def amain() -> int:
    reader, out = await open_pipes(FLUSH_DELAY_S)
    payload = await read_config(reader, "evalsup batch")
    if isinstance(payload, int):
        return payload
    try:
        cfg = WorkerConfig.from_wire(decode_json(payload))
        if cfg.batch is None:
            raise ValueError("a batch driver needs the batch settings")
        journal = await asyncio.to_thread(Journal, Path(cfg.batch["run_dir"]))  # waits for a predecessor
        driver = Driver(cfg, reader, out, journal)
    except Exception as e:
        return await fatal_start(out, e)
    quiet_gc()
    out.send(encode_json(FrameKind.READY, {"pid": driver.pid, "concurrency": 1}))
    try:
        await driver.run()
    finally:
        journal.close()
    return 0


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor's to handle, as a worker's
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        code = asyncio.run(amain())
    except BrokenPipeError:
        code = 0
    sys.stdout.flush()
    os._exit(code)
