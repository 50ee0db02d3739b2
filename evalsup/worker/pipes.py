"""The worker's side of the pipes to the supervisor: opening them, and what goes out on them (``Outbox``).

Frames wait up to ``FLUSH_DELAY_S`` to share a write with the ones that follow; the flush rule (``Outbox.result``)
says when results do not wait. A large result line goes into the shared-memory ring (``ipc.ring``) and only
where it is goes by pipe. The keys of tasks begun since the last write go out as one STARTED frame with it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from evalsup.ipc import FrameKind, FrameWriter, encode_json, read_frame
from evalsup.ipc.frames import KEY, encode_frame, encode_meta, encode_meta_head, widen_pipe
from evalsup.ipc.ring import RING_MIN, WorkerRing

# Frames wait up to this long to share a write with the ones that follow: at hundreds of results a second,
# many results and STARTED notes go out in one system call and wake the supervisor once (each write costs a
# round of wake-ups on both sides: the supervisor's read, its refill of tasks, the worker's read of those).
# 5 ms cost 3-7 % more CPU than 20 ms at 4 KB (10,000 tasks, A/B); 100 ms saved ~6 % against 20 ms.
FLUSH_DELAY_S = 0.1
# ...but results do not wait for the timer once there are enough of them for the supervisor's next refill
# (its credit window is twice the worker's share of the concurrency, refilled an eighth at a time), nor when
# no task is left queued here: the queue covers one endpoint latency of work, and a fast endpoint must not
# starve on it.
FLUSH_RESULTS_SHARE = 2  # a write at once when (requests allowed in flight) / this many results wait


async def open_pipes(delay: float) -> tuple[asyncio.StreamReader, FrameWriter]:
    """The worker's ends of its two pipes: frames in on stdin, frames out on its real stdout (fd 1 then points
    at stderr, so a stray print cannot corrupt the frame pipe)."""
    loop = asyncio.get_running_loop()
    fd_in, fd_out = os.dup(0), os.dup(1)
    widen_pipe(fd_out)
    os.dup2(2, 1)  # stray prints go to stderr, never into the frame pipe
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd_in, "rb", 0))
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(fd_out, "wb", 0))
    # Results are often larger than the default 64 KiB mark; a request slot must not wait for the pipe to
    # empty after every result, or requests go out in waves. The credit window bounds what can queue here.
    # A slot that does wait goes on at 6 MiB, not at the default quarter (2 MiB): released a few at a time,
    # the slots do not come back from the endpoint all together (measured at 1 MB results: ~5 % faster).
    transport.set_write_buffer_limits(high=8 << 20, low=6 << 20)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return reader, FrameWriter(writer, delay=delay)


class Outbox:
    """What the worker sends: RESULT frames (through the pipe, or the ring), the STARTED notes, and the frames
    that tell the supervisor of an endpoint (TRIP, AUTH, PROBE_RESULT) or hand tasks back (RETURNED)."""

    def __init__(self, out: FrameWriter, ring_fd: int | None = None, ring_size: int = 0) -> None:
        self.out = out
        self.scrub: Callable[[str], str] = lambda text: text  # the run's secrets out of every message (worker.main)
        self._started: list[int] = []  # keys of tasks begun since the last write
        self._unsent = 0  # results queued for the pipe since the last write
        out.gather = self._gather_started
        self.ring: WorkerRing | None = None  # large results go here, not through the pipe (ipc.ring)
        if ring_fd is not None:
            try:
                self.ring = WorkerRing(ring_fd, ring_size)
            except (OSError, ValueError):
                self.ring = None  # every result through the pipe: slower, never wrong

    def started(self, key: int) -> None:
        """Task ``key`` was begun: noted in the next write's STARTED frame (the write is armed by the caller)."""
        self._started.append(key)

    def _gather_started(self) -> bytes | None:
        self._unsent = 0  # called as each write goes out
        if not self._started:
            return None
        keys, self._started = self._started, []
        return encode_frame(FrameKind.STARTED, b"".join(map(KEY.pack, keys)))

    def before_user_code(self, key: int) -> None:
        """User code (a plugin, a scorer) may kill the process: the supervisor must know the task was begun,
        so that the crash is blamed on it. Its STARTED note goes out now if it is still being gathered."""
        if key in self._started:
            self.out.flush()

    def result(self, out_line: list[bytes], info: dict[str, Any], limit: int, queued: bool) -> None:
        """One task's RESULT (its output line as parts, its meta). The flush rule: written at once when results
        enough for the supervisor's next refill wait (against ``limit``, the supervisor's cap, not the
        concurrency: its window for this worker follows its share), or when no task is ``queued`` here (the
        supervisor's refill, or this worker's next task, waits on these); else with the next write."""
        n = sum(map(len, out_line))
        pos = self.ring.put(out_line) if self.ring is not None and n >= RING_MIN else None
        if pos is not None:  # the supervisor's journal writes it from the ring: only where it is goes by pipe
            info["sh"] = [pos, n]
            self.out.send(encode_meta(FrameKind.RESULT, info, b""), weight=n)
        else:
            self.out.send_parts(encode_meta_head(FrameKind.RESULT, info, n), *out_line)
        self._unsent += 1
        if self._unsent * FLUSH_RESULTS_SHARE >= limit or not queued:
            self.out.flush()

    def release(self, pos: int) -> None:
        """RELEASE: the supervisor has written the ring's line at ``pos``."""
        if self.ring is not None:
            self.ring.release(pos)

    def returned(self, keys: list[int]) -> None:
        """Tasks handed back unanswered (DRAIN: queued ones; parked ones when the worker drains)."""
        self.out.send(encode_json(FrameKind.RETURNED, {"keys": keys}))

    def leaks(self, text: str) -> None:
        self.out.send(encode_json(FrameKind.LEAKS, {"text": text}))

    def trip(self, e: int, reason: str) -> None:
        self.out.send(encode_json(FrameKind.TRIP, {"reason": self.scrub(reason), "e": e}))

    def auth(self, e: int, message: str) -> None:
        self.out.send(encode_json(FrameKind.AUTH, {"message": self.scrub(message), "e": e}))
        self.out.flush()

    def fatal(self, message: str) -> None:
        """FATAL mid-run: a request could not be sent at all (issue 34); the supervisor stops the run (exit 2)."""
        self.out.send(encode_json(FrameKind.FATAL, {"message": self.scrub(message)}))
        self.out.flush()

    def probe_result(self, e: int, ok: bool, detail: str) -> None:
        self.out.send(encode_json(FrameKind.PROBE_RESULT, {"ok": ok, "detail": self.scrub(detail), "e": e}))


async def read_config(reader: asyncio.StreamReader, who: str) -> bytes | int:
    """The payload of the supervisor's first frame, CONFIG (a worker's and the batch driver's start); else the
    exit code: 0 when the pipe closed first, 2 (one line on stderr, naming ``who``) for any other frame."""
    frame = await read_frame(reader)
    if frame is None:
        return 0
    kind, payload = frame
    if kind is not FrameKind.CONFIG:
        print(f"{who}: expected CONFIG, got {kind.name}", file=sys.stderr)
        return 2
    return payload


async def fatal_start(out: FrameWriter, e: Exception) -> int:
    """A start that failed (its settings, its state): FATAL to the supervisor with why, and the exit code, 2."""
    out.send(encode_json(FrameKind.FATAL, {"message": f"{type(e).__name__}: {e}"}))
    await out.finish()
    return 2
