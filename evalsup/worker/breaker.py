"""The worker's side of the circuit breaker: evidence that the endpoint as a whole is failing.

Evidence is the connection itself refused, or endpoint-side failures (resets, timeouts, 500/502/503/504) of
``spread`` distinct tasks with no success in between: one task that always fails is that task's problem, and
uses up its own attempts. Where a steady share of requests fails whatever happens (a flaky proxy, a server
that cuts one stream in five, issue 28), a run of failures is no news: the spread needed grows with the share
of endpoint-side failures among the last answers (as measured at the last success, so an outage's own failures
do not raise it), until such a run has less than ``chance`` (1 in 10,000) of happening by luck (at most
``max_spread``; at the start, with no answer seen, that many). And then a run of failures must last as long
as an answer takes (the mean latency of the last successes): refusals and 500s that come back at once, while
the answers to requests sent with them are still on their way, are not "no success in between".

On evidence the worker trips and tells the supervisor, which opens the breaker for every worker and checks
the endpoint with a request of its own (GET /models), never with a parked task. While open, no request
starts, and a request whose attempt failed endpoint-side is parked. On close the supervisor says whether the
endpoint had been down (a probe failed): then the parked attempts are not counted against --max-attempts (no
task pays for an outage); if it was up after all, they are.

Nor do the attempts that failed before the trip: each failure belongs to a run of failures (``epoch``, which a
success or a close ends), and a run that ended in a close after an outage (``ended``) gives its tasks their
attempts back. While the run of failures covers enough tasks but has not yet lasted as long as an answer takes
(``undecided``), a task that fails waits that long rather than spend another attempt at once (its retry's
back-off may be a few ms, and resets come back at once: a task could use up its --max-attempts before its
breaker was allowed to trip); then the breaker trips if no answer came meanwhile (``overdue``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque


class LocalBreaker:
    def __init__(self, spread: int = 3, history: int = 50, chance: float = 1e-4, max_spread: int = 12) -> None:
        self.spread = spread
        self.chance = chance
        self.max_spread = max_spread
        self._answers: deque[bool] = deque(maxlen=history)  # the last answers: failed endpoint-side (True) or not
        self.need = self._need()  # distinct failing tasks that trip it now (``spread``, more on a steady share)
        self.failing: set[int] = set()  # distinct tasks failing endpoint-side since the last success
        self._streak_at = 0.0  # when the first of them failed
        self.answer_s = 0.0  # how long an answer takes (the mean latency of the last successes)
        self._served = 0
        self.open = False
        self.tripped = False  # we told the supervisor; reset on close
        self.was_down = False  # how the last opening ended: the endpoint had been down
        # the run of failures now: a success or a close ends it; the runs that ended in a close after an outage
        # (a few: a task lives through few of them), whose failed attempts are given back to their tasks
        self.epoch = 0
        self._down_epochs: deque[int] = deque(maxlen=8)
        self._closed = asyncio.Event()
        self._closed.set()

    def record(self, key: int, endpoint_side: bool, refused: bool = False, now: float | None = None) -> bool:
        """Record one failed attempt of task ``key`` (at ``now``, monotonic); True when this worker should now
        trip."""
        if not endpoint_side:
            return False
        now = time.monotonic() if now is None else now
        if not self.failing:
            self._streak_at = now
        self.failing.add(key)
        if self.tripped or self.open:
            return False
        self._answers.append(True)
        # (on a clean history at once, as before: an outage's first failures cost no task an attempt)
        if refused or (len(self.failing) >= self.need
                       and (self.need <= self.spread or now - self._streak_at >= self.answer_s)):
            self.tripped = True
            return True
        return False

    def undecided(self, now: float) -> float:
        """Seconds until the run of failures, which already covers enough tasks to trip, has lasted as long as
        an answer takes (0.0 when nothing waits on that: too few tasks, no wait needed, or tripped or open). A
        task that fails meanwhile waits this long for the breaker's verdict rather than spend an attempt."""
        if self.tripped or self.open or len(self.failing) < self.need or self.need <= self.spread:
            return 0.0
        return max(0.0, self._streak_at + self.answer_s - now)

    def overdue(self, now: float) -> bool:
        """The wait ``undecided`` gave is over at ``now``: True when the run of failures, still unbroken by an
        answer and covering enough tasks, now trips this worker (as ``record`` would on the next failure)."""
        if self.tripped or self.open or len(self.failing) < self.need or now - self._streak_at < self.answer_s:
            return False
        self.tripped = True
        return True

    def ended(self, epoch: int) -> bool | None:
        """How the run of failures ``epoch`` ended: in a close after an outage (True: its failed attempts are
        given back), otherwise (False: an answer, or a false alarm), or not yet (None)."""
        if epoch == self.epoch:
            return None
        return epoch in self._down_epochs

    def success(self, latency_s: float = 0.0) -> None:
        """An answer served, after ``latency_s``."""
        self.answer_s += (latency_s - self.answer_s) * (0.2 if self._served else 1.0)
        self._served += 1
        self.epoch += 1
        self.failing.clear()
        self._answers.append(False)
        self.need = self._need()

    def _need(self) -> int:
        """The run of failing tasks that a steady share of failures makes less likely than ``chance``: at least
        ``spread``, at most ``max_spread``. The share is the last answers' with one failure and one success
        more (Laplace's rule): at the start, with nothing seen, it is taken for even (a burst of fast 500s
        among the first requests is not an outage: the connection check has just seen the endpoint up); after
        a few dozen clean answers it is small and three tasks trip it, as before."""
        n = len(self._answers)
        share = (sum(self._answers) + 1) / (n + 2)
        if share >= 0.9:
            return self.max_spread
        return max(self.spread, min(self.max_spread, math.ceil(math.log(self.chance) / math.log(share))))

    def set_open(self, is_open: bool, was_down: bool = False) -> None:
        was_open, self.open = self.open, is_open
        if is_open:
            self._closed.clear()
        else:
            if was_open:  # the run of failures that opened it ends here
                if was_down:
                    self._down_epochs.append(self.epoch)
                self.epoch += 1
            self.tripped = False
            self.was_down = was_down
            self.failing.clear()
            self._closed.set()

    async def wait_closed(self) -> bool:
        """Park until the breaker closes; True when the endpoint had been down (the attempt is not counted)."""
        await self._closed.wait()
        return self.was_down


class HandedBack(BaseException):
    """Raised in a request waiting for an outage's end, or for a key's verdict, when its worker drains: the task
    goes back to the supervisor unanswered. A BaseException, as CancelledError is, so that no handler of errors
    takes it for a failure."""


class AuthWatch:
    """One endpoint's evidence whether the key is refused: was a 401/403 the task's own, or is the key refused
    (revoked mid-run, or not taken by this endpoint)? The run must not fail every task for a lost key.

    A refused request waits here for the verdict. The first refusal makes the client ask the endpoint itself
    (``worker.probes.key_check``: the tiny request of the connection check, for the path and model this endpoint
    last served). A success of any request *sent after the refusal came back*, that check's or a task's, shows
    the key still works: the refusal was that task's own (written as a failed record). A success of a request
    sent earlier proves nothing: it may have reached the server before the key was revoked, even if it left
    after the refused one (requests in flight together arrive in any order). The check refused too
    (``check_refused``): the key is lost. A refused request then waits until the supervisor either stops the
    run (the task is redone by the rerun) or, with other endpoints still serving, leaves this one out
    (``release``). An endpoint ejected meanwhile (``move_on``) sends its waiting tasks elsewhere too, and a
    draining worker hands them back (``hand_back``)."""

    def __init__(self) -> None:
        # task -> (when it was refused, its verdict: True its own, False go elsewhere, HandedBack)
        self.refused: dict[int, tuple[float, asyncio.Future[bool]]] = {}
        self.message = ""  # what the endpoint said, for the line that reports a lost key
        self.lost = False
        self.released = False
        self.handed_back = False
        self.checking = False  # the client's key check is under way

    def refuse(self, key: int, at: float, message: str) -> bool:
        """Task ``key``'s request was refused, the answer received at ``at``; True when a key check should
        start (none is under way, and no verdict on the key yet)."""
        if self.released or self.handed_back:
            return False  # (``wait`` sends it elsewhere, or back, at once)
        self.refused[key] = (at, asyncio.get_running_loop().create_future())
        self.message = message
        return not self.lost and not self.checking

    @property
    def pending(self) -> bool:
        """Refusals wait for a verdict the key check can give."""
        return bool(self.refused) and not (self.lost or self.released or self.handed_back)

    def success(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` succeeded: the refusals received before it was sent were their own."""
        if not self.refused or self.lost:
            return
        for key, (when, verdict) in list(self.refused.items()):
            if when < sent_at:
                del self.refused[key]
                if not verdict.done():
                    verdict.set_result(True)

    def check_refused(self) -> bool:
        """The key check was refused too: the key is lost. True the first time (tell the supervisor, once)."""
        if self.lost or self.released:
            return False
        self.lost = True
        return True

    def move_on(self) -> None:
        """The endpoint is ejected (or left out): every refused request waiting here goes to another endpoint
        (or parks until one is up), no attempt counted."""
        waiting, self.refused = self.refused, {}
        for _, verdict in waiting.values():
            if verdict.done():
                continue
            if self.handed_back:
                verdict.set_exception(HandedBack())
            else:
                verdict.set_result(False)

    def release(self) -> None:
        """The endpoint is left out of the run: what it refused goes to the others, now and from now on."""
        self.released = True
        self.move_on()

    def hand_back(self) -> None:
        """The worker drains: every refused request waiting here goes back to the supervisor unanswered."""
        self.handed_back = True
        self.move_on()

    async def wait(self, key: int) -> bool:
        """True when the refusal was task ``key``'s own; False when it is to go to another endpoint; raises
        HandedBack when the worker drains. While the key is lost and nothing else happens, it does not return."""
        entry = self.refused.get(key)
        if entry is None:  # refused after a release or a hand-back
            if self.handed_back:
                raise HandedBack
            return False
        return await entry[1]
