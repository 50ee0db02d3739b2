"""A worker process: uvloop, one aiohttp session, one coroutine per request begun (up to its limit).

It reads CONFIG then TASK/PAUSE/RESUME/LIMIT/DRAIN frames on stdin, and writes READY, RESULT, HEARTBEAT
and BYE frames on stdout (the original stdout is kept for frames; fd 1 is pointed at stderr so a stray
print cannot corrupt the pipe). At EOF on stdin (the supervisor is gone or done) it exits at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import signal
import sys
import time
from typing import Any

import aiohttp
import orjson

from evalsup.common.process import quiet_gc
from evalsup.ipc import FrameKind, FrameWriter, decode_json, encode_json, read_frame, split_meta
from evalsup.ipc.frames import KEY, FrameParser, encode_frame, encode_meta, encode_meta_head
from evalsup.ipc.messages import WorkerConfig
from evalsup.ipc.ring import POS, RING_MIN, WorkerRing
from evalsup.scoring.plugin import load_callable
from evalsup.scoring.scorers import ScorerOptions
from evalsup.tasks.headers import api_key, build_headers, secret_values
from evalsup.tasks.records import output_line, output_line_around
from evalsup.tasks.requests import RequestDefaults, to_request
from evalsup.worker.adaptive import adaptive_from_config
from evalsup.worker.adaptive_hook import watch
from evalsup.worker.bodies import UsageOnly
from evalsup.worker.breaker import HandedBack
from evalsup.worker.client import Client, Outcome
from evalsup.worker.endpoint_pacing import apply_rate
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.pacing import Pacer
from evalsup.worker.pipes import open_pipes
from evalsup.worker.retry import RetryPolicy
from evalsup.worker.scoring import Scoring

# Frames wait up to this long to share a write with the ones that follow: at hundreds of results a second,
# many results and STARTED notes go out in one system call and wake the supervisor once (each write costs a
# round of wake-ups on both sides: the supervisor's read, its refill of tasks, the worker's read of those).
# 5 ms cost 3-7 % more CPU than 20 ms at 4 KB (10,000 tasks, A/B); 100 ms saved ~6 % against 20 ms.
FLUSH_DELAY_S = 0.1
# ...but results do not wait for the timer once there are enough of them for the supervisor's next refill
# (its credit window is twice the worker's share of the concurrency, refilled an eighth at a time), nor when
# no task is left queued here: the queue covers one endpoint latency of work, and a fast endpoint must not
# starve on it.
FLUSH_RESULTS_SHARE = 2  # a write at once when (requests allowed in flight) / this many results wait
BIG_BODY = 1 << 14  # a response body this large is written around, not copied into its output line


class Worker:
    def __init__(self, cfg: WorkerConfig, reader: asyncio.StreamReader, out: FrameWriter) -> None:
        self.cfg = cfg
        self.reader = reader
        self.out = out
        self.concurrency = cfg.concurrency
        self.limit = max(1, min(self.concurrency, cfg.limit or self.concurrency))
        self.queue: collections.deque[tuple[Any, bytes | memoryview]] = collections.deque()
        # one per --base-url, each with its breaker evidence and adaptive limit (None with --concurrency)
        self.endpoints = EndpointPool(cfg.endpoints, lambda: adaptive_from_config(cfg, len(cfg.endpoints)))
        self.extra_headers = build_headers(cfg.headers)  # --header, User-Agent (a bad one: FATAL, not a crash)
        self.inflight = 0  # requests begun and not answered
        self.slots = 0  # tasks begun whose RESULT frame is not yet on its way
        self._live: set[asyncio.Task[None]] = set()
        self.paused = False
        self.draining = False
        self.done = 0
        self.finished = asyncio.Event()
        self.defaults = RequestDefaults(cfg.model, cfg.max_tokens, cfg.temperature, cfg.stream)
        self.plugin = load_callable(cfg.plugin) if cfg.plugin else None
        self.scoring: Scoring | None = None
        if cfg.scorers:
            opts = ScorerOptions(cfg.score_strip, cfg.score_ignore_case, cfg.score_pattern)
            self.scoring = Scoring(list(cfg.scorers), opts, cfg.scorer_timeout_s, cfg.scorer_threads)
        self.pid = os.getpid()
        self.pacer = Pacer(random.Random(self.pid))
        self.client: Client | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self._started: list[int] = []  # keys of tasks begun since the last write
        self._unsent = 0  # results queued for the pipe since the last write
        out.gather = self._gather_started
        self.ring: WorkerRing | None = None  # large results go here, not through the pipe (ipc.ring)
        if cfg.ring_fd is not None:
            try:
                self.ring = WorkerRing(cfg.ring_fd, cfg.ring_size)
            except (OSError, ValueError):
                self.ring = None  # every result through the pipe: slower, never wrong

    def _limit(self) -> int:
        """Requests this worker may have in flight now: its adaptive limit under the supervisor's cap."""
        return self.endpoints.limit(self.limit)  # the endpoints' limits together (worker.endpoints)

    def _active(self) -> int:
        """Requests begun and not answered; with an adaptive limit, less those resting in a retry's back-off."""
        return self.inflight - (self.client.resting if self.client is not None and self.cfg.adaptive else 0)

    def _can_start(self) -> bool:
        return (bool(self.queue) and not self.paused and self.endpoints.any_up() and self._active() < self._limit()
                and self.slots < self.concurrency)

    def _pump(self) -> None:
        """Start every request that may start now: one task each, begun here rather than by a pool of waiting
        coroutines (a pool on one condition woke all of its idle members for each event)."""
        started = False
        while self._can_start():
            meta, line = self.queue.popleft()
            meta["q"] = time.monotonic() - meta.get("q", 0.0)  # the time it waited here for a slot (queue_s)
            self.inflight += 1
            self.slots += 1
            self._started.append(meta["k"])  # goes out with the next write, in one STARTED frame for all
            t = asyncio.create_task(self._one(meta, line))
            self._live.add(t)
            t.add_done_callback(self._live.discard)
            started = True
        if started:
            self.out.arm()

    async def _one(self, meta: Any, line: bytes | memoryview) -> None:
        """One task from start to its RESULT frame; its slot is free once the frame is on its way (a full pipe
        holds slots, and so holds back new requests, up to --concurrency of them)."""
        try:
            try:
                out_line, info = await self.process(meta, line)
            except HandedBack:  # parked for an outage when told to drain: back to the supervisor, unanswered
                self.out.send(encode_json(FrameKind.RETURNED, {"keys": [meta["k"]]}))
                return
            except Exception as e:
                # A bug (or a plugin's exception) must not leave the task unanswered, which would hold the run
                # forever: the worker dies, and the supervisor hands the task on, then records it as failed
                # after --max-task-crashes. Only the type goes out: a message may quote anything.
                print(f"evalsup worker {self.pid}: line {meta.get('n')}: {type(e).__name__}; exiting",
                      file=sys.stderr, flush=True)
                os._exit(70)
            finally:
                self.inflight -= 1
            self.done += 1
            n = sum(map(len, out_line))
            pos = self.ring.put(out_line) if self.ring is not None and n >= RING_MIN else None
            if pos is not None:  # the supervisor's journal writes it from the ring: only where it is goes by pipe
                info["sh"] = [pos, n]
                self.out.send(encode_meta(FrameKind.RESULT, info, b""), weight=n)
            else:
                self.out.send_parts(encode_meta_head(FrameKind.RESULT, info, n), *out_line)
            self._unsent += 1
            # against the limit, not the concurrency: the supervisor's window for this worker follows its share
            if self._unsent * FLUSH_RESULTS_SHARE >= self.limit or not self.queue:
                self.out.flush()  # the supervisor's next refill (or this worker's next task) waits on these
            self._pump()
            if self.out.must_drain():
                await self.out.drain()  # at once, unless the pipe is full
        finally:
            self.slots -= 1
            self._pump()
            self._check_drained()

    def _gather_started(self) -> bytes | None:
        self._unsent = 0  # called as each write goes out
        if not self._started:
            return None
        keys, self._started = self._started, []
        return encode_frame(FrameKind.STARTED, b"".join(map(KEY.pack, keys)))

    def _before_user_code(self, key: int) -> None:
        """User code (a plugin, a scorer) may kill the process: the supervisor must know the task was begun,
        so that the crash is blamed on it. Its STARTED note goes out now if it is still being gathered."""
        if key in self._started:
            self.out.flush()

    async def process(self, meta: Any, line: bytes | memoryview) -> tuple[list[bytes], dict[str, Any]]:
        """One task: its output line (as parts to write one after the other) and the RESULT meta."""
        client = self.client
        assert client is not None, "tasks are read only once the client exists"
        obj = orjson.loads(line)
        tid = str(obj.get("custom_id", obj.get("id")))
        url, body, metadata = to_request(obj, self.defaults)
        try:
            oc = await client.execute(url, body, meta["k"])
        except Exception as e:  # a bug must cost one record, never the worker
            oc = Outcome(None, None, 0, None, {"code": "internal_error", "message": f"{type(e).__name__}: {e}"},
                         1, 0.0)
        if self.plugin is not None:
            self._before_user_code(meta["k"])
            self.plugin(obj, oc)
        # latency_s is the server's (the last attempt, request written to last byte); queue_s the time it waited
        # here (a slot under the limit, the pacer); total_s from the first attempt's start to the end
        metrics: dict[str, Any] = {"latency_s": round(oc.server_s, 6), "queue_s": round(meta.get("q", 0.0)
                                   + oc.queue_s, 6), "total_s": round(oc.latency_s, 6), "attempts": oc.attempts,
                                   "worker": self.pid, "endpoint": self._endpoint_of(oc)}
        if oc.ttft_s is not None:
            metrics["ttft_s"] = round(oc.ttft_s, 6)
        if oc.itl_s is not None:
            metrics["itl_s"] = round(oc.itl_s, 6)
        scores: dict[str, float | None] | None = None
        score_errors: dict[str, str] | None = None
        if self.scoring is not None and oc.error is None:
            self._before_user_code(meta["k"])
            scores, score_errors = await self.scoring.score({"id": tid, **metadata}, oc.parsed)
        fields: dict[str, Any] = {"status": oc.status, "request_id": oc.request_id, "error": oc.error,
                                  "metrics": metrics, "metadata": metadata or None, "scores": scores,
                                  "score_errors": score_errors}
        if oc.raw_json is not None and len(oc.raw_json) >= BIG_BODY:  # raw_json: the body is the endpoint's bytes
            # the endpoint's own bytes go out between the record's head and tail: never copied into a line
            head, tail = output_line_around(tid, **fields)
            out = [head, oc.raw_json, tail]
        else:
            out = [output_line(tid, body=oc.body, **fields)]
        usage = oc.parsed.get("usage") if isinstance(oc.parsed, dict) else None
        info = {"k": meta["k"], "ok": oc.error is None, "lat": oc.server_s, "att": oc.attempts, "rb": oc.raw_len,
                "ec": oc.error["code"] if oc.error else None, "ttft": oc.ttft_s, "rt": oc.sent - 1,
                "pt": usage.get("prompt_tokens", 0) if isinstance(usage, dict) else 0,
                "ct": usage.get("completion_tokens", 0) if isinstance(usage, dict) else 0, "sc": scores,
                "ep": oc.endpoint}
        if isinstance(oc.parsed, UsageOnly):
            info["chk"] = 1  # checked by simdjson, not built (counted in the summary)
        return out, info

    def _endpoint_of(self, oc: Outcome) -> dict[str, Any]:
        """Which endpoint served a record (its last attempt): index and URL without credentials (issue 21)."""
        return {"index": oc.endpoint, "url": self.endpoints.all[oc.endpoint].public}

    def send_leak_report(self) -> None:
        import tracemalloc

        if not tracemalloc.is_tracing():
            return
        snap = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
        stats = snap.statistics("lineno")[:25]
        lines = [f"top allocation sites of worker {self.pid} (tracemalloc, by line), {self.done} tasks done"]
        for s in stats:
            frame = s.traceback[0]
            lines.append(f"{frame.filename}:{frame.lineno}  size={s.size / 1024:,.1f} KiB  count={s.count}")
        self.out.send(encode_json(FrameKind.LEAKS, {"text": "\n".join(lines) + "\n"}))

    def _on_trip(self, e: int, reason: str) -> None:
        self.out.send(encode_json(FrameKind.TRIP, {"reason": reason, "e": e}))

    def _on_auth(self, e: int, message: str) -> None:
        self.out.send(encode_json(FrameKind.AUTH, {"message": message, "e": e}))
        self.out.flush()

    def _on_probe(self, e: int, ok: bool, detail: str) -> None:
        self.out.send(encode_json(FrameKind.PROBE_RESULT, {"ok": ok, "detail": detail, "e": e}))

    def _check_drained(self) -> None:
        if self.draining and not self.queue and self.inflight == 0:
            self.finished.set()

    async def heartbeat(self) -> None:
        interval = self.cfg.heartbeat_s
        while True:
            c = self.client
            self.out.send(encode_json(FrameKind.HEARTBEAT, {
                "inflight": self.inflight, "queued": len(self.queue), "done": self.done, "t": time.time(),
                "parked": c.parked if c else 0, "retries": c.retries if c else 0,
                "wire": c.on_wire if c else 0,  # requests on the wire (status/progress "in flight")
                "limit": self._limit(), "eps": self.endpoints.load(self.limit)}))  # adaptive limits (issue 21)
            await self.out.drain()
            await asyncio.sleep(interval)

    async def read_loop(self) -> None:
        frames: list[tuple[FrameKind, memoryview]] = []
        parser = FrameParser(lambda kind, payload: frames.append((kind, payload)))
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                return  # EOF: the supervisor is done with us or gone
            parser.feed(data)
            news = False  # anything that can let a request start (not just ring space freed)
            for kind, payload in frames:
                news = news or kind is not FrameKind.RELEASE
                await self.on_frame(kind, payload)
            frames.clear()
            if news:
                self._pump()

    async def on_frame(self, kind: FrameKind, payload: memoryview) -> None:
        if kind is FrameKind.TASK:
            meta, line = split_meta(payload)
            meta["q"] = time.monotonic()  # queue_s counts from here
            self.queue.append((meta, line))
        elif kind is FrameKind.RELEASE:
            if self.ring is not None:
                self.ring.release(POS.unpack(payload)[0])
        elif kind is FrameKind.PAUSE:
            self.paused = True
        elif kind is FrameKind.RESUME:
            self.paused = False
        elif kind is FrameKind.RATE:
            apply_rate(self.pacer, self.endpoints, decode_json(payload))  # global and per endpoint (issue 21)
        elif kind is FrameKind.BREAKER_OPEN or kind is FrameKind.BREAKER_CLOSE:  # one endpoint ejected / it rejoins
            b = decode_json(payload) if payload else {}  # ipc.messages.BreakerOpen, BreakerClose
            self.endpoints.set_open(int(b.get("e", 0)), kind is FrameKind.BREAKER_OPEN, bool(b.get("was_down")),
                                    out=bool(b.get("out")))
        elif kind is FrameKind.PROBE:
            if self.client is not None:
                t = asyncio.create_task(self.client.probe(int(decode_json(payload).get("e", 0)) if payload else 0))
                self._bg.add(t)
                t.add_done_callback(self._bg.discard)
        elif kind is FrameKind.LIMIT:
            self.limit = max(1, min(self.concurrency, int(decode_json(payload)["inflight"])))
        elif kind is FrameKind.DRAIN:
            if payload and decode_json(payload).get("report"):
                self.send_leak_report()
            # finish only what is in flight; hand the rest back (it may be paused, and it is going anyway), and
            # what is parked for an outage (it would hold the drain until the endpoint is back, or to --grace)
            keys = [meta["k"] for meta, _ in self.queue]
            self.queue.clear()
            if keys:
                self.out.send(encode_json(FrameKind.RETURNED, {"keys": keys}))
            self.endpoints.hand_back()
            self.draining = True
            self._check_drained()

    async def run(self) -> None:
        cfg = self.cfg
        timeout = aiohttp.ClientTimeout(total=cfg.total_timeout_s, sock_connect=cfg.connect_timeout_s,
                                        sock_read=cfg.read_timeout_s)
        connector = aiohttp.TCPConnector(limit=self.concurrency, ssl=not cfg.insecure)
        headers = {"Content-Type": "application/json", **self.extra_headers}  # --header, User-Agent
        key = api_key(cfg.api_key_env, cfg.api_key_file)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        policy = RetryPolicy(max_attempts=cfg.max_attempts, cap_s=cfg.max_retry_wait_s,
                             max_limited_s=cfg.max_rate_limited_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            client = Client(session, self.endpoints, headers, policy,
                            int(cfg.max_response_mb * (1 << 20)), seed=self.pid, cap=lambda: self.limit,
                            pacer=self.pacer, on_trip=self._on_trip,
                            on_probe=self._on_probe, secret=key, on_auth=self._on_auth,
                            whole_bodies=self.scoring is not None or self.plugin is not None)
            client.secrets += [v.encode() for v in secret_values(cfg.headers)]
            self.client, client.on_rest = client, self._pump
            tasks = [asyncio.create_task(self.heartbeat())]
            if cfg.adaptive:  # every attempt and the server's queue feed each endpoint's limit
                tasks.append(watch(self.endpoints, client, session, cfg, headers, self._active, lambda: self.limit))
            reading = asyncio.create_task(self.read_loop())
            drained = asyncio.create_task(self.finished.wait())
            await asyncio.wait([reading, drained], return_when=asyncio.FIRST_COMPLETED)
            if drained.done():
                self.out.send(encode_json(FrameKind.BYE, {"done": self.done}))
                await self.out.finish()
            tasks.extend(self._live)
            for t in [*tasks, reading, drained]:
                t.cancel()
            await asyncio.gather(*tasks, reading, drained, return_exceptions=True)


async def amain() -> int:
    reader, out = await open_pipes(FLUSH_DELAY_S)
    frame = await read_frame(reader)
    if frame is None:
        return 0
    kind, payload = frame
    if kind is not FrameKind.CONFIG:
        print(f"evalsup worker: expected CONFIG, got {kind.name}", file=sys.stderr)
        return 2
    try:
        cfg = WorkerConfig.from_wire(decode_json(payload))
        if cfg.trace_memory:
            import tracemalloc

            tracemalloc.start(10)
        worker = Worker(cfg, reader, out)
    except Exception as e:
        out.send(encode_json(FrameKind.FATAL, {"message": f"{type(e).__name__}: {e}"}))
        await out.finish()
        return 2
    quiet_gc()
    out.send(encode_json(FrameKind.READY, {"pid": worker.pid, "concurrency": worker.concurrency}))
    await worker.run()
    await out.finish()  # results gathered but not yet written are earned: they go out before the exit
    return 0


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    # so is SIGTERM (issue 19): scancel, docker stop or a pod's deletion signal the whole group, and the
    # supervisor drains its workers within --grace; it ends them by closing their input or by SIGKILL
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
