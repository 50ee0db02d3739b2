"""events.jsonl: what happened to the run and when (throttle, recycle, restart, breaker), for the report."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.tasks.secrets import Scrubber


class EventLog:
    def __init__(self, path: Path, scrub: Scrubber | None = None) -> None:
        self._f: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - closed in close()
        self.scrub = scrub or Scrubber()  # the run's secrets, out of every line (a reason may quote an endpoint)

    def __call__(self, kind: str, **fields: Any) -> None:
        if self._f is None:
            return
        try:
            clean = self.scrub.json(fields)
            fields = clean if isinstance(clean, dict) else {}
            self._f.write(orjson.dumps({"t": round(time.time(), 3), "event": kind, **fields},
                                       option=orjson.OPT_APPEND_NEWLINE))
            self._f.flush()
        except OSError:
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = None


def write_leaks(run_dir: Path, pid: int, text: str) -> str:
    """A worker's top allocation sites (LEAKS frame) to leaks/worker-PID.txt; returns what to tell the user."""
    d = run_dir / "leaks"
    try:
        d.mkdir(exist_ok=True)
        (d / f"worker-{pid}.txt").write_text(text)
    except OSError as e:
        return f"cannot write leak report of worker {pid}: {e.strerror}"
    return f"worker {pid}: top allocation sites written to {d / f'worker-{pid}.txt'}"
