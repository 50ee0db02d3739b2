"""The server's own queue, from its Prometheus metrics (issue 21, item 3).

``parse_queue`` is pure: Prometheus text in, (waiting, running) out, summed over label sets (several models or
engines behind one server), or None when the text has none of the gauges it knows:

* vLLM: ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` (and ``vllm:gpu_cache_usage_perc`` /
  ``vllm:kv_cache_usage_perc``, kept as the KV cache's use)
* SGLang: ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``
* TGI: ``tgi_queue_size``, ``tgi_batch_current_size``

``scrape_loop`` runs in each worker next to its requests (not in the supervisor): it feeds the worker's own
controller with no new frame kind and no supervisor change, and a GET a second per worker is nothing beside
the requests themselves. Without ``--server-metrics`` it looks once at the server root's ``/metrics``; a
server without one (or with none of the gauges) is left alone, and the limit works from latency and errors.
``scrape_endpoints`` starts one such loop for each endpoint with an adaptive limit, feeding that endpoint's.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp

from evalsup.worker.endpoints import EndpointPool

WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")
KV_CACHE = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
SCRAPE_INTERVAL_S = 0.5
MAX_METRICS_BYTES = 4 << 20


@dataclass(frozen=True)
class ServerQueue:
    waiting: float
    running: float
    kv_cache: float | None = None  # 0..1 where the server says


def _sample(line: str) -> tuple[str, float] | None:
    """(metric name, value) of one sample line, or None (comments, blank, unparsable)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    if "{" in line:
        name, _, rest = line.partition("{")
        depth_end = rest.rfind("}")
        if depth_end < 0:
            return None
        fields = rest[depth_end + 1:].split()
    else:
        name, *fields = line.split()
    if not fields:
        return None
    try:
        return name.strip(), float(fields[0])
    except ValueError:
        return None


def parse_queue(text: str) -> ServerQueue | None:
    sums: dict[str, float] = {}
    for line in text.splitlines():
        s = _sample(line)
        if s is not None and s[1] == s[1]:  # NaN says nothing
            sums[s[0]] = sums.get(s[0], 0.0) + s[1]
    waiting = [sums[n] for n in WAITING if n in sums]
    if not waiting:
        return None
    running = [sums[n] for n in RUNNING if n in sums]
    kv = [sums[n] for n in KV_CACHE if n in sums]
    return ServerQueue(sum(waiting), sum(running), kv[0] if kv else None)


def metrics_url(base_url: str, flag: str | None) -> str | None:
    """--server-metrics, or the server root's /metrics (http://host:port/v1 -> http://host:port/metrics);
    None for ``--server-metrics off`` (latency and errors alone)."""
    if flag == "off":
        return None
    if flag:
        return flag
    u = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/metrics", "", ""))


async def fetch_queue(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> ServerQueue | None:
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status != 200:
                return None
            data = await resp.content.read(MAX_METRICS_BYTES)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return parse_queue(data.decode("utf-8", "replace"))


async def scrape_loop(session: aiohttp.ClientSession, url: str, headers: dict[str, str], given: bool,
                      feed: Callable[[float, float, float], None], interval_s: float = SCRAPE_INTERVAL_S) -> None:
    """Feed ``feed(now, waiting, running)`` every interval. Not ``given`` (found, not asked for): one look, and
    gone when the server has no such metrics. Given: keeps trying (a server may come up late)."""
    first = await fetch_queue(session, url, headers)
    if first is None and not given:
        return
    q = first
    while True:
        if q is not None:
            feed(time.monotonic(), q.waiting, q.running)
        await asyncio.sleep(interval_s)
        q = await fetch_queue(session, url, headers)


def scrape_endpoints(session: aiohttp.ClientSession, pool: EndpointPool, flag: str | None) -> asyncio.Task[Any]:
    """Scrape the server of each endpoint with an adaptive limit (``flag``: --server-metrics) into that limit
    (``Endpoint.server_queue``), as one task that runs until cancelled. The endpoint's headers (the key or its
    basic auth, --header values) go only to its own host."""
    scrapes = []
    for ep in pool.all:
        url = metrics_url(ep.address, flag)
        if url is None or ep.adaptive is None:
            continue
        same_host = urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(ep.address).netloc
        sent = {k: v for k, v in ep.headers.items() if k != "Content-Type"} if same_host else {}
        scrapes.append(scrape_loop(session, url, sent, bool(flag), ep.server_queue))
    if not scrapes:
        return asyncio.create_task(asyncio.Event().wait())  # nothing to scrape; cancelled with the others
    return asyncio.create_task(_all(scrapes))


async def _all(scrapes: list[Coroutine[Any, Any, None]]) -> None:
    await asyncio.gather(*scrapes)
