"""A test hook, never set in production: ``$EVALSUP_TEST_TIME_SCALE`` (a number above 0, default 1) scales the
periods of the outage timers, so that the integration tests of an outage wait seconds, not minutes (issue 44).

Read by the endpoints' breakers (the probe intervals and their caps, supervisor/breaker.py) and the log gate's
repeat (supervisor/log_gate.py) only; a user's setting (--max-wait-down, --stall-after, timeouts) is never
scaled. 0.2 makes the probes 0.2, 0.4, 0.8... s apart, at most 1 s apart while the run is paused."""

from __future__ import annotations

import os

ENV = "EVALSUP_TEST_TIME_SCALE"


def _scale() -> float:
    try:
        x = float(os.environ.get(ENV, "1"))
    except ValueError:
        return 1.0
    return x if 0 < x <= 1 else 1.0


SCALE = _scale()


def scaled(seconds: float) -> float:
    """``seconds`` of one of the timers above, as this process runs them."""
    return seconds * SCALE
