"""Frames over a real pipe: what one side writes, the other reads, whole and in order, however it is gathered
into writes and cut into reads; nothing gathered is lost when a worker finishes."""

from __future__ import annotations

import asyncio
import os
import random
import threading

import orjson
import pytest

from evalsup.ipc import FrameKind, FrameWriter, split_meta
from evalsup.ipc.frames import BufferPool, FrameParser, ProtocolError, encode_frame, encode_meta, encode_meta_head
from evalsup.ipc.ring import SupervisorRing, WorkerRing, ring_budget, ring_size


async def _writer_on_pipe(fd: int, delay: float) -> FrameWriter:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, os.fdopen(fd, "wb", 0))
    return FrameWriter(asyncio.StreamWriter(transport, protocol, None, loop), delay=delay)


def _read_all(fd: int, rng: random.Random) -> list[tuple[FrameKind, bytes]]:
    got: list[tuple[FrameKind, bytes]] = []
    parser = FrameParser(lambda kind, payload: got.append((kind, bytes(payload))))
    while True:
        size = rng.choice((1, 7, 100, 4096, 1 << 16))
        room = parser.room()
        if room is not None and rng.random() < 0.7:  # the rest of a large frame read straight into its buffer
            n = os.readv(fd, [room[:size]])
            if not n:
                break
            parser.filled(n)
            continue
        data = os.read(fd, size)
        if not data:
            break
        parser.feed(data)
    assert parser.pending == 0, "the stream ended inside a frame"
    return got


@pytest.mark.parametrize("delay", [0.0, 0.005])
def test_frames_arrive_whole_and_in_order_however_gathered_and_cut(delay: float) -> None:
    rng = random.Random(7)
    frames: list[tuple[FrameKind, dict[str, int], bytes]] = []
    for i in range(3000):
        body = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 50, 3000)))) if i % 500 else b"x" * 300_000
        frames.append((FrameKind.RESULT, {"k": i}, body))
    r, w = os.pipe()

    async def produce() -> None:
        out = await _writer_on_pipe(w, delay)
        for i, (kind, meta, body) in enumerate(frames):
            if i % 2:
                out.send_parts(encode_meta_head(kind, meta, len(body)), body)
            else:
                out.send(encode_meta(kind, meta, body))
            if i % 100 == 0:
                await out.drain()
                await asyncio.sleep(0)
        await out.finish()  # what is still gathered goes out before we stop
        assert out._writer.transport.get_write_buffer_size() == 0, "finish() returned with data unwritten"
        out.close()

    got: list[tuple[FrameKind, bytes]] = []
    reader = threading.Thread(target=lambda: got.extend(_read_all(r, rng)))
    reader.start()
    asyncio.run(produce())
    reader.join(30)
    os.close(r)
    assert len(got) == len(frames)
    for (kind, payload), (want_kind, meta, body) in zip(got, frames, strict=True):
        assert kind is want_kind
        m, rest = split_meta(payload)
        assert m == meta and bytes(rest) == body


def test_writer_gathers_frames_until_its_delay_or_burst() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    noted: list[int] = []

    def gather() -> bytes | None:  # as a worker sums up its STARTED keys in one frame per write
        if not noted:
            return None
        frame = encode_frame(FrameKind.STARTED, b"".join(k.to_bytes(8, "big") for k in noted))
        noted.clear()
        return frame

    async def go() -> tuple[bytes, bytes, bytes, bytes]:
        out = await _writer_on_pipe(w, delay=0.05)
        out.gather = gather
        out.send(encode_frame(FrameKind.HEARTBEAT, b"{}"))
        noted.extend((1, 2))
        await asyncio.sleep(0.01)
        early = _try_read(r)  # nothing yet: it waits for company
        await asyncio.sleep(0.08)
        late = _try_read(r)
        noted.append(3)
        out.arm()  # a note alone is written too, within the delay
        await asyncio.sleep(0.08)
        alone = _try_read(r)
        big = encode_frame(FrameKind.HEARTBEAT, b"x" * (out.burst + 1))
        out.send(big)  # past the burst: written at once, not after the delay
        burst = _try_read(r, 1 << 20)
        out.close()
        return early, late, alone, burst[:16] if burst == big[: len(burst)] else b"mismatch"

    early, late, alone, burst = asyncio.run(go())
    os.close(r)
    assert early == b""
    keys = (1).to_bytes(8, "big") + (2).to_bytes(8, "big")
    assert late == encode_frame(FrameKind.STARTED, keys) + encode_frame(FrameKind.HEARTBEAT, b"{}")  # the summary first
    assert alone == encode_frame(FrameKind.STARTED, (3).to_bytes(8, "big"))
    assert burst not in (b"", b"mismatch")


def _try_read(fd: int, n: int = 65536) -> bytes:
    try:
        return os.read(fd, n)
    except BlockingIOError:
        return b""


def test_meta_is_found_by_its_length_not_by_scanning_the_body() -> None:
    body = b'{"a": "line\\nwith an escaped newline"}\n'
    frame = encode_meta(FrameKind.TASK, {"k": 5, "n": 1}, body)
    payload = memoryview(frame)[5:]
    meta, rest = split_meta(payload)
    assert meta == {"k": 5, "n": 1} and bytes(rest) == body
    for cut in (3, 6, 8):  # the meta's length not all there; its length there, the meta not
        with pytest.raises(ProtocolError):
            split_meta(payload[:cut])


def test_garbage_is_a_protocol_error() -> None:
    parser = FrameParser(lambda kind, payload: None)
    with pytest.raises(ProtocolError):
        parser.feed(b"\x00\x00\x00\x01\xfe" + b"x")  # an unknown kind
    with pytest.raises(ProtocolError):
        FrameParser(lambda kind, payload: None).feed(orjson.dumps({"not": "a frame"}) * 100)


def test_an_output_line_written_around_its_body_is_the_same_line() -> None:
    from evalsup.tasks.records import output_line, output_line_around

    body = orjson.dumps({"choices": [{"message": {"content": "x" * 50_000 + "\u0000 nul \n escaped"}}]})
    fields: dict[str, object] = {
        "status": 200, "request_id": "req-\u00001", "error": None,
        "metrics": {"latency_s": 0.25, "attempts": 2, "worker": 7},
        "metadata": {"expected": "a\u0000b", "nested": {"k\u0000": [1, 2]}}, "scores": {"exact_match": 1.0},
        "score_errors": None,
    }
    head, tail = output_line_around("t\u00009", **fields)
    whole = output_line("t\u00009", body=orjson.Fragment(body), **fields)
    around = head + body + tail
    # each record gets its own random batch_req_ id; apart from it the two lines are the same bytes
    assert around.replace(orjson.loads(around)["id"].encode(), orjson.loads(whole)["id"].encode()) == whole
    rec = orjson.loads(whole)
    assert rec["custom_id"] == "t\u00009" and rec["id"].startswith("batch_req_")
    assert rec["metadata"]["expected"] == "a\u0000b"


def _check_held(held: list[memoryview], bodies: list[bytes], first: int) -> None:
    for i, payload in enumerate(held, start=first):
        meta, line = split_meta(payload)
        assert meta == {"k": i} and line == bodies[i], f"result {i} was overwritten while still held"


def test_pooled_large_frames_are_never_overwritten_while_held_and_reused_once_dropped() -> None:
    """The supervisor reads large results into reused buffers: a result still waiting for the journal's writer
    must keep its bytes while later results arrive, and a buffer comes back only once it is let go."""
    pool = BufferPool(keep=4)
    held: list[memoryview] = []
    dropped = False
    parser = FrameParser(lambda kind, payload: held.append(payload), large=1 << 16, pool=pool)
    rng = random.Random(3)
    bodies = [bytes([i]) * rng.randrange(200_000, 1_100_000) for i in range(12)]
    stream = b"".join(encode_meta(FrameKind.RESULT, {"k": i}, body) for i, body in enumerate(bodies))
    view = memoryview(stream)
    pos = 0
    while pos < len(view):  # read as the supervisor does: a chunk, then the rest of a large frame in place
        room = parser.room()
        if room is not None:
            k = min(len(room), rng.randrange(1, 300_000), len(view) - pos)
            room[:k] = view[pos : pos + k]
            parser.filled(k)
        else:
            k = min(1 << 16, len(view) - pos)
            parser.feed(bytes(view[pos : pos + k]))
        pos += k
        if len(held) == 6 and not dropped:  # the journal wrote the first six: dropped, their buffers free again
            _check_held(held, bodies, 0)
            held, dropped = [], True
    assert len(held) == 6
    _check_held(held, bodies, 6)
    assert pool.reused >= 1, "no buffer was used again after its result was dropped"


def test_ring_lines_come_back_whole_in_order_and_space_is_reused_only_once_released() -> None:
    """A worker's large lines pass through shared memory: what the supervisor's view shows is what was put, a
    line is never overwritten before its release, and a ring too full for a line says so (the pipe takes it)."""
    sup = SupervisorRing(1 << 20)
    assert sup.fd is not None
    worker = WorkerRing(os.dup(sup.fd), sup.size)
    sup.close_fd()
    rng = random.Random(5)
    journal_end = 0
    held: list[tuple[memoryview, bytes]] = []
    fallbacks = 0
    for i in range(400):
        line = bytes([i % 251]) * rng.randrange(1, 300_000)
        parts = [line[:10], memoryview(line)[10:]]
        pos = worker.put(parts)
        if pos is None:  # full: the line goes by pipe; the journal writes what it holds and the ring frees up
            fallbacks += 1
            for view, want in held:
                assert view == want, "a line was overwritten before it was released"
            held.clear()
            upto = sup.releasable(journal_end)
            assert upto is not None
            worker.release(upto)
            continue
        journal_end += len(line)
        held.append((sup.line(pos, len(line), journal_end), line))
    assert fallbacks > 10  # the ring filled and was reused many times over
    for view, want in held:
        assert view == want
    assert held
    last = held[-1][1]
    with pytest.raises(ProtocolError):
        sup.line(0, 10, journal_end)  # released long ago: a reference to it is a broken worker
    with pytest.raises(ProtocolError):
        sup.line(worker.head - len(last), len(last), journal_end)  # the same line twice
    with pytest.raises(ProtocolError):
        sup.line(worker.head, sup.size + 1, journal_end)
    with pytest.raises(ProtocolError):
        sup.line(1 << 40, 10, journal_end)  # far past anything the worker was allowed to write


def test_the_rings_budget_follows_the_memory_a_run_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small container keeps today's 16 MiB of rings (the memory tests' 96 MiB cgroups), a machine of 4 GiB or
    more gets 64 MiB (fewer 1 MB results cross the pipe), and EVALSUP_RING_MB still decides when it is set."""
    monkeypatch.delenv("EVALSUP_RING_MB", raising=False)
    assert ring_budget(96 << 20) == 16 << 20
    assert ring_budget(None) == 16 << 20
    assert ring_budget(2 << 30) == 32 << 20
    assert ring_budget(24 << 30) == 64 << 20
    monkeypatch.setenv("EVALSUP_RING_MB", "0")
    assert ring_budget(24 << 30) == 0 and ring_size(2, 0) == 0
    monkeypatch.setenv("EVALSUP_RING_MB", "8")
    assert ring_budget(24 << 30) == 8 << 20
    assert ring_size(1, 64 << 20) == 64 << 20 and ring_size(4, 8 << 20) == 4 << 20  # at least 4 MiB each


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e30", "lots"])
def test_a_ring_size_that_is_no_size_falls_back(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("EVALSUP_RING_MB", value)
    got = ring_budget(24 << 30)
    assert 0 <= got <= 4096 << 20
    assert value not in ("nan", "inf", "lots") or got == 16 << 20
