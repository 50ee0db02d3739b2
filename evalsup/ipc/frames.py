"""Length-prefixed frames over a pipe.

A frame is a 5-byte header (payload length as a big-endian u32, then one byte of kind) and the payload.
Payloads are orjson, or for TASK and RESULT the length of an orjson meta object (u32), the meta, and raw
line bytes that neither side re-encodes. No pickle.

Frames are gathered and written together (``FrameWriter``): a worker holds its frames for a few
milliseconds, so that many results and STARTED notes share one write and one wake-up of the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import struct
from collections.abc import Callable
from typing import Any

import orjson

HEADER = struct.Struct(">IB")
KEY = struct.Struct(">Q")  # a task key (its byte offset) in STARTED frames
META_LEN = struct.Struct(">I")  # the meta's length, at the start of a TASK or RESULT payload
MAX_FRAME = 1 << 30  # a frame larger than this is a protocol error, not a big response


class FrameKind(enum.IntEnum):
    # supervisor -> worker
    CONFIG = 1  # json: the worker's settings
    TASK = 2  # meta {"k": key, "n": line number} + the task line
    DRAIN = 3  # start nothing new, finish what you hold, send BYE, exit
    PAUSE = 4  # hold queued tasks: start no new request until RESUME
    RESUME = 5
    LIMIT = 6  # json {"inflight": n}: cap on requests in flight in this worker
    RATE = 7  # json {"rps": x | None, "tpm": y | None, "arrivals": "uniform" | "poisson"}: this worker's share
    BREAKER_OPEN = 8  # the endpoint is down: start nothing, park what fails endpoint-side
    BREAKER_CLOSE = 9  # json {"was_down": bool}: it is back (or was never down): carry on
    PROBE = 20  # check the endpoint with a request of its own (GET /models) and say how it went
    RELEASE = 21  # u64 position: the worker's result ring is free before it (see ipc.ring)
    STALL = 23  # json {"age": s}: abandon the attempts on the wire for at least s seconds, and retry them
    # worker -> supervisor
    READY = 10  # json {"pid": ..., "concurrency": ...}
    RESULT = 11  # meta {"k", "ok", "lat", "att", "rb", "ec", "pt", "ct", "ttft", "sc"} + output line, or meta
    #              with "sh": [position, length] of the line in the worker's ring and nothing after it
    HEARTBEAT = 12  # json {"inflight", "queued", "parked", "done", "retries", "wire", "old", ...}
    BYE = 13  # json {"done": n}: drained, about to exit
    FATAL = 14  # json {"message": str}: the worker cannot go on
    LEAKS = 15  # json {"text": str}: top allocation sites (tracemalloc), sent before a drain exit
    TRIP = 16  # json {"reason": str}: most recent attempts failed endpoint-side
    PROBE_RESULT = 17  # json {"ok": bool, "detail": str}
    STARTED = 18  # 8-byte keys: the worker began these tasks (a crash blames only started tasks)
    RETURNED = 19  # json {"keys": [...]}: on DRAIN, the tasks it had not begun, handed back
    AUTH = 22  # json {"message": str, "e": int}: endpoint e refused the key for several tasks (breaker.AuthWatch)


_KINDS: dict[int, FrameKind] = {int(k): k for k in FrameKind}


class ProtocolError(Exception):
    """The other side sent something that is not a frame."""


def encode_frame(kind: FrameKind, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload), kind) + payload


def encode_json(kind: FrameKind, obj: Any) -> bytes:
    return encode_frame(kind, orjson.dumps(obj))


def encode_meta(kind: FrameKind, meta: Any, body: bytes) -> bytes:
    return encode_meta_head(kind, meta, len(body)) + body


def encode_meta_head(kind: FrameKind, meta: Any, body_len: int) -> bytes:
    """Header and meta of a meta+body frame whose body (of ``body_len`` bytes) is sent after it."""
    m = orjson.dumps(meta)
    return HEADER.pack(META_LEN.size + len(m) + body_len, kind) + META_LEN.pack(len(m)) + m


def decode_json(payload: bytes | memoryview) -> Any:
    return orjson.loads(payload)


def split_meta(payload: bytes | memoryview) -> tuple[Any, memoryview]:
    """Split a meta+body payload into (parsed meta, raw body), without copying the body."""
    view = memoryview(payload)
    end = META_LEN.size + META_LEN.unpack_from(view)[0] if len(view) >= META_LEN.size else len(view) + 1
    if len(view) < end:
        raise ProtocolError("a meta+body frame shorter than its meta")
    return orjson.loads(view[META_LEN.size : end]), view[end:]


PIPE_SIZE = 1 << 20


def widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer (Linux F_SETPIPE_SZ): fewer wake-ups and system calls per large result."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_SIZE)
    except (OSError, ImportError):
        pass


class BufferPool:
    """Buffers for large frames, used again once nothing looks at them any more.

    A buffer is handed out again only when no view of it is alive (a bytearray with exported views cannot
    be resized: that is the test), so a frame's bytes stay put until the last holder, the journal's writer,
    has dropped them, and nobody has to give anything back. Reuse spares the zero-filling and page faults
    of a fresh megabyte per large result. At most ``keep`` buffers, of at most ``largest`` bytes, are kept.
    """

    GRANULE = 1 << 18  # sizes rounded up to this, so that results of about the same size share buffers

    def __init__(self, keep: int = 16, largest: int = 8 << 20) -> None:
        self.keep = keep
        self.largest = largest
        self._bufs: list[bytearray] = []
        self.reused = 0

    @staticmethod
    def _unused(buf: bytearray) -> bool:
        try:
            buf.append(0)  # BufferError while any memoryview of it is alive
        except BufferError:
            return False
        del buf[-1]
        return True

    def take(self, n: int) -> memoryview:
        """``n`` writable bytes (their old contents are not cleared)."""
        for buf in self._bufs:
            if len(buf) >= n and self._unused(buf):
                self.reused += 1
                return memoryview(buf)[:n]
        size = -(-n // self.GRANULE) * self.GRANULE
        buf = bytearray(size)
        if size <= self.largest:
            if len(self._bufs) >= self.keep:  # make room by dropping one nobody uses, if any
                idle = [b for b in self._bufs if self._unused(b)]
                if idle:
                    self._bufs.remove(min(idle, key=len))
            if len(self._bufs) < self.keep:
                self._bufs.append(buf)
        return memoryview(buf)[:n]


class FrameParser:
    """Frames out of a byte stream that arrives in chunks, handed to ``on_frame`` as they complete.

    A frame that lies within one chunk is passed as a memoryview of that chunk (no copy); a small frame that
    spans chunks is gathered and joined once, when it is complete. A large frame (past ``large`` bytes) gets
    one buffer of its full size as soon as its header is known: the rest of it can be read straight into
    ``room()`` (then ``filled(n)``), so it is copied from the pipe once and never joined. Raises
    ProtocolError on garbage.
    """

    def __init__(self, on_frame: Callable[[FrameKind, memoryview], None], large: int = 1 << 16,
                 pool: BufferPool | None = None) -> None:
        self.on_frame = on_frame
        self.large = large
        self.pool = pool
        self._chunks: list[bytes | memoryview] = []  # a small frame arriving across chunks
        self._have = 0
        self._need = 0  # bytes the partial frame needs before it is worth parsing
        self._big: bytearray | memoryview | None = None  # a large frame being filled
        self._big_have = 0

    @property
    def pending(self) -> int:
        """Bytes of a frame begun and not complete."""
        if self._big is not None:
            return self._big_have
        return self._have if self._chunks else 0

    def room(self) -> memoryview | None:
        """Where the rest of the large frame in progress goes, if one is."""
        return memoryview(self._big)[self._big_have :] if self._big is not None else None

    def filled(self, n: int) -> None:
        """``n`` bytes were read into ``room()``."""
        assert self._big is not None
        self._big_have += n
        if self._big_have == len(self._big):
            frame, self._big = memoryview(self._big), None
            self.on_frame(self._kind(frame[HEADER.size - 1]), frame[HEADER.size :])

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        if self._big is not None:  # the reader did not use room(): copy into it
            k = min(len(view), len(self._big) - self._big_have)
            self._big[self._big_have : self._big_have + k] = view[:k]
            self.filled(k)
            view = view[k:]
            if not view:
                return
        if self._chunks:
            self._chunks.append(view)
            self._have += len(view)
            if self._have < self._need:
                return  # still inside a frame: gather, do not parse again
            view = memoryview(b"".join(self._chunks))  # the one copy a small frame across chunks costs
            self._chunks = []
        rest = self._parse(view)
        if not rest:
            return
        if len(rest) >= HEADER.size:
            length, kind = HEADER.unpack_from(rest)  # its length was checked against MAX_FRAME by _parse
            total = HEADER.size + length
            if total > self.large:
                self._kind(kind)  # garbage is refused before a buffer is made for it
                self._big = self.pool.take(total) if self.pool is not None else bytearray(total)
                self._big[: len(rest)] = rest
                self._big_have = len(rest)
                return
            self._need = total
        else:
            self._need = HEADER.size
        # the payloads handed out above are views of `view`: keep the tail as its own view, not a copy
        self._chunks = [rest]
        self._have = len(rest)

    @staticmethod
    def _kind(kind: int) -> FrameKind:
        k = _KINDS.get(kind)  # a dict, not FrameKind(kind): the enum's call costs ~1 us a frame
        if k is None:
            raise ProtocolError(f"unknown frame kind {kind}")
        return k

    def _parse(self, view: memoryview) -> memoryview:
        pos, n = 0, len(view)
        size = HEADER.size
        while n - pos >= size:
            length, kind = HEADER.unpack_from(view, pos)
            if length > MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes is larger than the limit")
            end = pos + size + length
            if end > n:
                break
            self.on_frame(self._kind(kind), view[pos + size : end])
            pos = end
        return view[pos:]


async def read_frame(reader: asyncio.StreamReader) -> tuple[FrameKind, bytes] | None:
    """Read one frame; None at a clean EOF between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise ProtocolError("pipe closed inside a frame header") from e
    length, kind = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes is larger than the limit")
    try:
        payload = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as e:
        raise ProtocolError("pipe closed inside a frame") from e
    try:
        return FrameKind(kind), payload
    except ValueError as e:
        raise ProtocolError(f"unknown frame kind {kind}") from e


class FrameWriter:
    """Gathers frames and writes them together: one system call (and one wake-up of the reader) for many.

    Frames go out ``delay`` seconds after the first of them was queued (``0``: at the end of the current
    loop iteration), or at once when ``burst`` bytes are waiting. ``send`` never blocks; callers that produce
    many frames ``await drain()``, which waits only while the pipe is full (the transport above its
    high-water mark), so the pipe's bound pushes back on them. ``finish()`` waits until everything queued is
    in the pipe: call it before exiting.
    """

    def __init__(self, writer: asyncio.StreamWriter, delay: float = 0.0, burst: int = 1 << 18) -> None:
        self._writer = writer
        self.delay = delay
        self.burst = burst
        self._pending: list[bytes | memoryview] = []
        self._bytes = 0
        self._timer: asyncio.Handle | None = None
        self.closed = False
        # called as a write goes out: a frame that sums up what was noted meanwhile (STARTED keys), or None
        self.gather: Callable[[], bytes | None] | None = None

    def send(self, frame: bytes, weight: int = 0) -> None:
        """Queue ``frame``; ``weight`` more bytes count towards the burst (what the frame stands for, as a
        result in the ring: its reader should hear of it as soon as if it came through the pipe)."""
        self._bytes += weight
        self._queue(frame)

    def send_parts(self, head: bytes, *body: bytes | memoryview) -> None:
        """A frame given as its head (header and meta) and its body in parts, written without joining them."""
        self._queue(head, body)

    def _queue(self, head: bytes, body: tuple[bytes | memoryview, ...] = ()) -> None:
        if self.closed:
            return
        self._pending.append(head)
        self._bytes += len(head)
        for part in body:
            self._pending.append(part)
            self._bytes += len(part)
        if self._bytes >= self.burst:
            self.flush()
        else:
            self.arm()

    def arm(self) -> None:
        """Make sure a write goes out within ``delay`` (for what ``gather`` will add)."""
        if self._timer is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_soon(self.flush) if self.delay <= 0 else loop.call_later(self.delay, self.flush)

    def flush(self) -> None:
        """Hand every queued frame to the pipe now (the transport buffers what the pipe cannot take yet)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.closed:
            return
        first = self.gather() if self.gather is not None else None
        if first is not None:
            self._pending.insert(0, first)
        if not self._pending:
            return
        data = self._pending
        self._pending = []
        self._bytes = 0
        try:
            self._writer.writelines(data)
        except (ConnectionError, RuntimeError):
            self.closed = True

    def must_drain(self) -> bool:
        """Whether ``drain()`` could have anything to wait for: the transport holds bytes the pipe has not
        taken yet, or is closing. Where it does not, a caller per frame spares the coroutines of ``drain()``."""
        if self.closed:
            return False
        t = self._writer.transport
        return t.get_write_buffer_size() > 0 or t.is_closing()

    async def drain(self) -> None:
        """Wait while the pipe is full; returns at once otherwise (frames still gathering are not forced out)."""
        if self.closed:
            return
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError):
            self.closed = True

    async def finish(self, timeout_s: float = 30.0) -> None:
        """Write out everything queued and wait (up to ``timeout_s``) until the pipe has taken all of it."""
        self.flush()
        if self.closed:
            return
        transport = self._writer.transport
        transport.set_write_buffer_limits(high=0)  # drain() now waits for an empty buffer
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.drain(), timeout_s)

    def close(self) -> None:
        self.flush()
        self.closed = True
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._writer.close()
