"""A worker plugin that leaks on purpose, for the memory-supervision tests:
``--worker-plugin tests/plugins/leak.py:retain``.

evalsup calls it inside the worker after each task as ``fn(task_obj, outcome)``. It keeps
``$EVALSUP_TEST_LEAK_KB`` KiB (default 2 MiB) per task in a module-level list that is never cleared, like a
cache that only grows. The bytes are written (not calloc'd zero pages), so they count in the worker's RSS,
and tracemalloc attributes them to the one line marked below, which the test looks for in the leak report.
"""

from __future__ import annotations

import os
from typing import Any

KEPT: list[bytes] = []
CHUNK = int(os.environ.get("EVALSUP_TEST_LEAK_KB", "2048")) * 1024


def retain(task: dict[str, Any], outcome: Any) -> None:
    KEPT.append(b"\x5a" * CHUNK)  # LEAK-SITE: the leak report must name this line
