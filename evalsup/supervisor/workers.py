"""One worker process as the supervisor sees it: its pipes, credits and the tasks it owns."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from evalsup.ipc import FrameKind, FrameWriter, encode_json
from evalsup.ipc.frames import BufferPool, encode_frame, encode_meta, widen_pipe
from evalsup.ipc.ring import POS, SupervisorRing
from evalsup.supervisor.pipes import PipeReader
from evalsup.tasks.reader import TaskRef


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"  # asked to finish what it holds and exit (recycle, shutdown)
    KILLED = "killed"  # killed by us (hang, hard memory limit, stop, broken pipe)
    GONE = "gone"


# the only moves a worker's life may make; anything else is a bug (WorkerHandle._to raises)
_MOVES: dict[State, frozenset[State]] = {
    State.STARTING: frozenset({State.READY, State.DRAINING, State.KILLED, State.GONE}),
    State.READY: frozenset({State.DRAINING, State.KILLED, State.GONE}),
    State.DRAINING: frozenset({State.KILLED, State.GONE}),
    State.KILLED: frozenset({State.GONE}),
    State.GONE: frozenset(),
}


class Exit(enum.Enum):
    """How a worker's life ended, classified once when its process is reaped."""

    DRAINED = "drained"  # asked to go (recycle, shutdown) and went
    STOPPED = "stop"  # killed by us because the run is stopping
    HARD_KILL = "hard_kill"  # killed past the hard RSS limit
    HUNG = "hung"  # killed for missing heartbeats
    CRASHED = "crashed"  # exited unasked, or its pipe broke

    @property
    def planned(self) -> bool:
        """We ended it on purpose: no restart to count, no successor owed beyond a recycle's."""
        return self in (Exit.DRAINED, Exit.STOPPED, Exit.HARD_KILL)

    @property
    def died(self) -> bool:
        """It went while working: the tasks it had begun are suspects."""
        return self in (Exit.CRASHED, Exit.HUNG, Exit.HARD_KILL)


class WorkerView(Protocol):
    """What the deciding rooms (memory, scaling) may read of a worker; only the arbiter acts on one (hang
    detection, what a RESULT changes and the progress read their own few fields: ``hang.Beating``,
    ``after_result.Counted``, ``view.WorkerFigures``)."""

    @property
    def id(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def slot(self) -> int: ...
    @property
    def state(self) -> State: ...
    @property
    def rss(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def task_limit(self) -> int | None: ...
    @property
    def recycling(self) -> bool: ...
    @property
    def alive(self) -> bool: ...


_ids = itertools.count(1)


def worker_module(batch: bool) -> str:
    """The module a worker runs: a --batch-api run's one "worker" (``batch``) is the batch driver (the same frames,
    the provider's Batch API)."""
    return "evalsup.batch" if batch else "evalsup.worker"


@dataclass(slots=True)
class Launched:
    """A worker's process, started and not yet given its settings: its interpreter imports its modules (a
    quarter of a second) and then waits for CONFIG on ``to_child``, sending nothing anywhere before it."""

    proc: asyncio.subprocess.Process
    to_child: int  # our end of its input
    from_child: int  # our end of its output
    ring: SupervisorRing | None
    ring_fd: int | None  # the ring's descriptor as the worker has it (ours is closed)
    taken: bool = False  # a WorkerHandle owns our ends of the pipes now

    def discard(self) -> None:
        """Never a worker's (the run was refused or stopped first): SIGKILL it (our own child, by PID) and
        close our ends unless a WorkerHandle took them; the caller reaps it (``proc.wait()``)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        if not self.taken:
            self.taken = True
            os.close(self.to_child)
            os.close(self.from_child)


async def launch(module: str, ring_size: int) -> Launched:
    """Start ``python -m module`` on two pipes of our own, with a shared-memory ring of ``ring_size`` bytes for
    its large results (none when 0 or where there is no memfd)."""
    ring = SupervisorRing.make(ring_size)
    ring_fd = ring.fd if ring is not None else None
    child_in, to_child = os.pipe()
    from_child, child_out = os.pipe()
    widen_pipe(child_out)
    try:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", module, stdin=child_in, stdout=child_out,
                                                    pass_fds=(ring_fd,) if ring_fd is not None else ())
    except BaseException:
        os.close(to_child)
        os.close(from_child)
        raise
    finally:
        os.close(child_in)
        os.close(child_out)
        if ring is not None:
            ring.close_fd()  # the worker has its own; our mapping stays
    return Launched(proc, to_child, from_child, ring, ring_fd)


class WorkerHandle:
    def __init__(self, slot: int, concurrency: int, window: int, held: dict[int, TaskRef],
                 share: int | None = None, wid: int | None = None) -> None:
        self.id = next(_ids) if wid is None else wid  # unique in the run: its account in the task ledger
        self.slot = slot  # which of the N places it fills (its replacement takes the same slot)
        self.concurrency = concurrency  # the most requests it can hold in flight (its connection pool)
        self.share = share or concurrency  # its part of --concurrency now (less than the above while scaling)
        self.window = window
        self.proc: asyncio.subprocess.Process | None = None
        self.stream: PipeReader | None = None
        self.out: FrameWriter | None = None
        self.pid = 0
        self.state = State.STARTING
        self.held = held  # the tasks it holds: the ledger's account, read here for credits (offset -> task)
        self.last_beat = time.monotonic()
        self.started = time.monotonic()
        self.done = 0
        self.task_limit: int | None = None
        self.kill_cause: Exit | None = None
        self.fatal: str | None = None
        self.rss = 0
        self.parked = 0  # requests parked by the breaker (from heartbeats)
        self.wire = 0  # requests on the wire (from heartbeats): the progress's "in flight"
        self.conc_limit = 0  # the requests it may have in flight now (from heartbeats; adaptive, issue 21)
        self.ep_load: list[list[int]] | None = None  # several endpoints: [limit, on the wire] each (heartbeats)
        self.limit_why: list[Any] | None = None  # a low adaptive limit's reason, and a --concurrency (heartbeats)
        self.old: list[list[float]] | None = None  # its oldest requests on the wire (heartbeats; supervisor.stall)
        self.recycling = False  # being replaced: gets no new task
        self.replaced = False  # its replacement has been started
        self.peak_rss = 0
        self.reader_task: asyncio.Task[None] | None = None
        self.ring: SupervisorRing | None = None

    def _to(self, state: State) -> None:
        if state not in _MOVES[self.state]:
            raise RuntimeError(f"worker {self.pid}: {self.state.value} -> {state.value} is not a move a worker makes")
        self.state = state

    def ready(self) -> None:
        """Its READY frame came: it takes tasks from now on (a READY after a drain or kill changes nothing)."""
        if self.state is State.STARTING:
            self._to(State.READY)
        self.last_beat = time.monotonic()

    def exited(self) -> Exit:
        """Its process is reaped: how its life ended, decided here once."""
        if self.state is State.KILLED:
            cause = self.kill_cause or Exit.CRASHED
        elif self.state is State.DRAINING:
            cause = Exit.DRAINED
        else:
            cause = Exit.CRASHED
        self._to(State.GONE)
        return cause

    async def spawn(self, config: dict[str, Any], on_frame: Callable[[FrameKind, memoryview], None],
                    pool: BufferPool | None = None, ring_size: int = 0, started: Launched | None = None) -> None:
        """Give ``python -m evalsup.worker`` its settings (starting its process now unless ``started`` is one
        launched ahead, see ``launch``): its frames reach ``on_frame`` as they complete (see PipeReader; large
        ones in buffers from ``pool``); ``self.stream.closed`` resolves at its EOF. Large results come through a
        shared-memory ring of ``ring_size`` bytes (see ipc.ring)."""
        loop = asyncio.get_running_loop()
        if started is None:
            started = await launch(worker_module(bool(config.get("batch"))), ring_size)
        started.taken = True
        self.ring, self.proc, self.pid = started.ring, started.proc, started.proc.pid
        if started.ring_fd is not None and self.ring is not None:
            config = {**config, "ring_fd": started.ring_fd, "ring_size": self.ring.size}
        self.stream = PipeReader(started.from_child, on_frame, pool)
        transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                            os.fdopen(started.to_child, "wb", 0))
        self.out = FrameWriter(asyncio.StreamWriter(transport, protocol, None, loop))
        self.out.send(encode_json(FrameKind.CONFIG, config))
        self.last_beat = time.monotonic()

    @property
    def credits(self) -> int:
        if self.state is not State.READY or self.recycling:
            return 0
        return self.window - len(self.held)

    @property
    def refill(self) -> int:
        """Free credits worth a refill: tasks go out an eighth of the window at a time, not one by one."""
        return max(1, self.window // 8)

    @property
    def alive(self) -> bool:
        return self.state in (State.STARTING, State.READY, State.DRAINING)

    def send_task(self, ref: TaskRef, line: bytes) -> None:
        """Send a task the ledger has just assigned to this worker."""
        assert self.out is not None
        self.out.send(encode_meta(FrameKind.TASK, {"k": ref.offset, "n": ref.line_no}, line))

    async def pipe_room(self) -> None:
        """Wait while the pipe to the worker is full (at once otherwise)."""
        if self.out is not None:
            await self.out.drain()

    def release_ring(self, written: int) -> None:
        """Tell the worker which part of its ring is free, now that the journal has written ``written`` bytes."""
        if self.ring is not None and self.out is not None and self.alive:
            upto = self.ring.releasable(written)
            if upto is not None:
                self.out.send(encode_frame(FrameKind.RELEASE, POS.pack(upto)))

    def send(self, kind: FrameKind, obj: Any = None) -> None:
        if self.out is not None:
            self.out.send(encode_frame(kind) if obj is None else encode_json(kind, obj))

    def drain(self, report: bool = False) -> None:
        if self.state in (State.STARTING, State.READY):
            self._to(State.DRAINING)
            self.send(FrameKind.DRAIN, {"report": report})

    def kill(self, cause: Exit) -> None:
        if self.proc is None or self.state in (State.KILLED, State.GONE):
            return
        self._to(State.KILLED)
        self.kill_cause = cause
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)

    def close_input(self) -> None:
        """Shutdown: nothing more goes to it; it finishes what it holds and exits at its input's end."""
        if self.state in (State.STARTING, State.READY):
            self._to(State.DRAINING)
        if self.out is not None:
            self.out.close()
