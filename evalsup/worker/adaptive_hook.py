"""Where the adaptive limit meets a worker (issue 21): the client's attempts and the server's metrics feed it.

Kept apart from ``worker.main`` so that file only needs a line to start it: ``watch`` hooks the client and
starts the scraper (when the server has metrics) as one background task.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from evalsup.ipc.messages import WorkerConfig
from evalsup.worker.client import Client
from evalsup.worker.endpoints import Endpoint, EndpointPool
from evalsup.worker.server_signals import metrics_url, scrape_loop


def watch(pool: EndpointPool, client: Client, session: aiohttp.ClientSession, cfg: WorkerConfig,
          headers: dict[str, str], inflight: Callable[[], int], cap: Callable[[], int]) -> asyncio.Task[Any]:
    """Feed each endpoint's limit from every attempt of ``client`` sent to it (``cap()`` the supervisor's
    LIMIT) and from its server's queue; the task scrapes until cancelled. In flight: with one endpoint, the
    requests this worker has begun (``inflight()``); with several, those on the wire to that endpoint."""
    one = len(pool) == 1

    def observe(ep: Endpoint, status: int | None, code: str | None, server_s: float) -> None:
        if ep.adaptive is not None:
            ep.adaptive.observe(time.monotonic(), server_s, status, code, inflight() if one else ep.on_wire + 1,
                                cap())

    client.observe = observe
    scrapes = []
    for ep in pool.all:
        url = metrics_url(ep.base_url, cfg.server_metrics)
        if url is None or ep.adaptive is None:
            continue
        same_host = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(ep.base_url).netloc
        # the key and --header values go only to the endpoint's own host
        sent = {k: v for k, v in headers.items() if k != "Content-Type"} if same_host else {}
        scrapes.append(scrape_loop(session, url, sent, bool(cfg.server_metrics), ep.adaptive.server))
    if not scrapes:
        return asyncio.create_task(asyncio.Event().wait())  # nothing to scrape; cancelled with the others
    return asyncio.create_task(_all(scrapes))


async def _all(scrapes: list[Coroutine[Any, Any, None]]) -> None:
    await asyncio.gather(*scrapes)
