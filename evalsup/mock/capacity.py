"""The mock's capacity model (issue 21, item 4): a server that serves at most K requests at a time.

``--capacity K --queue Q``: K requests are served at once (each takes the mock's latency), the next Q wait in a
FIFO, and any beyond those are refused at once with 429 and Retry-After, as a gateway in front of a full engine
does. Throughput peaks at K / latency whatever the client sends, which is what an adaptive client must find.
``GET /metrics`` shows the state as vLLM does (``vllm:num_requests_running``, ``vllm:num_requests_waiting``).
K and Q change at run time with ``POST /_mock/config {"capacity": K, "queue": Q}``; 0 is no limit.
Only the mock's event loop touches this.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import TypeVar

R = TypeVar("R")


class Capacity:
    def __init__(self) -> None:
        self.running = 0  # requests being served (gated POSTs only)
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.refused = 0

    @property
    def waiting(self) -> int:
        return len(self.waiters)

    async def serve(self, capacity: int, queue: int, method: str, handler: Callable[[], Awaitable[R]],
                    refuse: Callable[[], R]) -> R:
        """``handler()`` within the capacity, or ``refuse()`` when the queue is full. GETs are not gated."""
        if method != "POST":
            return await handler()
        if capacity > 0 and (self.running >= capacity or self.waiters):
            if len(self.waiters) >= queue:
                self.refused += 1
                return refuse()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                await fut  # a leaving request hands its slot over: running is already counted
            except asyncio.CancelledError:  # the client went away while it waited
                if fut in self.waiters:
                    self.waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._leave(capacity)  # it had been handed a slot: give it on
                raise
        else:
            self.running += 1
        try:
            return await handler()
        finally:
            self._leave(capacity)

    def _leave(self, capacity: int) -> None:
        if capacity <= 0 or self.running <= capacity:
            while self.waiters:
                fut = self.waiters.popleft()
                if not fut.done():
                    fut.set_result(None)  # the slot goes to the first waiter
                    return
        self.running -= 1

    def resize(self, capacity: int) -> None:
        """After a live change: admit waiters while there is room (a smaller capacity takes effect as they leave)."""
        while self.waiters and (capacity <= 0 or self.running < capacity):
            fut = self.waiters.popleft()
            if not fut.done():
                self.running += 1
                fut.set_result(None)


def prometheus_text(cap: Capacity, in_flight: int, models: tuple[str, ...]) -> str:
    """vLLM-style gauges. Without a capacity, everything in flight is running and nothing waits."""
    model = models[0] if models else "mock-model"
    running = cap.running if (cap.running or cap.waiters) else in_flight
    label = f'{{model_name="{model}"}}'
    return (
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{label} {float(running)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{label} {float(cap.waiting)}\n"
        "# HELP evalsup_mock_refused_total Requests refused with 429 because the queue was full.\n"
        "# TYPE evalsup_mock_refused_total counter\n"
        f"evalsup_mock_refused_total {float(cap.refused)}\n"
    )
