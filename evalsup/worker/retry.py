"""Retry policy: which outcomes may succeed later, and how long to wait before the next attempt."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


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


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter; a Retry-After from the server wins, capped at ``cap_s``."""

    max_attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 60.0

    def retryable(self, status: int | None) -> bool:
        """status None means the attempt got no HTTP answer (connection error, timeout, cut stream)."""
        return status is None or status in RETRY_STATUSES

    def should_retry(self, status: int | None, attempt: int) -> bool:
        return attempt < self.max_attempts and self.retryable(status)

    def wait_s(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        if retry_after is not None:
            return min(self.cap_s, retry_after)
        return rng.uniform(0.0, min(self.cap_s, self.base_s * (2 ** (attempt - 1))))
