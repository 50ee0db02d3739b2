"""The model-graded scorer's requests (``--scorer judge``): the judge endpoint, asked after the answer.

The judge is an endpoint of its own (--judge-base-url), reached through the same ``Client`` as the answers:
the same retry policy, timeouts, key handling and breaker, but its own ``EndpointPool`` (one endpoint), its own
pacer and its own limit (--judge-concurrency requests in flight), so it never takes from the answer endpoints'
pool nor they from it. Its breaker is this process's own: a trip is not the supervisor's (whose endpoints are
the answers'); the judge is probed here, every 1 to 10 s, and its parked requests go on once it answers. A key
the judge refuses, or a request that cannot be sent at all, stops the run (``on_fatal``): a setting is wrong.

One task's judging is bounded by --judge-timeout (its attempts and any outage together); past it, or when the
judge's request finally fails, the task gets a scorer error (``scores.judge`` null, the reason in
``score_errors``), never a failed task: its answer was had. The worker (``worker.main``) and `evalsup score`
(``tools.rescore_judge``) both use it.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from evalsup.scoring.judge import Template, Verdict, variables, verdict_of
from evalsup.scoring.scorers import response_text
from evalsup.tasks.headers import build_headers, request_headers
from evalsup.tasks.secrets import Scrubber
from evalsup.worker.client import Client
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.pacing import Pacer
from evalsup.worker.retry import RetryPolicy

PATH = "/v1/chat/completions"
PROBE_S = (1.0, 10.0)  # the judge's probes while its breaker is open: first after 1 s, then up to every 10 s


@dataclass(frozen=True)
class JudgeSettings:
    url: str
    model: str
    template: Template
    key: str | None = None
    key_source: str = "the judge's API key"
    concurrency: int = 16
    timeout_s: float = 900.0
    max_tokens: int | None = None
    max_attempts: int = 8
    max_retry_wait_s: float = 60.0
    max_rate_limited_s: float = 1800.0
    max_response_bytes: int = 64 << 20


class Slots:
    """The judge's requests in flight in this worker: at most ``limit``, which may change while they are out (a
    smaller limit lets no new one start until enough have ended)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.busy = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def _wake(self) -> None:
        free = self.limit - self.busy
        while free > 0 and self._waiting:
            f = self._waiting.popleft()
            if not f.done():
                f.set_result(None)
                free -= 1

    async def __aenter__(self) -> None:
        while self.busy >= self.limit:
            f: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(f)
            try:
                await f
            except asyncio.CancelledError:
                if f.done() and not f.cancelled():
                    self._wake()  # woken, then cancelled: the turn goes to the next one
                raise
        self.busy += 1

    async def __aexit__(self, *exc: object) -> None:
        self.busy -= 1
        self._wake()


class Judge:
    def __init__(self, s: JudgeSettings, session: aiohttp.ClientSession, on_fatal: Callable[[str], None],
                 seed: int = 0) -> None:
        self.s = s
        self.on_fatal = on_fatal
        # no --header: those are the answer endpoints' (a gateway's); the judge gets the User-Agent and its key
        common = build_headers(())
        self.pool = EndpointPool([s.url], headers=lambda url: request_headers(url, common, s.key, s.key_source))
        policy = RetryPolicy(max_attempts=s.max_attempts, cap_s=s.max_retry_wait_s,
                             max_limited_s=s.max_rate_limited_s)
        self.client = Client(session, self.pool, policy, s.max_response_bytes, seed=seed,
                             pacer=Pacer(random.Random(seed)), on_trip=self._tripped, on_probe=self._probed,
                             secret=s.key, on_auth=self._key_lost, on_local=on_fatal, cap=lambda: self.slots.limit)
        self.scrub = Scrubber.for_run([s.url], keys=[s.key])  # its key, its URL's secrets (tasks.secrets)
        self.client.secrets, self.client.scrub = list(self.scrub.encoded), self.scrub.raw
        self.slots = Slots(s.concurrency)
        self._probe_in = PROBE_S[0]
        self._bg: set[asyncio.Task[Any]] = set()
        self.trips = 0

    # ------------------------------------------------------------------ its own breaker

    def _tripped(self, e: int, reason: str) -> None:
        """Its breaker opened (the client ejected it): probe it until it answers."""
        self.trips += 1
        self._probe_in = PROBE_S[0]
        self._later(self._probe_in)

    def _later(self, seconds: float) -> None:
        async def probe() -> None:
            await asyncio.sleep(seconds)
            await self.client.probe(0)

        t = asyncio.create_task(probe())
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    def _probed(self, e: int, ok: bool, detail: str) -> None:
        if ok:  # it serves again: the parked requests go on, their parked attempts not counted
            self.pool.set_open(0, False, was_down=True)
            return
        self._probe_in = min(PROBE_S[1], self._probe_in * 2)
        self._later(self._probe_in)

    def _key_lost(self, e: int, message: str) -> None:
        self.on_fatal(f"the judge endpoint {self.pool.all[0].public} refused {self.s.key_source}: {message}; "
                      "set --judge-api-key-env to the variable that holds the judge's key")

    # ------------------------------------------------------------------ judging

    def request(self, task_id: str, request: dict[str, Any], answer: str, expected: Any) -> dict[str, Any]:
        """The judge's request for one answer: the template rendered as one user message."""
        prompt = self.s.template.render(variables(task_id, request, answer, expected))
        body: dict[str, Any] = {"model": self.s.model, "messages": [{"role": "user", "content": prompt}]}
        if self.s.max_tokens is not None:
            body["max_tokens"] = self.s.max_tokens
        return body

    async def judge(self, task_id: str, request: dict[str, Any], answer: str, expected: Any,
                    key: int = 0) -> Verdict:
        """Grade ``answer`` to ``request`` against ``expected`` (``key``: the task's, for the breaker's count of
        distinct tasks failing)."""
        body = self.request(task_id, request, answer, expected)
        async with self.slots:
            try:
                oc = await asyncio.wait_for(self.client.execute(PATH, body, key), self.s.timeout_s)
            except TimeoutError:
                return verdict_of(self.s.template, None, error=f"the judge took longer than --judge-timeout "
                                                               f"{self.s.timeout_s:g}s")
        usage = oc.parsed.get("usage") if isinstance(oc.parsed, dict) else None
        if oc.error is not None:
            return verdict_of(self.s.template, None, usage,
                              f"the judge's request failed: {oc.error['code']}: {oc.error.get('message', '')}")
        return verdict_of(self.s.template, response_text(oc.parsed), usage)

    def resize(self, n: int) -> None:
        """This worker's share of --judge-concurrency changed (workers added: the supervisor's LIMIT)."""
        self.slots.resize(n)

    def close(self) -> None:
        for t in self._bg:
            t.cancel()
