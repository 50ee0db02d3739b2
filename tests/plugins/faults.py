"""Worker plugins for the crash-safety tests: ``--worker-plugin tests/plugins/faults.py:FUNCTION``.

evalsup calls the plugin inside the worker after each task's HTTP request as ``fn(task_obj, outcome)``,
where ``task_obj`` is the parsed task line. The tests mark the lines that should misbehave with a key of
their own (carried to the record's metadata, which is harmless).
"""

from __future__ import annotations

import os
import time
from typing import Any


def crash_marked(task: dict[str, Any], outcome: Any) -> None:
    """Kill the worker (no cleanup, like a segfault) on every task whose line has ``"crash": true``:
    a poison task."""
    if task.get("crash"):
        os._exit(1)


def raise_marked(task: dict[str, Any], outcome: Any) -> None:
    """Raise (a bug in user code, not a crash) on every task whose line has ``"raise": true``."""
    if task.get("raise"):
        raise RuntimeError("plugin bug")


def once(task: dict[str, Any], outcome: Any) -> None:
    """The first time any worker finishes a task whose line has ``"once": "crash"`` or ``"once": "hang"``,
    exit at once or block the worker (its event loop, so its heartbeats too). Later attempts of the same
    task go through. First-ness is a marker file made with O_EXCL in ``$EVALSUP_TEST_MARKS``."""
    act = task.get("once")
    if not act:
        return
    path = os.path.join(os.environ["EVALSUP_TEST_MARKS"], f"{task.get('id', task.get('custom_id'))}.{act}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    if act == "crash":
        os._exit(1)
    if act == "hang":
        time.sleep(600)  # the supervisor SIGKILLs us after --hang-timeout; the test kills leftovers by PID


def bad_ring_reference(task: dict[str, Any], outcome: Any) -> None:
    """The first time a task whose line has ``"bad_ring": true`` finishes, the worker's next result names a
    place in its shared-memory ring that it never wrote (a broken worker, as the supervisor must see it).
    First-ness is a marker file made with O_EXCL in ``$EVALSUP_TEST_MARKS``."""
    if not task.get("bad_ring"):
        return
    path = os.path.join(os.environ["EVALSUP_TEST_MARKS"], f"{task.get('id')}.ring")
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    from evalsup.ipc import ring

    real = ring.WorkerRing.put

    def put(self: Any, parts: Any) -> int | None:
        ring.WorkerRing.put = real  # type: ignore[method-assign]
        real(self, parts)
        return 1 << 40

    ring.WorkerRing.put = put  # type: ignore[method-assign]
