"""Per-endpoint rate limits in the worker (issue 21 item 1): a pacer for each endpoint that has a limit of its own.

The RATE frame (``ipc.messages.Rate``) carries this worker's share of the global limits, for the worker's
``Pacer``, and of each endpoint's own (``eps``), for that endpoint's. An attempt waits on the global pacer first
(the client), then picks its endpoint and waits on that endpoint's pacer (``pick_paced``): pick, then pace. While
it waits it counts as that endpoint's load (``Endpoint.pending``), so the pick sends the next requests elsewhere
rather than queueing them behind a slow limit. The time waited is the client's, never the server's (``queue_s``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

from evalsup.worker.endpoints import Endpoint, EndpointPool
from evalsup.worker.pacing import Pacer


def apply_rate(pacer: Pacer, pool: EndpointPool, frame: Mapping[str, Any]) -> None:
    """A RATE frame: set the global pacer and every endpoint's own (made on first use, dropped without one)."""
    arrivals = str(frame.get("arrivals", "uniform"))
    pacer.set(frame.get("rps"), frame.get("tpm"), arrivals)
    eps = frame.get("eps") or {}
    for ep in pool.all:
        limits = eps.get(str(ep.index))
        if not limits or not any(limits):
            ep.pacer = None
            continue
        if ep.pacer is None:  # its own random stream (Poisson arrivals), drawn from the worker's
            ep.pacer = Pacer(random.Random(pacer.rng.getrandbits(64)))
        ep.pacer.set(limits[0], limits[1], arrivals)
    pool.paced = any(ep.pacer is not None for ep in pool.all)


def counts_tokens(pacer: Pacer, pool: EndpointPool) -> bool:
    """Whether a request's tokens are to be estimated: some pacer has a tokens-per-minute limit."""
    return pacer.tpm is not None or (pool.paced and any(ep.pacer is not None and ep.pacer.tpm is not None
                                                        for ep in pool.all))


async def pace(p: Pacer, estimate: int) -> None:
    """Wait for ``p``'s next start time, and charge ``estimate`` tokens to its minute's budget."""
    if p.rps is not None:
        await p.request_slot()
    if p.tpm is not None:
        await p.charge_tokens(estimate)


async def pick_paced(pool: EndpointPool, cap: int, estimate: int, avoid: Endpoint | None = None,
                     now: float = math.inf) -> Endpoint | None:
    """The endpoint for the next attempt (``EndpointPool.pick``), once its own pacer lets the request go (None:
    every endpoint is ejected). An endpoint ejected while the request waited is not sent to: it picks again."""
    while True:
        ep = pool.pick(cap, avoid, now)
        if ep is None or ep.pacer is None:
            return ep
        ep.pending += 1
        try:
            await pace(ep.pacer, estimate)
        finally:
            ep.pending -= 1
        if ep.up:
            return ep


def correct_usage(pacer: Pacer, ep: Endpoint, used: int, estimate: int) -> None:
    """The tokens an answer really used (``usage.total_tokens``): correct the estimate charged to both the
    global budget and the endpoint's."""
    pacer.correct_tokens(used - estimate)
    if ep.pacer is not None:
        ep.pacer.correct_tokens(used - estimate)
