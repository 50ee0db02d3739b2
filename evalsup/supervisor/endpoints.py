"""Many endpoints (issue 21 item 1): one ``EndpointBreaker`` per endpoint, and the run's view of them all.

An endpoint whose breaker opens is ejected: the workers send it nothing, and it is probed on its own until a
probe succeeds, when it rejoins. The run pauses dispatch only while every endpoint is down (``open``), when
each is probed at least every 5 s (``breaker.PAUSED_PROBE_S``: the run is waiting on them), and
``--max-wait-down`` counts from the moment the last one went down. An endpoint that failed the connection
check, or that refuses the API key while others take it, is left out of the run (never probed, never
rejoins). With one endpoint this is exactly the single breaker it was: open, probe, close, give up.

No I/O and no clock: the supervisor passes the time in and carries out what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from evalsup.supervisor.breaker import EndpointBreaker
from evalsup.tasks.requests import public_url

MANY_MAX_PROBE_S = 5.0  # the longest gap between probes of an ejected endpoint while others serve


class Endpoints:
    def __init__(self, urls: Sequence[str], max_down_s: float, first_probe_s: float = 1.0,
                 max_probe_s: float = 30.0) -> None:
        self.urls = [public_url(u) for u in urls]  # as logs and the summary show them: no credentials
        # each endpoint's own breaker never gives up: only every endpoint down for --max-wait-down stops the run.
        # With several, an ejected one is probed at least every 5 s: it is capacity the run is missing, and a
        # probe is one tiny request (measured: back 6 s after its restart with 30 s, docs/benchmarks.md)
        top = max_probe_s if len(urls) == 1 else min(max_probe_s, MANY_MAX_PROBE_S)
        self.breakers = [EndpointBreaker(first_probe_s, top, math.inf) for _ in urls]
        self.left_out: dict[int, str] = {}  # endpoints that failed the connection check or refused the key, and why
        self.max_down_s = max_down_s
        # the run's view: every endpoint down, dispatch paused
        self.open = False
        self.reason = ""
        self.opened = 0
        self.opened_at = 0.0
        self.down_s = 0.0

    @property
    def many(self) -> bool:
        return len(self.urls) > 1

    def name(self, i: int) -> str:
        """How messages name endpoint ``i``: "endpoint" alone when there is one."""
        return f"endpoint {i} ({self.urls[i]})" if self.many else "endpoint"

    def live(self) -> list[int]:
        return [i for i in range(len(self.urls)) if i not in self.left_out]

    def up(self) -> list[int]:
        return [i for i in self.live() if not self.breakers[i].open]

    def leave_out(self, i: int, why: str, now: float) -> None:
        """Endpoint ``i`` failed the connection check, or refused the key: the run goes on without it (when the
        others left are all ejected just now, the run waits for one of them as for any outage)."""
        self.left_out[i] = why
        live = self.live()
        if live and not self.up() and not self.open:
            self.open, self.reason, self.opened_at = True, self.breakers[live[0]].reason, now
            self.opened += 1

    def trip(self, i: int, now: float, reason: str) -> bool:
        """A worker saw endpoint ``i`` fail as a whole; True when this ejects it (then ``open`` says whether
        every endpoint is now down)."""
        if i in self.left_out or not 0 <= i < len(self.breakers) or not self.breakers[i].trip(now, reason):
            return False
        if not self.up() and not self.open:
            self.open, self.reason, self.opened_at = True, reason, now
            self.opened += 1
            self._hurry()
        return True

    def _hurry(self) -> None:
        """Every endpoint is down: the run waits on them, so none waits longer than PAUSED_PROBE_S for a probe."""
        for i in self.live():
            self.breakers[i].hurry()

    def probe_result(self, i: int, ok: bool, now: float) -> bool:
        """True when this closes endpoint ``i``'s breaker: it rejoins (and the run resumes if it was down)."""
        if i in self.left_out or not 0 <= i < len(self.breakers) or \
                not self.breakers[i].probe_result(ok, now, paused=self.open):
            return False  # (a left-out one's late answer changes nothing)
        if self.open:
            self.open = False
            self.down_s += now - self.opened_at
        return True

    def probes_due(self, now: float) -> list[int]:
        return [i for i in self.live() if self.breakers[i].probe_due(now)]

    def probe_sent(self, i: int, now: float) -> None:
        self.breakers[i].probe_sent(now)

    def down_too_long(self, now: float) -> bool:
        return self.open and now - self.opened_at > self.max_down_s

    def total_down_s(self, now: float) -> float:
        """Time every endpoint was down at once (the run paused for it)."""
        return self.down_s + (now - self.opened_at if self.open else 0.0)

    def open_frames(self) -> list[dict[str, Any]]:
        """The BREAKER_OPEN payloads a new worker needs: endpoints left out, and those ejected now."""
        return [{"e": i, "out": True} if i in self.left_out else {"e": i}
                for i, b in enumerate(self.breakers) if i in self.left_out or b.open]

    def summary(self, now: float, results: dict[int, int]) -> list[dict[str, Any]]:
        """Per endpoint: its URL, the results it served this session, how often it was ejected and for how long."""
        return [{"index": i, "url": u, "results": results.get(i, 0), "ejected": self.breakers[i].opened,
                 "down_s": round(self.breakers[i].total_down_s(now), 2),
                 **({"left_out": self.left_out[i]} if i in self.left_out else {})}
                for i, u in enumerate(self.urls)]
