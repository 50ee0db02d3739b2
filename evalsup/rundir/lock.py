"""One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/evalsup.lock``, held for the writer's whole life.

The kernel drops the lock when its holder exits however it exits (kill -9 included), so a stale lock is never an
obstacle; on NFSv4 Linux maps ``flock`` to a byte-range lock that the server knows about. The descriptor is not
inherited by workers (close-on-exec), so only the supervisor holds it. The holder writes its host, PID and start
time into the file, for the one line a refused second run prints.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

LOCK_NAME = "evalsup.lock"
MOVED_ASIDE = ".old-"  # `run --fresh` renames RUN_DIR to RUN_DIR.old-TIME (see move_aside)


class RunDirBusy(Exception):
    """Another evalsup holds the run directory; the message names it."""


class RunDirError(Exception):
    """The run directory cannot be locked (cannot be created, read-only, no lock support)."""


def _info(fd: int) -> dict[str, Any]:
    """What the holder wrote into the lock file (host, pid, started, command); {} while it is just starting."""
    try:
        info = orjson.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, orjson.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def _describe(info: dict[str, Any]) -> str:
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["started"])))
        return f"host {info['host']}, PID {info['pid']}, started {started}"
    except (KeyError, TypeError, ValueError, OverflowError, OSError):
        return "its holder is just starting"


def _holder(fd: int) -> str:
    return _describe(_info(fd))


class RunDirLock:
    """``acquire()`` or raise RunDirBusy/RunDirError; ``release()`` (idempotent) lets go."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_NAME
        self.fd: int | None = None
        self.created_dir = False  # this lock made the run directory (see release(tidy=True))

    def acquire(self, create: bool = True, command: str = "run") -> None:
        if create and not self.run_dir.exists():
            try:
                self.run_dir.mkdir(parents=True)
                self.created_dir = True
            except FileExistsError:
                pass
            except OSError as e:
                raise RunDirError(f"cannot create run directory {self.run_dir}: {e.strerror}") from None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise RunDirError(f"cannot lock run directory {self.run_dir} ({self.path.name}): {e.strerror}") from None
        for attempt in range(5):  # a read-only probe (held_by) holds a shared lock for a moment: try again
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
                if busy and attempt < 4:
                    time.sleep(0.05)
                    continue
                holder = _holder(fd)
                os.close(fd)
                if busy:
                    raise RunDirBusy(f"{self.run_dir} is in use by another evalsup ({holder}); this {command} "
                                     "touched nothing. Wait for it to end or stop it, then rerun") from None
                raise RunDirError(f"cannot lock run directory {self.run_dir}: {e.strerror}") from None
        self.fd = fd
        info = {"host": socket.gethostname(), "pid": os.getpid(), "started": round(time.time(), 3),
                "command": command}
        try:  # only a courtesy for the refusal message: a failure to write it does not matter
            os.ftruncate(fd, 0)
            os.pwrite(fd, orjson.dumps(info) + b"\n", 0)
        except OSError:
            pass

    def release(self, tidy: bool = False) -> None:
        """Let go. With ``tidy``, a run directory this lock created and nothing else wrote in is removed again
        (a run refused by its endpoint check leaves no trace)."""
        if self.fd is None:
            return
        if tidy and self.created_dir:
            with contextlib.suppress(OSError):
                if [p.name for p in self.run_dir.iterdir()] == [LOCK_NAME]:
                    self.path.unlink()
                    self.run_dir.rmdir()
        os.close(self.fd)
        self.fd = None


def holder_info(run_dir: Path) -> dict[str, Any] | None:
    """What the holder of the run directory's lock wrote of itself (host, pid, started, command; {} while it
    is just starting), or None if nobody holds it. Read-only: it changes nothing in the directory. A lock this
    process holds through another descriptor counts as held (flock locks belong to the open file)."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _info(fd)
    else:
        return None
    finally:
        os.close(fd)  # drops the shared lock if it was taken


def held_by(run_dir: Path) -> str | None:
    """Who holds the run directory's lock ("host h, PID p, started t"), or None if nobody does. Read-only: it
    changes nothing in the directory (for `evalsup status`)."""
    info = holder_info(run_dir)
    return None if info is None else _describe(info)


@contextlib.contextmanager
def locked(run_dir: Path, create: bool = True, command: str = "run") -> Iterator[RunDirLock]:
    lock = RunDirLock(run_dir)
    lock.acquire(create, command)
    try:
        yield lock
    finally:
        lock.release()


def move_aside(run_dir: Path) -> Path | None:
    """``run --fresh``: rename RUN_DIR to RUN_DIR.old-TIME under its lock (RunDirBusy while a run holds it);
    None if there is no such directory."""
    if not run_dir.exists():
        return None
    with locked(run_dir, create=False, command="run --fresh"):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest = run_dir.with_name(moved_aside_name(run_dir.name, stamp))
        n = 1
        while dest.exists():
            n += 1
            dest = run_dir.with_name(moved_aside_name(run_dir.name, stamp, n))
        run_dir.rename(dest)
    return dest


def moved_aside_name(name: str, stamp: str, n: int = 1) -> str:
    """The name `run --fresh` gives a run directory it moves aside: NAME.old-STAMP (NAME.old-STAMP-N when taken)."""
    return f"{name}{MOVED_ASIDE}{stamp}" + (f"-{n}" if n > 1 else "")


@contextlib.contextmanager
def holding(run_dir: Path, command: str) -> Iterator[None]:
    """The run directory's lock for a step before the run takes it itself (the copy of a compressed, piped or
    generated input): that copy is never written while another evalsup reads the directory."""
    lock = RunDirLock(run_dir)
    lock.acquire(command=command)
    try:
        yield
    finally:
        lock.release()
