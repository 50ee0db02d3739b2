"""When a line about a state is worth a person's attention: once when the state changes, and while it holds,
at most once every ``every_s`` (a minute) with how many times it held again since the last line ("still down
for 2m10s, 14 probes"), never every probe.

A key is what the state is of (an endpoint, the false alarms of an endpoint, the workers' recycles); a state is
any string. ``note`` is told each time something happens and answers whether to say it now. No I/O and no clock
of its own: the time is passed in, the arbiter writes the line (and events.jsonl keeps every occurrence: this
decides only what a person reads).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from evalsup.common.timescale import scaled

__all__ = ["LogGate", "Say"]

REPEAT_EVERY_S = 60.0


@dataclass(frozen=True)
class Say:
    """Say it now. ``changed``: the state is new for its key (the line says what changed); else it is a
    repeat: it held ``times`` times since the key's last line at ``last`` (this time included), and the key
    has been in this state since ``since``."""

    changed: bool
    times: int
    since: float
    last: float


@dataclass
class _Key:
    state: str
    since: float  # when the key entered its state
    said_at: float  # the key's last line
    held: int = 0  # occurrences not said since that line


class LogGate:
    def __init__(self, every_s: float = REPEAT_EVERY_S) -> None:
        self.every_s = scaled(every_s)  # (scaled only by the integration tests' hook, common/timescale.py)
        self._keys: dict[Hashable, _Key] = {}

    def state(self, key: Hashable) -> str | None:
        """The state last noted for ``key`` (None before any)."""
        k = self._keys.get(key)
        return None if k is None else k.state

    def note(self, key: Hashable, state: str, now: float) -> Say | None:
        """``key`` is in ``state`` (again): a ``Say`` when a line is due, else None (counted for the next)."""
        k = self._keys.get(key)
        if k is None or k.state != state:
            self._keys[key] = _Key(state, now, now)
            return Say(True, 1, now, now)
        k.held += 1
        if now - k.said_at < self.every_s:
            return None
        say = Say(False, k.held, k.since, k.said_at)
        k.held, k.said_at = 0, now
        return say

    def forget(self, key: Hashable) -> None:
        """Start ``key`` over: its next note is a change."""
        self._keys.pop(key, None)
