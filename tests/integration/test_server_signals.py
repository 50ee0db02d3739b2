"""Issue 21: the mock's capacity model (real HTTP), and the server-metrics parser and scraper against it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import aiohttp
import pytest

from evalsup.mock.server import MockConfig, MockThread
from evalsup.worker.server_signals import ServerQueue, fetch_queue, metrics_url, parse_queue
from tests.mock_http import request


def _post(url: str, status: list[tuple[int, str | None]]) -> None:
    r = request(url, "POST", "/v1/chat/completions", {"model": "mock-model", "messages": [
        {"role": "user", "content": "hi"}]})
    status.append((r.status, r.headers.get("Retry-After")))


def _metrics(m: MockThread) -> ServerQueue:
    r = request(m.url, "GET", "/metrics")
    assert r.status == 200
    q = parse_queue(r.body.decode())
    assert q is not None
    return q


def _wait_for(pred: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_the_mock_serves_k_at_once_queues_q_and_refuses_the_rest_with_retry_after() -> None:
    with MockThread(MockConfig(latency_ms=600, capacity=2, queue=1, retry_after_s=3)) as m:
        status: list[tuple[int, str | None]] = []
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            futs = [pool.submit(_post, m.url, status) for _ in range(3)]
            _wait_for(lambda: _metrics(m) == ServerQueue(1.0, 2.0), "2 running and 1 waiting")
            futs += [pool.submit(_post, m.url, status) for _ in range(2)]
            for f in futs:
                f.result()
        assert sorted(s for s, _ in status) == [200, 200, 200, 429, 429]
        assert all(ra == "3" for s, ra in status if s == 429)
        assert _metrics(m) == ServerQueue(0.0, 0.0)


def test_the_capacity_changes_at_run_time() -> None:
    with MockThread(MockConfig(latency_ms=800, capacity=1, queue=10)) as m:
        status: list[tuple[int, str | None]] = []
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(_post, m.url, status) for _ in range(4)]
            _wait_for(lambda: _metrics(m) == ServerQueue(3.0, 1.0), "1 running and 3 waiting")
            r = request(m.url, "POST", "/_mock/config", {"capacity": 4})
            assert r.status == 200 and r.json()["capacity"] == 4
            assert _metrics(m) == ServerQueue(0.0, 4.0)  # the waiters are let in at once
            for f in futs:
                f.result()
        assert [s for s, _ in status] == [200] * 4
        bad = request(m.url, "POST", "/_mock/config", {"capacity": -1})
        assert bad.status == 400 and "capacity" in bad.json()["error"]


def test_the_scraper_reads_the_mocks_metrics_and_skips_a_server_without_them() -> None:
    with MockThread(MockConfig(latency_ms=500, capacity=1, queue=5)) as m:
        async def go() -> tuple[ServerQueue | None, ServerQueue | None]:
            async with aiohttp.ClientSession() as s:
                tasks = [asyncio.create_task(s.post(m.url + "/chat/completions", json={
                    "model": "mock-model", "messages": [{"role": "user", "content": "x"}]})) for _ in range(3)]
                await asyncio.sleep(0.2)
                seen = await fetch_queue(s, metrics_url(m.url, None) or "", {})
                missing = await fetch_queue(s, m.url + "/no-metrics-here", {})
                for r in await asyncio.gather(*tasks):
                    r.release()
                return seen, missing

        seen, missing = asyncio.run(go())
    assert seen == ServerQueue(waiting=2.0, running=1.0)
    assert missing is None


@pytest.mark.parametrize("flag", ["--capacity", "--queue"])
def test_mock_cli_refuses_a_negative_capacity(flag: str) -> None:
    from click.testing import CliRunner

    from evalsup.cli.main import main

    r = CliRunner().invoke(main, ["mock", flag, "-1"])
    assert r.exit_code == 2


def test_a_client_that_leaves_while_queued_does_not_leak_a_slot() -> None:
    import http.client
    import json
    import socket
    from urllib.parse import urlsplit

    with MockThread(MockConfig(latency_ms=400, capacity=1, queue=5)) as m:
        status: list[tuple[int, str | None]] = []
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(_post, m.url, status)
            _wait_for(lambda: _metrics(m).running == 1, "one running")
            u = urlsplit(m.url)
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=0.1)
            body = json.dumps({"model": "mock-model", "messages": [{"role": "user", "content": "x"}]})
            conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            with pytest.raises((socket.timeout, TimeoutError)):
                conn.getresponse()  # it waits in the mock's queue; we leave
            conn.close()
            first.result()
        _wait_for(lambda: _metrics(m) == ServerQueue(0.0, 0.0), "the slot of the one that left came back")
        _post(m.url, status)
        assert [s for s, _ in status] == [200, 200]


def test_the_scrape_loop_feeds_the_limit_and_leaves_a_server_without_metrics_alone() -> None:
    from evalsup.worker.adaptive import AdaptiveLimit
    from evalsup.worker.server_signals import scrape_loop

    with MockThread(MockConfig(latency_ms=400, capacity=1, queue=5)) as m:
        async def go() -> list[tuple[float, float]]:
            fed: list[tuple[float, float]] = []
            ctl = AdaptiveLimit()

            def feed(now: float, waiting: float, running: float) -> None:
                fed.append((waiting, running))
                ctl.server(now, waiting, running)

            async with aiohttp.ClientSession() as s:
                # found, not asked for, and not there: one look, then the loop ends by itself
                await scrape_loop(s, m.url + "/no-metrics-here", {}, False, feed, interval_s=0.01)
                assert fed == []
                posts = [asyncio.create_task(s.post(m.url + "/chat/completions", json={
                    "model": "mock-model", "messages": [{"role": "user", "content": "x"}]})) for _ in range(3)]
                loop = asyncio.create_task(scrape_loop(s, metrics_url(m.url, None) or "", {}, False, feed,
                                                       interval_s=0.01))
                while (2.0, 1.0) not in fed:
                    await asyncio.sleep(0.01)
                loop.cancel()
                for r in await asyncio.gather(*posts):
                    r.release()
            return fed

        fed = asyncio.run(asyncio.wait_for(go(), 30))
    assert (2.0, 1.0) in fed  # 1 running, 2 waiting, as the mock's /metrics said
