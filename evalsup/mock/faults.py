"""Fault decisions: per-request `mock` overrides and the server's seeded random faults."""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
from dataclasses import dataclass
from typing import Any

from evalsup.mock.config import MockConfig


class Fault(enum.Enum):
    NONE = "none"
    RESET = "reset"
    ERROR_500 = "500"
    ERROR_429 = "429"
    MALFORMED = "malformed"
    CUT_STREAM = "cut_stream"


@dataclass(frozen=True)
class Override:
    """The request body's optional "mock" object: behaviour for this request only."""

    status: int | None = None
    delay_s: float | None = None
    text: str | None = None
    reset: bool = False
    malformed: bool = False
    kb: float | None = None
    cut_stream: bool = False
    retry_after: float | None = None
    refusal: str | None = None  # chat: answer with this refusal instead of content
    in_stream: bool = False  # a 5xx status on a streamed request comes as an error event inside a 200 stream
    hang: bool = False  # no answer at all: the request is held until the client goes (a stalled server slot)
    times: int | None = None  # the faults above apply to the first `times` attempts of this exact request only

    @property
    def has_fault(self) -> bool:
        return self.status is not None or self.reset or self.malformed or self.cut_stream or self.hang

    def without_faults(self) -> Override:
        """The same override with its faults spent (delay, text, kb still apply)."""
        return dataclasses.replace(self, status=None, reset=False, hang=False, malformed=False, cut_stream=False,
                                   times=None, in_stream=False)


NO_OVERRIDE = Override()
MAX_TRACKED_REQUESTS = 100_000


class AttemptCounter:
    """How many times each request carrying mock.times was seen, keyed by a digest of its whole body.

    Bounded: the least recently seen requests are forgotten past MAX_TRACKED_REQUESTS."""

    def __init__(self, limit: int = MAX_TRACKED_REQUESTS) -> None:
        self._seen: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._limit = limit

    def attempt(self, key: bytes) -> int:
        """Count one more attempt of this request and return its number (1 for the first)."""
        n = self._seen.pop(key, 0) + 1
        self._seen[key] = n
        if len(self._seen) > self._limit:
            self._seen.popitem(last=False)
        return n

    def clear(self) -> None:
        self._seen.clear()


def _number(obj: dict[str, Any], name: str) -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"mock.{name} must be a non-negative number")
    return float(value)


def _flag(obj: dict[str, Any], name: str) -> bool:
    value = obj.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"mock.{name} must be a boolean")
    return value


def parse_override(value: Any) -> Override:
    """Parse the "mock" field of a request body. Raises ValueError on a malformed object."""
    if value is None:
        return NO_OVERRIDE
    if not isinstance(value, dict):
        raise ValueError("mock must be an object")
    status = value.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599):
        raise ValueError("mock.status must be an HTTP status code")
    text = value.get("text")
    if text is not None and not isinstance(text, str):
        raise ValueError("mock.text must be a string")
    refusal = value.get("refusal")
    if refusal is not None and not isinstance(refusal, str):
        raise ValueError("mock.refusal must be a string")
    times = value.get("times")
    if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 0):
        raise ValueError("mock.times must be a non-negative integer")
    return Override(
        times=times,
        status=status,
        delay_s=_number(value, "delay_s"),
        text=text,
        refusal=refusal,
        in_stream=_flag(value, "in_stream"),
        reset=_flag(value, "reset"),
        malformed=_flag(value, "malformed"),
        kb=_number(value, "kb"),
        cut_stream=_flag(value, "cut_stream"),
        hang=_flag(value, "hang"),
        retry_after=_number(value, "retry_after"),
    )


class FaultInjector:
    """Owns the seeded RNGs. One fault draw per generation request, in arrival order.

    A single uniform draw is split into bands (reset, 500, 429, malformed, cut stream), so the sequence of
    draws does not depend on which knobs are set. Latency jitter uses its own RNG so it never shifts the fault sequence.
    """

    def __init__(self, seed: int) -> None:
        self.reseed(seed)

    def reseed(self, seed: int) -> None:
        self._faults = random.Random(seed)
        self._jitter = random.Random(f"jitter|{seed}")
        self._requests = 0  # generation requests seen with a slow share set (the slow ones are evenly spaced)

    def draw(self) -> float:
        return self._faults.random()

    @staticmethod
    def fault_for(cfg: MockConfig, u: float) -> Fault:
        edge = cfg.reset
        if u < edge:
            return Fault.RESET
        edge += cfg.fail_500
        if u < edge:
            return Fault.ERROR_500
        edge += cfg.fail_429
        if u < edge:
            return Fault.ERROR_429
        edge += cfg.malformed
        if u < edge:
            return Fault.MALFORMED
        edge += cfg.cut_stream
        if u < edge:
            return Fault.CUT_STREAM
        return Fault.NONE

    def slow_s(self, cfg: MockConfig) -> float | None:
        """This request's latency when it is one of ``cfg.slow`` (exactly that share of requests, evenly spaced
        in arrival order); else None."""
        if cfg.slow <= 0:
            return None
        self._requests += 1
        n = self._requests
        return cfg.slow_ms / 1000.0 if int(n * cfg.slow) > int((n - 1) * cfg.slow) else None

    def latency_s(self, cfg: MockConfig) -> float:
        ms = cfg.latency_ms
        if cfg.jitter_ms > 0:
            ms += self._jitter.uniform(-cfg.jitter_ms, cfg.jitter_ms)
        return max(0.0, ms) / 1000.0
