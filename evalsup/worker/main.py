"""A worker process: uvloop, one aiohttp session, one coroutine per request begun (up to its limit).

It reads CONFIG then TASK and control frames on stdin (``control``), and writes READY, RESULT, HEARTBEAT and BYE
frames on stdout (``pipes.Outbox``; the original stdout is kept for frames, fd 1 is pointed at stderr so a stray
print cannot corrupt the pipe). At EOF on stdin (the supervisor is gone or done) it exits at once; a supervisor
killed is seen sooner, at the next task it would start (its parent's pid changed), and none starts after it.

This file wires the process and the session and runs the loops: a task's way from its start (``schedule``)
through its attempts (``client``) and its record (``records``) to its RESULT frame (``pipes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from evalsup.cache.key import key_headers, schema_in_key
from evalsup.cache.lookup import CacheReader, Hit
from evalsup.common.process import quiet_gc
from evalsup.ipc import FrameKind, FrameWriter, decode_json, encode_json
from evalsup.ipc.frames import FrameParser
from evalsup.ipc.messages import WIRE_TOP, WorkerConfig
from evalsup.scoring.judge import JUDGE, load_template, parse_template
from evalsup.scoring.plugin import load_callable
from evalsup.scoring.scorers import Scored, ScorerOptions, response_text
from evalsup.scoring.selection import judged as judged_by
from evalsup.tasks.billed import tier_of
from evalsup.tasks.group_key import group_of, parse_group_by
from evalsup.tasks.headers import api_key, build_headers, key_source, request_headers
from evalsup.tasks.requests import RequestDefaults, to_request
from evalsup.tasks.response_schema import SchemaError
from evalsup.tasks.secrets import run_scrubber
from evalsup.worker import reask, records
from evalsup.worker.adaptive import adaptive_from_config
from evalsup.worker.bodies import UsageOnly
from evalsup.worker.breaker import HandedBack
from evalsup.worker.client import Client, Outcome
from evalsup.worker.control import Control, leak_report
from evalsup.worker.endpoints import Endpoint, EndpointPool
from evalsup.worker.hedge import Tail, tick_s
from evalsup.worker.judge import Judge, JudgeSettings
from evalsup.worker.pacing import Pacer
from evalsup.worker.pipes import FLUSH_DELAY_S, Outbox, fatal_start, open_pipes, read_config
from evalsup.worker.race import Hedger
from evalsup.worker.retry import RetryPolicy
from evalsup.worker.schedule import Schedule
from evalsup.worker.scoring import Scoring
from evalsup.worker.server_signals import scrape_endpoints


class Worker:
    def __init__(self, cfg: WorkerConfig, reader: asyncio.StreamReader, out: FrameWriter) -> None:
        self.cfg = cfg
        self.reader = reader
        self.out = out
        self.concurrency = cfg.concurrency
        self.extra_headers = build_headers(cfg.headers)  # --header, User-Agent (a bad one: FATAL, not a crash)
        self.key = api_key(cfg.api_key_env, cfg.api_key_file)
        source = key_source(cfg.api_key_env, cfg.api_key_file)
        # one per --base-url, each with its breaker evidence, adaptive limit (None with --concurrency) and headers
        # (its own Authorization: the key, or basic auth from its URL; a conflict was refused before the start)
        self.endpoints = EndpointPool(cfg.endpoints, lambda: adaptive_from_config(cfg, len(cfg.endpoints)),
                                      lambda url: request_headers(url, self.extra_headers, self.key, source))
        self.schedule = Schedule(cfg.concurrency, cfg.limit, self.endpoints, self._begin)
        # every secret the run knows (issue 39): out of every body, message and record this worker sends
        self.scrub = run_scrubber(cfg.endpoints, cfg.headers, cfg.api_key_env, cfg.api_key_file, cfg.judge_base_url,
                                  cfg.judge_api_key_env)
        self.outbox = Outbox(out, cfg.ring_fd, cfg.ring_size)
        self.outbox.scrub = self.scrub.text
        self._live: set[asyncio.Task[None]] = set()
        self.draining = False
        self.done = 0
        self.finished = asyncio.Event()
        self.defaults = RequestDefaults(cfg.model, cfg.max_tokens, cfg.temperature, cfg.stream)
        self.plugin = load_callable(cfg.plugin) if cfg.plugin else None
        # the run's scorers, and those a task names itself (issue 43: scoring.selection); the judge is asked
        # after them (worker.judge)
        opts = ScorerOptions(cfg.score_strip, cfg.score_ignore_case, cfg.score_pattern, cfg.score_normalize)
        self.scoring = Scoring(list(cfg.scorers), opts, cfg.scorer_timeout_s, cfg.scorer_threads)
        self.judge: Judge | None = None
        self.judging = JUDGE in cfg.scorers
        # an answer's body is read whole (parsed), not only checked, when something reads its text (a task that
        # names its own scorers has its body read whole then: _whole)
        self.reads_bodies = (any(s != JUDGE for s in cfg.scorers) or self.plugin is not None or self.judging)
        self.group_path = parse_group_by(cfg.group_by) if cfg.group_by else None  # --group-by metadata.KEY
        self.pid = os.getpid()
        self.parent = os.getppid()  # the supervisor (it starts every worker itself): another pid once it is dead
        # the answer cache (issue 30): read here, before a request is paced or sent; kept by the supervisor
        self.cache = CacheReader(Path(cfg.cache_dir), cfg.cache_mode, cfg.cache_model_id, cfg.endpoints,
                                 cfg.cache_salt, cfg.cache_length,
                                 schema_in_key(cfg.response_schema, cfg.validate_schema),
                                 key_headers(cfg.headers)) if cfg.cache_dir else None
        self.pacer = Pacer(random.Random(self.pid))
        self.client: Client | None = None
        # --hedge (issue 28): a task's request may get a second copy in the tail of the run (worker.race)
        self.hedger = Hedger(cfg.hedge_factor, self._copy) if cfg.hedge else None
        self._bg: set[asyncio.Task[Any]] = set()
        self.control = Control(self.schedule, self.endpoints, self.pacer, self.outbox, self._probe, self._drain,
                               lambda: leak_report(self.pid, self.done),
                               lambda age, now: self.client.abandon(age, now) if self.client else 0,
                               lambda n: self.judge.resize(n) if self.judge is not None else None)

    def _pump(self) -> None:
        """Start every task that may start now (``Schedule.pump``); their STARTED notes go out within the delay.
        None once the supervisor is gone: the worker exits here, as it does at EOF on stdin."""
        if os.getppid() != self.parent:
            # A kill -9 of the supervisor closes our pipes at once, but its EOF is read only loop iterations
            # later; answers handled meanwhile would each start a queued task, a request paid for whose answer
            # no one can record (the rerun sends it again). The parent's pid changes at its death, not later.
            os._exit(0)
        if self.schedule.pump():
            self.out.arm()

    def _begin(self, meta: Any, line: bytes | memoryview) -> None:
        self.outbox.started(meta["k"])  # goes out with the next write, in one STARTED frame for all
        t = asyncio.create_task(self._one(meta, line))
        self._live.add(t)
        t.add_done_callback(self._live.discard)

    async def _one(self, meta: Any, line: bytes | memoryview) -> None:
        """One task from start to its RESULT frame; its slot is free once the frame is on its way (a full pipe
        holds slots, and so holds back new requests, up to --concurrency of them)."""
        schedule = self.schedule
        try:
            try:
                out_line, info = await self.process(meta, line)
            except HandedBack:  # parked for an outage when told to drain: back to the supervisor, unanswered
                self.outbox.returned([meta["k"]])
                return
            except Exception as e:
                # A bug (or a plugin's exception) must not leave the task unanswered, which would hold the run
                # forever: the worker dies, and the supervisor hands the task on, then records it as failed
                # after --max-task-crashes. Only the type goes out: a message may quote anything.
                print(f"evalsup worker {self.pid}: line {meta.get('n')}: {type(e).__name__}; exiting",
                      file=sys.stderr, flush=True)
                os._exit(70)
            finally:
                schedule.answered()
            self.done += 1
            self.outbox.result(out_line, info, schedule.limit, bool(schedule.queue))
            self._pump()
            if self.out.must_drain():
                await self.out.drain()  # at once, unless the pipe is full
        finally:
            schedule.freed()
            self._pump()
            self._check_drained()

    async def process(self, meta: Any, line: bytes | memoryview) -> tuple[list[bytes], dict[str, Any]]:
        """One task: its output line (as parts to write one after the other) and the RESULT meta."""
        client = self.client
        assert client is not None, "tasks are read only once the client exists"
        obj = orjson.loads(line)
        tid = str(obj.get("custom_id", obj.get("id")))
        url, body, metadata = to_request(obj, self.defaults)
        key = meta["k"]
        cache = self.cache
        ck = hit = unfit = None
        if cache is not None:
            ck = cache.key(url, body, tid)
            if cache.reads:  # an entry that fails an answer's checks is a miss, and says why (issue 39)
                found = cache.lookup(ck, url)
                hit, unfit = (None, found) if isinstance(found, str) else (found, None)
        hedge: bool | None = None  # hedged: whether the second copy's answer is the record
        checked = self.cfg.validate_schema and (
            self.cfg.response_schema is not None or "response_format" in body or "text" in body)
        oc: Outcome | None = None
        if hit is not None:  # answered from the cache: no request, no rate budget
            oc = from_cache(hit, whole=self.reads_bodies or checked)
            if checked and not valid_hit(body, self.cfg.response_schema, oc):
                oc = hit = None  # kept before the schema applied (or under another): asked again, as a miss
                unfit = "not valid for the JSON schema"
        if oc is None:
            if self.hedger is None:
                oc = await self._execute(client, url, body, key)
            else:  # its copies race (worker.race): one outcome, the other copy cancelled
                eps = self.endpoints.all
                oc, hedge = await self.hedger.run(key, lambda avoid: self._execute(
                    client, url, body, key, None if avoid is None else eps[avoid]))
        reasks = None
        reask_usage = None
        if hit is None and oc.error is None and checked:
            oc, reasks, reask_usage = await self.structured(url, body, key, oc)
        if self.plugin is not None:
            self.outbox.before_user_code(key)
            self.plugin(obj, oc)
        scored = None
        task = {"id": tid, **metadata}
        if oc.error is None and self.scoring.applies(task):
            self.outbox.before_user_code(key)
            scored = await self.scoring.score(task, _whole(oc))
        judged = None
        if (self.judge is not None and oc.error is None  # after the answer; one record with both (exactly once)
                and judged_by(task, self.scoring.loaded.specs)):
            scored = scored or Scored({}, {}, [])
            judged = await self.judge_one(tid, body, oc.parsed, metadata, key, scored)
        # which endpoint served it (its last attempt): index and URL without credentials (issue 21)
        endpoint = {"index": oc.endpoint, "url": self.endpoints.all[oc.endpoint].public} if hit is None else None
        group = None if self.group_path is None else group_of(metadata, self.group_path)
        note = None
        if cache is not None and ck is not None:
            if hit is not None:
                note = records.CacheNote(ck.hex(), True, model=hit.entry.model)
            elif oc.error is None and oc.status == 200 and cache.keep(oc.parsed, oc.raw_json):
                model = body.get("model")
                note = records.CacheNote(ck.hex(), False, [oc.request_id, model if isinstance(model, str) else None,
                                                           url], unfit=unfit)
            else:
                note = records.CacheNote(ck.hex(), False, unfit=unfit)
        asked = body.get("model")
        asked = asked if isinstance(asked, str) and asked else None
        extras = records.Extras(hedge=hedge, judge_tokens=judged, group=group, reasks=reasks,
                                reask_usage=reask_usage, cache=note, tier=tier_of(body), model=asked,
                                own_model=asked is not None and asked != self.defaults.model)
        return records.build(tid, oc, key, meta.get("q", 0.0), self.pid, endpoint, metadata, scored, extras,
                             self.scrub)

    async def structured(self, url: str, body: dict[str, Any], key: int,
                         oc: Outcome) -> tuple[Outcome, int | None, tuple[int, int] | None]:
        """An answer that must follow a JSON schema (--response-schema, or the request's own): asked again with
        the validation error (``reask``) up to --max-reasks times, through the same client; still invalid, the
        record's error is schema_invalid. Returns the last outcome (time and retries summed over all the
        requests, attempts the most one request took), the re-asks made (None: the task has no schema) and the
        (prompt, completion) tokens of the requests before the last (None: no re-ask), which the caps spend."""
        client = self.client
        assert client is not None
        try:
            schema = reask.schema_for(body, self.cfg.response_schema)
        except SchemaError as e:
            return dataclasses.replace(oc, error=reask.bad_schema(e)), 0, None
        if schema is None:
            return oc, None, None
        reasks = 0
        earlier = [0, 0]  # the tokens of the answers asked again
        while True:
            parsed = oc.parsed
            if isinstance(parsed, UsageOnly) and oc.raw_json is not None:  # only checked, not built: build it
                parsed = orjson.loads(oc.raw_json)
            verdict = reask.check(parsed, schema)
            spent = (earlier[0], earlier[1]) if reasks else None
            if verdict.error is None:
                return oc, reasks, spent
            nxt = reask.next_request(body, verdict.text, verdict.error) if reasks < self.cfg.max_reasks else None
            if nxt is None:
                return dataclasses.replace(oc, error=reask.failure(verdict.error, reasks)), reasks, spent
            pt, ct = reask.tokens_of(parsed)
            earlier[0] += pt
            earlier[1] += ct
            body, reasks = nxt, reasks + 1
            again = await self._execute(client, url, body, key)
            # each request has its own --max-attempts (attempts: the most one took); retries (sent - 1) add up
            oc = dataclasses.replace(again, attempts=max(oc.attempts, again.attempts), sent=oc.sent + again.sent - 1,
                                     latency_s=oc.latency_s + again.latency_s, queue_s=oc.queue_s + again.queue_s,
                                     stalled=oc.stalled + again.stalled)
            if oc.error is not None:  # the re-ask itself failed (after its own retries): that is the record
                return oc, reasks, (earlier[0], earlier[1])

    @staticmethod
    async def _execute(client: Client, url: str, body: dict[str, Any], key: int,
                       avoid: Endpoint | None = None) -> Outcome:
        """All the attempts of one copy of a task's request (``Client.execute``)."""
        try:
            return await client.execute(url, body, key, avoid)
        except Exception as e:  # a bug must cost one record, never the worker
            return Outcome(None, None, 0, None, {"code": "internal_error", "message": f"{type(e).__name__}: {e}"},
                           1, 0.0)

    def _copy(self, delta: int) -> None:
        """A hedge's second copy starts (+1) or ends (-1): it is active as any request (``Schedule.active``)."""
        self.schedule.copies += delta
        if delta < 0:
            self._pump()

    async def hedge_loop(self, hedger: Hedger) -> None:
        """--hedge: every ``hedge.tick_s``, start the copies due (``Hedger.check``) in the tail of the run. Not
        while this worker drains (a recycle mid-run is not the run's tail) or no endpoint is up (a copy would
        only park)."""
        schedule = self.schedule
        while True:
            await asyncio.sleep(tick_s(hedger.factor, hedger.window.p95()))
            c = self.client
            if c is None or not c.wire or schedule.queue or self.draining or not self.endpoints.any_up():
                continue
            tail = Tail(len(schedule.queue), schedule.active(), schedule.allowed(), schedule.paused)
            hedger.check(c.wire, time.monotonic(), tail)


    async def judge_one(self, tid: str, request: dict[str, Any], parsed: Any, metadata: dict[str, Any], key: int,
                        scored: Scored) -> tuple[int, int] | None:
        """Ask the judge about one answer and put its verdict in ``scored``: ``judge`` scored, or a scorer error
        (the reply kept), or unscored without ``expected``; the judge's reply under ``detail``. Its tokens (None:
        it was not asked)."""
        assert self.judge is not None
        expected = metadata.get("expected")
        if expected is None or expected == []:
            scored.unscored.append(JUDGE)
            return None
        try:
            v = await self.judge.judge(tid, request, response_text(parsed), expected, key)
        except Exception as e:  # a bug costs this task its judge score, never its answer nor the worker
            scored.fail(JUDGE, f"{type(e).__name__}: {e}")
            return None
        if v.score is None:
            scored.fail(JUDGE, v.error or "no grade")
        else:
            scored.scores[JUDGE] = v.score
        if v.reply is not None:
            scored.detail[JUDGE] = v.detail()
        return v.prompt_tokens, v.completion_tokens

    def _probe(self, e: int) -> None:
        if self.client is not None:
            t = asyncio.create_task(self.client.probe(e))
            self._bg.add(t)
            t.add_done_callback(self._bg.discard)

    def _drain(self) -> None:
        self.draining = True
        self._check_drained()

    def _check_drained(self) -> None:
        if self.draining and not self.schedule.queue and self.schedule.inflight == 0:
            self.finished.set()

    async def heartbeat(self) -> None:
        interval = self.cfg.heartbeat_s
        schedule = self.schedule
        while True:
            c = self.client
            beat: dict[str, Any] = {
                "inflight": schedule.inflight, "queued": len(schedule.queue), "done": self.done, "t": time.time(),
                "parked": c.parked if c else 0, "retries": c.retries if c else 0,
                "wire": c.on_wire if c else 0,  # requests on the wire (status/progress "in flight")
                "limit": schedule.allowed(), "eps": self.endpoints.load(schedule.limit)}  # adaptive (issue 21)
            if self.cfg.adaptive and (why := self.endpoints.why(schedule.limit)) is not None:
                beat["why"] = why  # a low limit's reason in words (issue 41)
            if c is not None and c.wire:  # the oldest requests on the wire: status shows them, STALL acts on them
                beat["old"] = c.oldest(time.monotonic(), WIRE_TOP)
            self.out.send(encode_json(FrameKind.HEARTBEAT, beat))
            await self.out.drain()
            await asyncio.sleep(interval)

    async def read_loop(self) -> None:
        frames: list[tuple[FrameKind, memoryview]] = []
        parser = FrameParser(lambda kind, payload: frames.append((kind, payload)))
        on_frame = self.control.on_frame
        while True:
            data = await self.reader.read(1 << 20)
            if not data:
                return  # EOF: the supervisor is done with us or gone
            parser.feed(data)
            news = False  # anything that can let a request start (not just ring space freed)
            for kind, payload in frames:
                news = news or kind is not FrameKind.RELEASE
                on_frame(kind, payload)
            frames.clear()
            if news:
                self._pump()

    async def run(self) -> None:
        cfg = self.cfg
        timeout = aiohttp.ClientTimeout(total=cfg.total_timeout_s, sock_connect=cfg.connect_timeout_s,
                                        sock_read=cfg.read_timeout_s)
        connector = aiohttp.TCPConnector(limit=self.concurrency, ssl=not cfg.insecure)
        key = self.key
        policy = RetryPolicy(max_attempts=cfg.max_attempts, cap_s=cfg.max_retry_wait_s,
                             max_limited_s=cfg.max_rate_limited_s)
        schedule, outbox = self.schedule, self.outbox
        async with contextlib.AsyncExitStack() as stack:
            session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector, timeout=timeout))
            client = Client(session, self.endpoints, policy,
                            int(cfg.max_response_mb * (1 << 20)), seed=self.pid, cap=lambda: schedule.limit,
                            pacer=self.pacer, on_trip=outbox.trip,
                            on_probe=outbox.probe_result, secret=key, on_auth=outbox.auth, on_local=outbox.fatal,
                            whole_bodies=self.reads_bodies or cfg.response_schema is not None)
            client.secrets = list(self.scrub.encoded)  # the key, URL and --header secrets (tasks.secrets)
            client.scrub = self.scrub.raw
            self.client, client.on_rest = client, self._pump
            if self.judging:  # its own endpoint, pool, limit, breaker and connections (worker.judge)
                judge_session = await stack.enter_async_context(aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=cfg.judge_concurrency, ssl=not cfg.insecure),
                    timeout=timeout))
                self.judge = Judge(judge_settings(cfg), judge_session, self.outbox.fatal, seed=self.pid)
            tasks = [asyncio.create_task(self.heartbeat())]
            if self.hedger is not None:
                tasks.append(asyncio.create_task(self.hedge_loop(self.hedger)))
            if cfg.adaptive:  # every attempt and the server's queue feed each endpoint's limit
                schedule.resting = lambda: client.resting  # a request resting in a back-off holds no slot
                client.wait_slot = schedule.back  # and waits for one when its rest ends
                client.observe = self.endpoints.observer(schedule.active, lambda: schedule.limit)
                tasks.append(scrape_endpoints(session, self.endpoints, cfg.server_metrics))
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
            if self.judge is not None:
                self.judge.close()


def judge_settings(cfg: WorkerConfig) -> JudgeSettings:
    """The judge's settings from the worker's config: its key from --judge-api-key-env (else the answers')."""
    assert cfg.judge_base_url is not None and cfg.judge_model is not None, "checked by build_config"
    template = parse_template(cfg.judge_template) if cfg.judge_template is not None else load_template(None)
    if cfg.judge_api_key_env:
        key, source = api_key(cfg.judge_api_key_env, None), f"the judge's API key (${cfg.judge_api_key_env})"
    else:
        key, source = api_key(cfg.api_key_env, cfg.api_key_file), key_source(cfg.api_key_env, cfg.api_key_file)
    return JudgeSettings(cfg.judge_base_url, cfg.judge_model, template, key, source, cfg.judge_concurrency,
                         cfg.judge_timeout_s, cfg.judge_max_tokens, cfg.max_attempts, cfg.max_retry_wait_s,
                         cfg.max_rate_limited_s, int(cfg.max_response_mb * (1 << 20)))


def valid_hit(body: dict[str, Any], run_schema: dict[str, Any] | None, oc: Outcome) -> bool:
    """Whether a kept answer (parsed: ``from_cache`` with ``whole``) follows the task's JSON schema, as a fresh
    answer must; a schema that is not valid makes it a miss (the request then gets the schema's error)."""
    try:
        schema = reask.schema_for(body, run_schema)
    except SchemaError:
        return False
    return schema is None or reask.check(oc.parsed, schema).error is None


def from_cache(hit: Hit, whole: bool) -> Outcome:
    """A kept answer (checked: ``CacheReader.lookup``) as an outcome: its body's bytes as first written, no
    attempt, no time at a server. The parsed body is kept only when something reads it (``whole``: a scorer,
    the judge, a plugin, a JSON schema's check); else its usage is the one kept beside it."""
    e = hit.entry
    usage = {"prompt_tokens": e.prompt_tokens, "completion_tokens": e.completion_tokens}
    return Outcome(e.status, orjson.Fragment(hit.body), len(hit.body), e.request_id, None, 0, 0.0,
                   parsed=hit.parsed if whole else {"usage": usage}, raw_json=hit.body, sent=1)


async def amain() -> int:
    reader, out = await open_pipes(FLUSH_DELAY_S)
    payload = await read_config(reader, "evalsup worker")
    if isinstance(payload, int):
        return payload
    try:
        cfg = WorkerConfig.from_wire(decode_json(payload))
        if cfg.trace_memory:
            import tracemalloc

            tracemalloc.start(10)
        worker = Worker(cfg, reader, out)
    except Exception as e:
        return await fatal_start(out, e)
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


def _whole(oc: Outcome) -> Any:
    """The answer's body for a scorer: parsed whole (a large one only checked, when the run's own settings read
    no body, is parsed now for a task that names its own scorers)."""
    if isinstance(oc.parsed, UsageOnly) and oc.raw_json is not None:
        return orjson.loads(oc.raw_json)
    return oc.parsed
