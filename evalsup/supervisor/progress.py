"""What a person watching the run sees: a live display on a terminal, a plain line every --log-interval off one.

The total is counted by a background thread (newlines in the task file, divided by the shard count) so the
run starts at once; until it is known, the bar shows what is done.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

MIB = 1 << 20


class LineCounter(threading.Thread):
    def __init__(self, path: Path, shards: int) -> None:
        super().__init__(daemon=True, name="evalsup-count-lines")
        self.path = path
        self.shards = shards
        self.total: int | None = None

    def run(self) -> None:
        n = 0
        last = b"\n"
        try:
            with open(self.path, "rb") as f:
                while chunk := f.read(1 << 22):
                    n += chunk.count(b"\n")
                    last = chunk[-1:]
        except OSError:
            return
        if last != b"\n":
            n += 1
        self.total = -(-n // self.shards) if self.shards > 1 else n


def fmt_duration(seconds: float) -> str:
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _limit(s: dict[str, Any]) -> str:
    """Issue 21: the requests the workers may have in flight now (adaptive or --concurrency)."""
    return f" (limit {s['conc_limit']})" if s.get("conc_limit") else ""


def fmt_snapshot_plain(s: dict[str, Any]) -> str:
    total = s["total"]
    pct = f" ({100 * s['done'] / total:.1f}%)" if total else ""
    eta = f", ETA {fmt_duration(s['eta_s'])}" if s.get("eta_s") is not None else ""
    mem = ""
    if s.get("cgroup_mb") is not None:
        lim = f"/{s['limit_mb']:,.0f}" if s.get("limit_mb") else ""
        mem = f", memory {s['cgroup_mb']:,.0f}{lim} MiB"
    return (f"{s['state']}: {s['done']:,}/{total if total is not None else '?'}{pct} done, {s['rate']:.1f} req/s{eta}, "
            f"{s['inflight']} in flight{_limit(s)}, {s['failed']:,} failed, {s['retries']:,} retries, "
            f"workers {' '.join(f'{r:.0f}' for r in s['workers_mb'])} MiB{mem}")


class LiveDisplay:
    """The terminal display (rich): a bar with rate and ETA, and a line of health figures."""

    def __init__(self, console: Console) -> None:
        # rich is imported here, for a terminal: --quiet and --json runs (and the workers' start) skip its ~20 ms
        from rich.console import Group
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        self._group, self._text = Group, Text
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                 console=console, auto_refresh=False)
        self.task = self.progress.add_task("running", total=None, rate="")
        self.health = Text("")
        self.live = Live(Group(self.progress, self.health), console=console, refresh_per_second=4, transient=False)

    def start(self) -> None:
        self.live.start()

    def update(self, s: dict[str, Any]) -> None:
        self.progress.update(self.task, completed=s["done"], total=s["total"], description=s["state"],
                             rate=f"{s['rate']:.1f} req/s")
        mem = ""
        if s.get("cgroup_mb") is not None:
            lim = f" / {s['limit_mb']:,.0f}" if s.get("limit_mb") else ""
            mem = f"   memory {s['cgroup_mb']:,.0f}{lim} MiB"
        self.health = self._text(f"in flight {s['inflight']}{_limit(s)}   failed {s['failed']:,}   "
                                 f"retries {s['retries']:,}   "
                                 f"workers {' '.join(f'{r:.0f}' for r in s['workers_mb'])} MiB{mem}")
        self.live.update(self._group(self.progress, self.health), refresh=True)

    def stop(self) -> None:
        self.live.stop()
