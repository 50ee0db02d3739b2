"""The circuit breaker's policy: when the endpoint is down, wait and probe instead of failing tasks.

A worker trips it on evidence that the endpoint as a whole fails (worker.breaker.LocalBreaker); the first
probe (a request of the worker's own, GET /models) goes at once, and later ones at growing intervals: 1, 2,
4 ... ``max_probe_s`` while other endpoints serve, but never more than ``paused_probe_s`` (5 s) apart while the
whole run waits for the endpoints to come back (a probe is one tiny request; the run's time is what is lost).
It closes on a good probe, saying whether the endpoint had been down (some probe failed): if not, the trip was a
false alarm (tasks failing for themselves) and the attempts parked meanwhile count against their tasks.

No I/O and no clock reads: the supervisor passes the time in and carries out the decisions (pause
dispatch, broadcast open/close, send a probe).
"""

from __future__ import annotations

from evalsup.common.timescale import scaled

# The longest gap between probes while the whole run is paused for the endpoints: recovery is noticed within
# about this long (measured: the only endpoint down for 25 s was seen back after 32.9 s with probes backing off
# to 30 s; docs/benchmarks.md has the figures with this cap).
PAUSED_PROBE_S = 5.0


class EndpointBreaker:
    def __init__(self, first_probe_s: float = 1.0, max_probe_s: float = 30.0, max_down_s: float = 600.0,
                 paused_probe_s: float = PAUSED_PROBE_S) -> None:
        # (scaled only by the integration tests' hook, common/timescale.py)
        self.first_probe_s, self.max_probe_s = scaled(first_probe_s), scaled(max_probe_s)
        self.paused_probe_s = scaled(paused_probe_s)
        self.max_down_s = max_down_s
        self.open = False
        self.reason = ""
        self.opened_at = 0.0
        self.next_probe_at = 0.0
        self.interval = self.first_probe_s
        self.probe_out = False  # a probe was sent and has not answered
        self.probe_sent_at = 0.0
        self.answered_at = 0.0  # the last probe's answer (or the opening, before any)
        self.probes_failed = 0  # in this opening
        self.opened = 0  # how many times it opened
        self.down_s = 0.0  # total time open (closed episodes)
        self.was_down = False  # in this opening, a probe failed: the endpoint was down, not just some tasks
        self.false_alarms = 0  # openings closed by their first probe

    def trip(self, now: float, reason: str) -> bool:
        """A worker saw most attempts fail endpoint-side; True when this opens the breaker."""
        if self.open:
            return False
        self.open = True
        self.reason = reason
        self.opened_at = now
        self.interval = self.first_probe_s
        self.next_probe_at = now  # check at once: a false alarm must cost the tasks as little as possible
        self.probe_out = False
        self.answered_at = now
        self.was_down = False
        self.probes_failed = 0
        self.opened += 1
        return True

    def probe_due(self, now: float) -> bool:
        if not self.open:
            return False
        if self.probe_out and now - self.probe_sent_at > max(30.0, self.interval * 2):
            self.probe_out = False  # the probe was lost (its worker died): send another
        return not self.probe_out and now >= self.next_probe_at

    def probe_sent(self, now: float) -> None:
        self.probe_out = True
        self.probe_sent_at = now

    def probe_result(self, ok: bool, now: float, paused: bool = False) -> bool:
        """True when this closes the breaker. ``paused``: the whole run is waiting (every endpoint down), so
        the next probe goes within ``paused_probe_s`` however long the back-off has grown."""
        self.probe_out = False
        if not self.open:
            return False
        self.answered_at = now
        if ok:
            self.open = False
            self.down_s += now - self.opened_at
            if not self.was_down:
                self.false_alarms += 1
            return True
        self.was_down = True
        self.probes_failed += 1
        self.next_probe_at = now + (min(self.interval, self.paused_probe_s) if paused else self.interval)
        self.interval = min(self.max_probe_s, self.interval * 2)
        return False

    def hurry(self) -> None:
        """The whole run is paused now: a probe already scheduled further out goes within ``paused_probe_s``
        of the last answer."""
        if self.open:
            self.next_probe_at = min(self.next_probe_at, self.answered_at + self.paused_probe_s)

    def down_too_long(self, now: float) -> bool:
        return self.open and now - self.opened_at > self.max_down_s

    def total_down_s(self, now: float) -> float:
        return self.down_s + (now - self.opened_at if self.open else 0.0)
