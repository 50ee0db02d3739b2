"""Where the adaptive limit meets a worker (issue 21): the client's attempts and the server's metrics feed it.

Kept apart from ``worker.main`` so that file only needs a line to start it: ``watch`` hooks the client and
starts the scraper (when the server has metrics) as one background task.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import aiohttp

from evalsup.ipc.messages import WorkerConfig
from evalsup.worker.adaptive import AdaptiveLimit
from evalsup.worker.client import Client
from evalsup.worker.server_signals import metrics_url, scrape_loop


def watch(limit: AdaptiveLimit, client: Client, session: aiohttp.ClientSession, cfg: WorkerConfig,
          headers: dict[str, str], inflight: Callable[[], int], cap: Callable[[], int]) -> asyncio.Task[Any]:
    """Feed ``limit`` from every attempt of ``client`` (``inflight()`` requests in flight, ``cap()`` the
    supervisor's LIMIT) and from the server's queue; the task scrapes until cancelled."""

    def observe(status: int | None, code: str | None, server_s: float) -> None:
        limit.observe(time.monotonic(), server_s, status, code, inflight(), cap())

    client.observe = observe
    url = metrics_url(cfg.base_url, cfg.server_metrics)
    if url is None:
        return asyncio.create_task(asyncio.Event().wait())  # nothing to scrape; cancelled with the others
    same_host = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(cfg.base_url).netloc
    # the key and --header values go only to the endpoint's own host
    sent = {k: v for k, v in headers.items() if k != "Content-Type"} if same_host else {}
    return asyncio.create_task(scrape_loop(session, url, sent, bool(cfg.server_metrics), limit.server))
