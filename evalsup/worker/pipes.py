"""The worker's side of the pipes to the supervisor."""

from __future__ import annotations

import asyncio
import os

from evalsup.ipc import FrameWriter
from evalsup.ipc.frames import widen_pipe


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
