"""A worker plugin for the metrics test: ``--worker-plugin tests/plugins/obs_slow_exit.py:noop``.

Loading it makes the worker's final ``os._exit`` wait ``$EVALSUP_TEST_EXIT_DELAY_S`` seconds (default 1.5).
The supervisor waits for its workers before it exits, so /metrics keeps serving the run's final counts for
that long, and a test can scrape them without racing the end of the run.
"""

from __future__ import annotations

import os
import time
from typing import Any, NoReturn

DELAY_S = float(os.environ.get("EVALSUP_TEST_EXIT_DELAY_S", "1.5"))
_real_exit = os._exit


def _slow_exit(code: int) -> NoReturn:
    time.sleep(DELAY_S)
    _real_exit(code)


os._exit = _slow_exit


def noop(task: dict[str, Any], outcome: Any) -> None:
    pass
