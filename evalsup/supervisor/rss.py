"""Per-process resident set size, cheap enough to poll 16 workers every 0.5 s.

On Linux this is one small read of ``/proc/<pid>/statm`` per process (resident pages times the page
size, the same figure as ``ps``/psutil's ``rss``); elsewhere psutil is used.

Caveat: RSS counts shared pages (the interpreter's copy-on-write pages after fork, shared libraries) in
every process that maps them, so :func:`tree_rss_bytes` over-states what the processes cost together.
It is the right figure for "which worker is big"; the container's working set (see ``cgroup.py``) is the
right figure for "how close are we to the limit".
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["PAGE_SIZE", "own_rss_bytes", "rss_bytes", "shmem_bytes", "tree_rss_bytes"]

PAGE_SIZE: int = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROC_STATM = os.path.exists("/proc/self/statm")


def _read_proc(pid: int, name: str, size: int) -> bytes | None:
    """Up to ``size`` bytes of ``/proc/<pid>/<name>`` in one read; None when the process is gone (or unreadable)."""
    try:
        fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def _statm_rss(pid: int) -> int | None:
    data = _read_proc(pid, "statm", 256)
    fields = data.split() if data is not None else []
    if len(fields) < 2:
        return None
    try:
        return int(fields[1]) * PAGE_SIZE
    except ValueError:
        return None


def _psutil_rss(pid: int) -> int | None:
    import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs; only where /proc is missing

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes; ``None`` when the process is gone (or cannot be read).

    A zombie (exited, not yet reaped) reads as 0.
    """
    if pid <= 0:
        return None
    if _PROC_STATM:
        return _statm_rss(pid)
    return _psutil_rss(pid)


def shmem_bytes(pid: int) -> int | None:
    """``RssShmem`` of ``pid`` from ``/proc/<pid>/status``, in bytes (None: not found or unreadable): a worker's
    resident pages of the results ring it shares with the supervisor."""
    data = _read_proc(pid, "status", 1 << 14)  # (RssShmem comes after Groups:, which many groups make long)
    at = -1 if data is None else data.find(b"\nRssShmem:")
    if data is None or at < 0:
        return None
    fields = data[at + 10 : data.find(b"\n", at + 10)].split()
    try:
        return int(fields[0]) * 1024  # in kB
    except (IndexError, ValueError):
        return None


def own_rss_bytes(pid: int) -> int | None:
    """A worker's resident memory less its shared-memory pages (``RssShmem``): those are its results ring
    (``ipc.ring``), which the worker writes through a mapping of its own and which the supervisor's RSS counts
    already. The figure a worker is recycled by: what it holds itself. ``None`` when the process is gone."""
    rss = rss_bytes(pid)
    if rss is None or not _PROC_STATM:
        return rss
    shmem = shmem_bytes(pid)
    return rss if shmem is None else max(0, rss - shmem)


def tree_rss_bytes(pids: Iterable[int]) -> int:
    """Sum of :func:`rss_bytes` over ``pids``; processes that are gone count as 0."""
    total = 0
    for pid in pids:
        rss = rss_bytes(pid)
        if rss is not None:
            total += rss
    return total
