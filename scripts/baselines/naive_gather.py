#!/usr/bin/env python3
"""Naive baseline: read every task, asyncio.gather over all of them (a semaphore caps requests in flight),
keep every parsed result in memory, write them all at the end.

    python scripts/baselines/naive_gather.py --base-url URL --inflight 128 --out out.jsonl tasks.jsonl
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from _common import chat_url, parse_args, post, record, request_of, run, session

args = parse_args(__doc__.splitlines()[0])


async def one(http: aiohttp.ClientSession, sem: asyncio.Semaphore, url: str, line: bytes) -> dict[str, Any]:
    tid, payload = request_of(line, args.model)
    async with sem:
        status, rid, raw, err, lat = await post(http, url, payload)
    body: Any = None
    if raw:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            err = {"code": "invalid_json", "message": f"HTTP {status}: response body is not valid JSON"}
    return record(tid, status, rid, body, err, lat)


async def main() -> None:
    with open(args.tasks, "rb") as f:
        lines = [line for line in f if line.strip()]
    sem = asyncio.Semaphore(args.inflight)
    url = chat_url(args.base_url)
    async with session(args.inflight) as http:
        results = await asyncio.gather(*(one(http, sem, url, line) for line in lines))
    with open(args.out, "wb") as out:
        for rec in results:
            out.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))


run(main)
