"""Retry policy: what to do after each attempt, and how long to wait before the next one."""

from __future__ import annotations

import email.utils
import enum
import random
import time
from dataclasses import dataclass

from evalsup.worker.errors import Failure, FailureKind


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


class Step(enum.Enum):
    DONE = "done"  # write the record: a success, or a failure that trying again will not mend
    RETRY = "retry"  # back off, then another attempt (this one counted against --max-attempts)
    WAIT = "wait"  # the server's flow control: wait as asked; this attempt is not counted
    GIVE_UP = "give_up"  # rate-limited past --max-rate-limited-wait: write a rate_limited record
    AUTH = "auth"  # the key was refused: hold the task for the supervisor to decide (stop resumably)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter; a Retry-After from the server wins, capped at ``cap_s``.

    ``max_attempts`` bounds the attempts a task may use up: attempts that failed for the task itself or for
    the endpoint. Waiting on a 429 (or a 503 with Retry-After) uses none, but the time a task may spend
    rate-limited is bounded by ``max_limited_s``."""

    max_attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 60.0
    max_limited_s: float = 1800.0

    def step(self, failure: Failure | None, used: int, limited_s: float) -> Step:
        """After an attempt: ``used`` attempts counted so far (this one included), ``limited_s`` seconds
        already spent waiting on the server's flow control."""
        if failure is None:
            return Step.DONE
        kind = failure.kind
        if kind is FailureKind.FLOW:
            return Step.WAIT if limited_s < self.max_limited_s else Step.GIVE_UP
        if kind is FailureKind.AUTH:
            return Step.AUTH
        if kind in (FailureKind.REQUEST, FailureKind.FINAL) or used >= self.max_attempts:
            return Step.DONE
        return Step.RETRY

    def wait_s(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(self.cap_s, retry_after)
        return rng.uniform(0.0, min(self.cap_s, self.base_s * (2 ** (attempt - 1))))

    def flow_wait_s(self, waits: int, retry_after: float | None, limited_s: float, rng: random.Random) -> float:
        """How long to wait on a 429: as asked (at most ``cap_s`` at a time), or backoff without a
        Retry-After; never past the rate-limited budget."""
        w = min(self.cap_s, retry_after) if retry_after is not None else self.wait_s(min(waits, 8), None, rng)
        return max(0.0, min(w, self.max_limited_s - limited_s))
