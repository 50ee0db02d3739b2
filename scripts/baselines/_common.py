"""What the baselines share with each other and with evalsup's worker, so that only the architecture differs.

Same request (simple task line -> {"messages", "model"} to /v1/chat/completions, orjson-encoded body,
Content-Type header), same aiohttp settings (one ClientSession, TCPConnector(limit=in-flight), evalsup's
default timeouts), same event loop (uvloop), and the same output record shape as evalsup's results.jsonl.
No retries: the benchmark's mock injects no faults, and a failed request is written as an error record.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson

HEADERS = {"Content-Type": "application/json"}
# evalsup run's defaults: --timeout 600, --connect-timeout 10, --read-timeout 120
TIMEOUT = aiohttp.ClientTimeout(total=600.0, sock_connect=10.0, sock_read=120.0)


def parse_args(description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("tasks", help="task file: one {'id', 'messages'} object a line")
    ap.add_argument("--base-url", required=True, help="endpoint base URL including /v1")
    ap.add_argument("--model", default="mock-model")
    ap.add_argument("--inflight", type=int, default=64, help="requests in flight (connector limit too)")
    ap.add_argument("--out", required=True, help="output JSONL file")
    return ap.parse_args()


def session(inflight: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=inflight), timeout=TIMEOUT)


def chat_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/chat/completions"


def request_of(line: bytes, model: str) -> tuple[str, bytes]:
    """A simple task line as (id, request body bytes)."""
    obj = orjson.loads(line)
    return str(obj["id"]), orjson.dumps({"messages": obj["messages"], "model": model})


async def post(session: aiohttp.ClientSession, url: str, payload: bytes) -> tuple[int | None, str, bytes, Any, float]:
    """One attempt: (status or None, request id, raw body, error or None, latency s)."""
    start = time.monotonic()
    try:
        async with session.post(url, data=payload, headers=HEADERS) as resp:
            raw = await resp.read()
            status: int | None = resp.status
            rid = resp.headers.get("x-request-id", "")
    except (aiohttp.ClientError, TimeoutError) as e:
        return None, "", b"", {"code": "connection_error", "message": f"{type(e).__name__}: {e}"[:300]}, 0.0
    err = None if status == 200 else {"code": f"http_{status}", "message": f"HTTP {status}"}
    return status, rid, raw, err, time.monotonic() - start


async def feed(tasks: Path, queue: asyncio.Queue[bytes | None], consumers: int) -> None:
    """The bounded-queue reader: every non-blank task line, then one None per consumer."""
    with open(tasks, "rb") as f:
        for line in f:
            if line.strip():
                await queue.put(line)
    for _ in range(consumers):
        await queue.put(None)


def record(tid: str, status: int | None, rid: str, body: Any, error: Any, latency_s: float) -> dict[str, Any]:
    """evalsup's output record shape (OpenAI Batch output plus metrics)."""
    return {
        "id": tid,
        "custom_id": tid,
        "response": None if status is None else {"status_code": status, "request_id": rid, "body": body},
        "error": error,
        "metrics": {"latency_s": round(latency_s, 6), "attempts": 1},
    }


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        import uvloop
    except ImportError:  # evalsup depends on it; keep the baselines usable without it anyway
        asyncio.run(main())
    else:
        uvloop.run(main())
