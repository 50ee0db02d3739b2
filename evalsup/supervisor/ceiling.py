"""A run's ceiling on requests in flight, changed while it runs: ``RUN_DIR/concurrency``.

The file holds one integer (whoever sets it writes it atomically: a temporary file, then a rename). The arbiter
asks ``Ceiling.poll`` at every memory-monitor tick and applies the answer: each worker's LIMIT is its share of the
lower of the memory control's cap and this ceiling (``Supervisor._worker_cap``), and in adaptive mode each
worker's adaptive limit then adapts within it. ``evalsup serve`` writes it to share one upstream between the
batches it runs; a person may write it by hand (``echo 16 > RUN_DIR/concurrency.tmp && mv ...``).

Invariants:
- ``value`` is always in [1, maximum] (``maximum``: the run's --concurrency); with no file it is ``maximum``.
- The file is read again only when its identity (inode, size, mtime) changes: one ``stat`` a tick otherwise.
- A value that is not an integer changes nothing and is said once (one line, until the file changes again); an
  integer outside [1, maximum] is clamped into it; a removed file sets the ceiling back to ``maximum``.
- ``poll`` returns the line to log when the ceiling changed or the file holds a bad value, else None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

MAX_BYTES = 64  # one integer and a newline: a larger file is not one


def parse(text: str, maximum: int) -> int | None:
    """The ceiling a file's text sets (clamped into [1, maximum]), or None when it is not one integer."""
    s = text.strip()
    if not s or len(s) > 20 or not s.lstrip("+-").isdigit():
        return None
    return max(1, min(maximum, int(s)))


@dataclass
class Ceiling:
    path: Path
    maximum: int  # the run's --concurrency: the ceiling never goes above it
    value: int = 0  # the ceiling now (set to maximum at construction)
    from_file: bool = False  # the value was set by the file (memory.jsonl and status show it then)
    _seen: tuple[int, int, int] | None = field(default=None, repr=False)  # (inode, size, mtime_ns) last read

    def __post_init__(self) -> None:
        self.value = self.maximum

    @property
    def shown(self) -> int | None:
        """The ceiling for memory.jsonl and status: None when no file sets it."""
        return self.value if self.from_file else None

    def poll(self) -> str | None:
        """Look at the file (stat; read when it changed); the line to log, or None when nothing changed."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._seen is None:
                return None
            self._seen = None
            return self._set(self.maximum, False, f"concurrency ceiling {self.maximum} ({self.path} removed: "
                                                  "back to --concurrency)")
        except OSError as e:
            return self._unreadable((-1, -1, -1), e.strerror or str(e))
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        if ident == self._seen:
            return None
        self._seen = ident
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except OSError as e:
            return self._unreadable(ident, e.strerror or str(e))
        got = parse(raw.decode("utf-8", "replace"), self.maximum) if len(raw) <= MAX_BYTES else None
        if got is None:
            shown = raw[:20].decode("utf-8", "replace").strip()
            return (f"concurrency ceiling: {self.path} holds {shown!r}, not an integer; ignored (the ceiling stays "
                    f"{self.value})")
        clamped = "" if got == _int(raw) else f", clamped into 1..{self.maximum}"
        return self._set(got, True, f"concurrency ceiling {got} ({self.path}{clamped})")

    def _unreadable(self, ident: tuple[int, int, int], why: str) -> str | None:
        """Said once while the file stays as it is (a stat that fails: said once until it succeeds)."""
        if self._seen == ident and ident == (-1, -1, -1):
            return None
        self._seen = ident
        return f"concurrency ceiling: cannot read {self.path} ({why}); ignored (the ceiling stays {self.value})"

    def _set(self, value: int, from_file: bool, note: str) -> str | None:
        changed = value != self.value
        self.value, self.from_file = value, from_file
        return note if changed else None


def _int(raw: bytes) -> int | None:
    try:
        return int(raw.strip())
    except ValueError:
        return None
