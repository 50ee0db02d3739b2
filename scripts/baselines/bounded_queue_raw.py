#!/usr/bin/env python3
"""Bounded-queue baseline, raw: like bounded_queue.py, but each response's bytes go into the output line
as they came (orjson.Fragment), without parsing them; only a body that is not one line is parsed.

    python scripts/baselines/bounded_queue_raw.py --base-url URL --inflight 128 --out out.jsonl tasks.jsonl
"""

from __future__ import annotations

import asyncio
from typing import IO, Any

import aiohttp
import orjson
from _common import chat_url, feed, parse_args, post, record, request_of, run, session

args = parse_args(__doc__.splitlines()[0])


def raw_body(raw: bytes) -> Any:
    if b"\n" not in raw and b"\r" not in raw:
        return orjson.Fragment(raw)  # trusted to be JSON: written as is (a JSONL line must stay one line)
    return orjson.loads(raw)


async def consumer(http: aiohttp.ClientSession, url: str, queue: asyncio.Queue[bytes | None], out: IO[bytes]) -> None:
    while (line := await queue.get()) is not None:
        tid, payload = request_of(line, args.model)
        status, rid, raw, err, lat = await post(http, url, payload)
        body: Any = None
        if raw:
            try:
                body = raw_body(raw)
            except orjson.JSONDecodeError:
                err = {"code": "invalid_json", "message": f"HTTP {status}: response body is not valid JSON"}
        out.write(orjson.dumps(record(tid, status, rid, body, err, lat), option=orjson.OPT_APPEND_NEWLINE))


async def main() -> None:
    n = args.inflight
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=2 * n)
    url = chat_url(args.base_url)
    with open(args.out, "wb", buffering=1 << 20) as out:
        async with session(n) as http:
            await asyncio.gather(feed(args.tasks, queue, n), *(consumer(http, url, queue, out) for _ in range(n)))


run(main)
