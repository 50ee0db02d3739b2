"""A progress line for the long offline commands (`cache import`, `merge`; issue 44 item 7), on a terminal only:
``\\r`` N done at R a second, at most twice a second, and a newline at the end. Off a terminal (a log file, a
pipe, a test's captured stderr) it writes nothing, so scripts read only the final line."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

EVERY_S = 0.5


class TtyProgress:
    def __init__(self, what: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.on = self.stream.isatty()
        self.what = what  # e.g. "lines read", "records merged"
        self.clock = clock
        self.done = 0
        self.t0 = self.last = clock()
        self.shown = False

    def tick(self, n: int = 1) -> None:
        self.done += n
        if not self.on:
            return
        now = self.clock()
        if now - self.last >= EVERY_S:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            self.stream.write(f"\r{self.done:,} {self.what} ({rate:,.0f}/s)   ")
            self.stream.flush()
            self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False
