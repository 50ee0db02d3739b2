"""Retry policy: what to do after each attempt, and how long to wait before the next one."""

from __future__ import annotations

import email.utils
import enum
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evalsup.worker.errors import Code, Failure, FailureKind

if TYPE_CHECKING:
    from evalsup.worker.endpoints import Endpoint


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Verdict(enum.Enum):
    """What the attempt loop (``client.Client.execute``) does after a failed attempt (``RetryPolicy.decide``)."""

    DONE = "done"  # write the record: a success, or a failure that trying again will not mend
    RETRY = "retry"  # back off (``delay``), then another attempt (this one counted against --max-attempts)
    WAIT = "wait"  # the server's flow control: wait as asked (``delay``), or go elsewhere (``hop``); not counted
    MOVE = "move"  # its endpoint is ejected and another is up: there at once, not counted
    PARK = "park"  # its endpoint is ejected and none is up: wait until one rejoins (then as ``Decision.PARK`` says)
    AUTH = "auth"  # the key was refused: hold the task for the verdict on the key (its own refusal: its record)
    GIVE_UP = "give_up"  # rate-limited past --max-rate-limited-wait: write a rate_limited record


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict and what carrying it out needs.

    ``delay``: RETRY's back-off and WAIT's wait, in seconds; for PARK, the back-off before the next attempt when
    the park was a false alarm (the endpoint had not been down), or None when the task's attempts are used up
    (its record then). ``hop``: WAIT may end early, at another endpoint with room (``EndpointPool.room_elsewhere``).
    ``error``: GIVE_UP's record error."""

    verdict: Verdict
    delay: float | None = None
    hop: bool = False
    error: dict[str, str] | None = None


DONE = Decision(Verdict.DONE)
MOVE = Decision(Verdict.MOVE)
AUTH = Decision(Verdict.AUTH)


@dataclass(slots=True)
class AttemptState:
    """One task's attempts so far (as tenacity's RetryCallState): what the policy reads, what the loop keeps.

    ``used`` attempts count against --max-attempts (not a 429's wait, a move off an ejected endpoint, an outage
    or another endpoint's turn after a refused key: ``uncount``; nor those that failed before an outage's trip:
    ``outage_refund``); ``sent`` requests went out in all."""

    start: float  # monotonic, the first attempt's start: the record's total_s
    used: int = 0
    sent: int = 0
    waits: int = 0  # 429 waits sat out (the flow back-off's exponent without a Retry-After)
    hops: int = 0  # 429 waits cut short by going to another endpoint (at most --max-attempts)
    moves: int = 0  # attempts sent on from an ejected endpoint (at most --max-attempts)
    limited_s: float = 0.0  # seconds waited on the server's flow control (at most --max-rate-limited-wait)
    queued: float = 0.0  # seconds waited for the pacers (the record's queue_s, with the worker's queue)
    server_s: float = 0.0  # the last attempt at the server, from its request written to its last byte
    endpoint: int = 0  # the last attempt's endpoint
    stalled: int = 0  # attempts abandoned on the supervisor's STALL (timeout_stall; each counted as used)
    avoid: Endpoint | None = None  # the endpoint that just asked this request to wait (429): the next pick avoids it
    # counted attempts that failed endpoint-side: (endpoint, its breaker's run of failures then); given back
    # when that run proves an outage (``outage_refund``). None until the first (most tasks never fail)
    suspects: list[tuple[int, int]] | None = None

    def begin(self, queued: float, endpoint: int) -> None:
        """An attempt goes out, after ``queued`` seconds waiting for the pacers, to endpoint ``endpoint``."""
        self.used += 1
        self.sent += 1
        self.queued += queued
        self.endpoint = endpoint
        self.avoid = None

    def uncount(self) -> None:
        """The attempt just made is not the task's failure: it does not count against --max-attempts."""
        self.used -= 1

    def suspect(self, endpoint: int, epoch: int) -> None:
        """The attempt just counted failed endpoint-side at ``endpoint`` during its breaker's run of failures
        ``epoch``: counted unless that run turns out to have been an outage."""
        if self.suspects is None:
            self.suspects = []
        self.suspects.append((endpoint, epoch))

    def outage_refund(self, ended: Callable[[int, int], bool | None]) -> int:
        """Give back the counted attempts whose run of failures ended in an outage (``ended(endpoint, epoch)``:
        True), and forget those whose run ended otherwise (False: an answer came, they were the task's own);
        None keeps one (its run goes on). How many were given back."""
        if not self.suspects:
            return 0
        keep, back = [], 0
        for s in self.suspects:
            verdict = ended(*s)
            if verdict is None:
                keep.append(s)
            elif verdict:
                back += 1
        self.used -= back
        self.suspects = keep or None
        return back

    def waited(self, seconds: float, hopped_from: Endpoint | None = None) -> None:
        """A flow-control wait of ``seconds`` ended: sat out, or cut short to go elsewhere (``hopped_from``)."""
        self.limited_s += seconds
        if hopped_from is not None:
            self.hops += 1
            self.avoid = hopped_from
        else:
            self.waits += 1


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter; a Retry-After from the server wins, capped at ``cap_s``.

    ``max_attempts`` bounds the attempts a task may use up: attempts that failed for the task itself or for
    the endpoint. Waiting on a 429 (or a 503 with Retry-After) uses none, but the time a task may spend
    rate-limited is bounded by ``max_limited_s``. The same bound holds the moves off ejected endpoints and the
    hops to other endpoints out of a 429's wait, so a task cannot go round for ever.

    Pure: ``decide`` reads the failure and the state and returns a ``Decision``; the client carries it out."""

    max_attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 60.0
    max_limited_s: float = 1800.0

    def step(self, failure: Failure | None, used: int, limited_s: float) -> Verdict:
        """The verdict by the failure's kind alone (DONE, RETRY, WAIT, GIVE_UP or AUTH), after an attempt:
        ``used`` attempts counted so far (this one included), ``limited_s`` seconds already spent waiting on the
        server's flow control."""
        if failure is None:
            return Verdict.DONE
        kind = failure.kind
        if kind is FailureKind.FLOW:
            return Verdict.WAIT if limited_s < self.max_limited_s else Verdict.GIVE_UP
        if kind is FailureKind.AUTH:
            return Verdict.AUTH
        if kind in (FailureKind.REQUEST, FailureKind.FINAL) or used >= self.max_attempts:
            return Verdict.DONE
        return Verdict.RETRY

    def decide(self, f: Failure, st: AttemptState, rng: random.Random, *, up: bool = True,
               elsewhere: bool = False, endpoints: int = 1) -> Decision:
        """After failed attempt ``f`` of a task in state ``st``: ``up``, whether its endpoint is still up (not
        ejected); ``elsewhere``, whether another endpoint is; ``endpoints``, how many the run has."""
        step = self.step(f, st.used, st.limited_s)
        if step is Verdict.WAIT:
            w = self.flow_wait_s(st.waits + 1, f.retry_after, st.limited_s, rng)
            return Decision(Verdict.WAIT, w, hop=st.hops < self.max_attempts and endpoints > 1)
        if step is Verdict.GIVE_UP:
            msg = f"still rate-limited ({f.code}) after {st.limited_s:.0f}s of waiting (--max-rate-limited-wait)"
            return Decision(Verdict.GIVE_UP, error={"code": Code.RATE_LIMITED.value, "message": msg})
        if step is Verdict.AUTH:
            return AUTH
        if f.endpoint_side and not up:  # its endpoint was ejected meanwhile
            if st.moves < self.max_attempts and elsewhere:
                return MOVE
            return Decision(Verdict.PARK, None if step is Verdict.DONE else self.wait_s(st.used, f.retry_after, rng))
        if step is Verdict.DONE:
            return DONE
        return Decision(Verdict.RETRY, self.wait_s(st.used, f.retry_after, rng))

    def wait_s(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(self.cap_s, retry_after)
        return rng.uniform(0.0, min(self.cap_s, self.base_s * (2 ** (attempt - 1))))

    def flow_wait_s(self, waits: int, retry_after: float | None, limited_s: float, rng: random.Random) -> float:
        """How long to wait on a 429: as asked (at most ``cap_s`` at a time), or backoff without a
        Retry-After; never past the rate-limited budget."""
        w = min(self.cap_s, retry_after) if retry_after is not None else self.wait_s(min(waits, 8), None, rng)
        return max(0.0, min(w, self.max_limited_s - limited_s))
