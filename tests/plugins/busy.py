"""A worker plugin that makes the worker CPU-bound: ``--worker-plugin tests/plugins/busy.py:burn``.

Each task costs its worker 4 ms of CPU after the request (a stand-in for parsing a large response), so a
worker handling a few hundred results a second has no core to spare: the case automatic scaling is for.
"""

from __future__ import annotations

import time
from typing import Any


def burn(task: dict[str, Any], outcome: Any) -> None:
    end = time.thread_time() + 0.004  # CPU time, not wall time: a descheduled worker still has to do it
    while time.thread_time() < end:
        pass
