"""What a person watching the run sees: a live display on a terminal, a plain line every --log-interval off one.

The figures (`snapshot`) are the same for both and for ``--log-format json``:

- ``inflight``: requests on the wire, summed from the workers' heartbeats (what the endpoint counts);
  ``queued``: tasks handed to workers and not on the wire (waiting for a slot, a retry's back-off, the
  endpoint's return);
- ``rate``: results a second over a sliding window (RateWindow) whose first sample is the session's start, so
  the first line already has a rate and an ETA; time the run spent paused with every endpoint down is left
  out of it (``Endpoints.total_down_s``), so an outage neither collapses the rate nor blows up the ETA after
  it, and while paused the ETA says ``paused`` (``eta_s`` null, ``paused`` true);
- ``conc_limit``: the workers' concurrency limits summed, ``limit_why`` why it is low when it is (issue 41:
  ``latency 3.1x its baseline``, and the --concurrency that did better in this run);
  ``endpoints`` (several only): each one's state, limit
  and requests on the wire (``supervisor.limits``);
- ``total``: counted by a background thread (LineCounter: newlines in the task file, divided by the shard
  count) that keeps following the file as it grows, so the run starts at once and the total follows the file.
"""

from __future__ import annotations

import asyncio
import collections
import math
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson

from evalsup.common.states import EndpointState
from evalsup.common.text import fmt_duration
from evalsup.supervisor.limits import EndpointLoad, endpoint_loads, limit_reason, limit_total
from evalsup.supervisor.view import RunView

if TYPE_CHECKING:
    from rich.console import Console

MIB = 1 << 20
RATE_WINDOW_S = 30.0


class LineCounter(threading.Thread):
    """Counts the task file's lines, then every `poll_s` the lines appended since (a new, shorter file is
    counted again): `total` follows a file that grows while it is read."""

    def __init__(self, path: Path, shards: int, poll_s: float = 2.0) -> None:
        super().__init__(daemon=True, name="evalsup-count-lines")
        self.path = path
        self.shards = shards
        self.poll_s = poll_s
        self.total: int | None = None
        self._lines = 0  # complete lines before _pos
        self._pos = 0

    def count_once(self) -> None:
        """Count what was appended since the last call; sets `total`. A last line without its newline counts
        as a line, and is read again next time."""
        try:
            with open(self.path, "rb") as f:
                size = f.seek(0, 2)
                if size < self._pos:  # replaced or cut: start over
                    self._lines = self._pos = 0
                f.seek(self._pos)
                pos = self._pos
                while chunk := f.read(1 << 20):  # 1 MiB at a time: a larger read is more peak RSS, no faster
                    if (i := chunk.rfind(b"\n")) >= 0:
                        self._lines += chunk.count(b"\n")
                        self._pos = pos + i + 1
                    pos += len(chunk)
        except OSError:
            return
        n = self._lines + (1 if pos > self._pos else 0)
        self.total = -(-n // self.shards) if self.shards > 1 else n

    def run(self) -> None:
        while True:
            self.count_once()
            time.sleep(self.poll_s)


class RateWindow:
    """Results a second over the last `window_s` of running time, from samples (time, count, seconds paused so
    far) passed in; the first sample is the session's start, so a rate exists from the first second on. Paused
    seconds are taken off the clock: a window over an outage measures the running on either side of it, not
    the wait. No clock of its own."""

    def __init__(self, t0: float, window_s: float = RATE_WINDOW_S, count0: int = 0) -> None:
        self.window_s = window_s
        self.samples: collections.deque[tuple[float, int]] = collections.deque([(t0, count0)])

    def rate(self, now: float, count: int, paused_s: float = 0.0) -> float:
        """Add the sample (now, count), ``paused_s`` being the session's seconds paused so far, and return the
        rate over the window of running time that ends there."""
        s = self.samples
        now -= paused_s  # running time
        s.append((now, count))
        while len(s) > 2 and now - s[1][0] >= self.window_s:
            s.popleft()  # keep one sample at or before the window's start
        t0, c0 = s[0]
        return (count - c0) / (now - t0) if now - t0 > 0.05 else 0.0


def snapshot(run: RunView, now: float) -> dict[str, Any]:
    """The figures of a run (``Supervisor.view``) at monotonic time `now`."""
    st = run.stats
    paused = run.endpoints.open  # every endpoint down: the run waits, and that wait is no measure of its pace
    rate = run.rate.rate(now, st.session_done, run.endpoints.total_down_s(now))
    outstanding = run.in_flight
    total = run.total
    if total is not None:
        total = max(total, st.done + st.invalid + outstanding)  # never "4000/3000"
    left = None if total is None else max(0, total - st.done - st.invalid)
    mem = run.memory
    wire = sum(w.wire for w in run.workers if w.alive)
    return {
        "state": run.state, "done": st.done, "total": total, "failed": st.failed, "invalid": st.invalid,
        "retries": st.retries, "rate": rate, "paused": paused,
        "eta_s": None if paused and left else
        left / rate if left is not None and rate > 0 else (0.0 if left == 0 else None),
        "inflight": wire, "queued": max(0, outstanding - wire),
        "workers_mb": [w.rss / MIB for w in run.workers if w.alive],
        "cgroup_mb": mem.last_ws / MIB if mem is not None and mem.last_ws else None,
        "limit_mb": mem.limit / MIB if mem is not None and mem.limit else None,
        "conc_limit": limit_total(run.workers),  # the requests the workers may have in flight now (issue 21)
        "limit_why": limit_reason(run.workers),  # why it is low, when it is (issue 41)
        # with several endpoints, each one's state, limit and requests on the wire
        "endpoints": endpoint_loads(run.workers, run.endpoints) if run.endpoints.many else None,
        "budget": run.budget,  # issue 30: with a cap, spent / reserved / projected (supervisor.budget)
        # --cache (issue 30): answers from it and requests sent, this session
        "cache": None if run.cache is None else {"hits": st.cache_hits, "misses": st.cache_misses},
    }


def _eta(s: dict[str, Any]) -> str:
    if s.get("eta_s") is not None:
        return f"ETA {fmt_duration(math.ceil(s['eta_s']))}"
    return "ETA paused" if s.get("paused") else "ETA ?"


def _health(s: dict[str, Any], sep: str) -> list[str]:
    limit = f" (limit {s['conc_limit']})" if s.get("conc_limit") else ""  # adaptive or --concurrency (issue 21)
    if limit and s.get("limit_why"):  # a low adaptive limit says why (issue 41)
        limit = f" (limit {s['conc_limit']}: {s['limit_why']})"
    parts = [f"{s['inflight']} in flight{limit}"]
    if s.get("endpoints"):
        parts.append(fmt_endpoints(s["endpoints"]))
    parts += [f"{s.get('queued', 0)} queued in workers", f"{s['failed']:,} failed"]
    if s.get("invalid"):
        parts.append(f"{s['invalid']:,} invalid")
    if s.get("budget"):
        parts.append(fmt_budget(s["budget"]))
    if s.get("cache") is not None:
        parts.append(f"cache {s['cache']['hits']:,} hits")
    parts += [f"{s['retries']:,} retries", f"workers {' '.join(f'{r:.0f}' for r in s['workers_mb'])} MiB"]
    if s.get("cgroup_mb") is not None:
        lim = f"{sep}{s['limit_mb']:,.0f}" if s.get("limit_mb") else ""
        parts.append(f"memory {s['cgroup_mb']:,.0f}{lim} MiB")
    return parts


def fmt_budget(b: dict[str, Any]) -> str:
    """`spent $1.20/$5.00 (reserved $0.30, projected $4.10)`, or the same in tokens for a token cap alone."""
    caps, spent, res, proj = b["caps"], b["spent"], b["reserved"], b.get("projected")
    if caps.get("cost") is not None:
        out = f"spent ${spent['cost_usd']:,.2f}/${caps['cost']:,.2f} (reserved ${res['cost_usd']:,.2f}"
        return out + (f", projected ${proj['cost_usd']:,.2f})" if proj else ")")
    kind = "completion_tokens" if caps.get("completion_tokens") is not None else "total_tokens"
    cap = caps[kind]

    def tok(x: dict[str, Any]) -> int:
        c = int(x["completion_tokens"])
        return c if kind == "completion_tokens" else c + int(x["prompt_tokens"])
    out = f"spent {tok(spent):,}/{cap:,} tokens (reserved {tok(res):,}"
    return out + (f", projected {tok(proj):,})" if proj else ")")


def short_names(urls: list[str]) -> list[str]:
    """How the progress line names endpoints: host:port where that tells them apart, else the whole URL."""
    hosts = [urlsplit(u).netloc for u in urls]
    return hosts if len(set(hosts)) == len(hosts) else list(urls)


def fmt_endpoints(loads: list[EndpointLoad]) -> str:
    """`endpoints: a:8000 12/40, b:8000 down, c:8000 15/48` (requests on the wire / limit, or the state)."""
    names = short_names([e["url"] for e in loads])
    return "endpoints: " + ", ".join(f"{n} {e['in_flight']}/{e['limit']}" if e["state"] == EndpointState.UP
                                     else f"{n} {e['state']}"
                                     for n, e in zip(names, loads, strict=True))


def fmt_snapshot_plain(s: dict[str, Any]) -> str:
    """One log line: `running: 120/300 (40.0%) done, 55.1 req/s, ETA 3s, 8 in flight, ...`."""
    total = s["total"]
    pct = f" ({100 * s['done'] / total:.1f}%)" if total else ""
    return (f"{s['state']}: {s['done']:,}/{total if total is not None else '?'}{pct} done, {s['rate']:.1f} req/s, "
            f"{_eta(s)}, " + ", ".join(_health(s, "/")))


class LiveDisplay:
    """The terminal display (rich): a bar with rate and a labelled ETA, and a line of health figures."""

    def __init__(self, console: Console) -> None:
        # rich is imported here, for a terminal: --quiet and --json runs (and the workers' start) skip its ~20 ms
        from rich.console import Group
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn
        from rich.text import Text

        self._group, self._text = Group, Text
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
                                 TextColumn("{task.fields[eta]}"), console=console, auto_refresh=False)
        self.task = self.progress.add_task("running", total=None, rate="", eta="")
        self.health = Text("")
        self.live = Live(Group(self.progress, self.health), console=console, refresh_per_second=4, transient=False)

    def start(self) -> None:
        self.live.start()

    def update(self, s: dict[str, Any]) -> None:
        self.progress.update(self.task, completed=s["done"], total=s["total"], description=s["state"],
                             rate=f"{s['rate']:.1f} req/s", eta=_eta(s))
        self.health = self._text("   ".join(_health(s, " / ")).replace(" in flight", " in flight (requests)", 1))
        self.live.update(self._group(self.progress, self.health), refresh=True)

    def stop(self) -> None:
        self.live.stop()


async def show_progress(quiet: bool, log_format: str, log_interval_s: float, snapshot: Callable[[], dict[str, Any]],
                        log: Callable[[str], None]) -> None:
    """Until cancelled: the live display on a terminal, else a plain (or JSON) line every --log-interval."""
    if quiet:
        return  # before rich's import (~15 ms of start-up)
    from rich.console import Console

    console = Console(stderr=True)
    if console.is_terminal and log_format == "text":
        display = LiveDisplay(console)
        display.start()
        try:
            while True:
                display.update(snapshot())
                await asyncio.sleep(0.5)
        finally:
            display.update(snapshot())
            display.stop()
    else:
        while True:
            await asyncio.sleep(log_interval_s)
            s = snapshot()
            if log_format == "json":
                sys.stderr.write(orjson.dumps({"t": round(time.time(), 3), "level": "info", "progress": s})
                                 .decode() + "\n")
                sys.stderr.flush()
            else:
                log(fmt_snapshot_plain(s))
