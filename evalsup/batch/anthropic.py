"""Anthropic's Message Batches API over aiohttp (``--batch-provider anthropic``): each call once, its failure
a ``ProviderError`` (the driver decides whether to try again), as ``client.BatchClient`` for OpenAI's.

``POST /v1/messages/batches`` (``{"requests": [{custom_id, params}]}``: the chunk's input file's lines, sent
inline: there is no upload), ``GET /v1/messages/batches/{id}``, ``POST /v1/messages/batches/{id}/cancel``,
``GET /v1/messages/batches`` (newest first, ``after_id``/``limit`` pages) and the batch's ``results_url``.
Headers: ``x-api-key`` (the key, from the environment; never shown) and ``anthropic-version``; no
Authorization.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from evalsup.batch.client import ProviderError, download
from evalsup.tasks.anthropic import ANTHROPIC_VERSION
from evalsup.tasks.requests import join_url


def anthropic_headers(common: dict[str, str], key: str | None) -> dict[str, str]:
    """Every header of a call: ``common`` (User-Agent and --header), the key as x-api-key, the API version."""
    out = {k: v for k, v in common.items() if k.lower() not in ("authorization", "content-type")}
    out.setdefault("anthropic-version", ANTHROPIC_VERSION)
    if key:
        out["x-api-key"] = key
    return out


class AnthropicClient:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> None:
        self.session = session
        self.base = base_url
        self.headers = headers

    def url(self, path: str) -> str:
        return join_url(self.base, path)

    async def _call(self, method: str, url: str, what: str, **kw: Any) -> dict[str, Any]:
        kw.setdefault("headers", self.headers)
        try:
            async with self.session.request(method, url, **kw) as r:
                raw = await r.read()
                if r.status != 200:
                    raise refused(r.status, raw)
                got = orjson.loads(raw)
                return dict(got) if isinstance(got, dict) else {}
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as e:
            raise ProviderError(None, f"{method} {what}: {type(e).__name__}: {e}") from None

    async def create(self, lines: bytes) -> dict[str, Any]:
        """A batch of the requests in ``lines`` (a chunk's input file: one ``{custom_id, params}`` a line)."""
        body = b'{"requests":[' + b",".join(x for x in lines.splitlines() if x.strip()) + b"]}"
        return await self._call("POST", self.url("/v1/messages/batches"), "/v1/messages/batches", data=body,
                                headers={**self.headers, "Content-Type": "application/json"})

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return await self._call("GET", self.url(f"/v1/messages/batches/{batch_id}"), f"batch {batch_id}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self._call("POST", self.url(f"/v1/messages/batches/{batch_id}/cancel"),
                                f"cancel of {batch_id}")

    async def batches(self, page: int = 100) -> AsyncIterator[dict[str, Any]]:
        """Every batch of the account, newest first, page by page (``after_id``/``limit``)."""
        after: str | None = None
        while True:
            params = {"limit": str(page)} | ({"after_id": after} if after else {})
            got = await self._call("GET", self.url("/v1/messages/batches"), "/v1/messages/batches", params=params)
            data = [b for b in got.get("data") or [] if isinstance(b, dict)]
            for b in data:
                yield b
            if not got.get("has_more") or not data:
                return
            after = str(got.get("last_id") or data[-1]["id"])

    async def first_result(self, results_url: str) -> dict[str, Any] | None:
        """The first line of a batch's results (to tell whose batch it is), or None when it has none."""
        try:
            async with self.session.get(results_url, headers=self.headers) as r:
                if r.status != 200:
                    raise refused(r.status, await r.read())
                line = await r.content.readline()
                got = orjson.loads(line) if line.strip() else None
                return got if isinstance(got, dict) else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as e:
            raise ProviderError(None, f"GET results: {type(e).__name__}: {e}") from None

    async def download(self, results_url: str, path: Path) -> None:
        """A batch's results to ``path`` (streamed; the caller renames it into place)."""
        await download(self.session, results_url, self.headers, path, "GET results", refused)


def refused(status: int, raw: bytes) -> ProviderError:
    """Anthropic's error (``{"type": "error", "error": {"type", "message"}}``) as a ProviderError."""
    try:
        err = orjson.loads(raw).get("error") or {}
        return ProviderError(status, f"HTTP {status}: {err.get('message') or ''}".strip(), err.get("type"))
    except (orjson.JSONDecodeError, AttributeError):
        return ProviderError(status, f"HTTP {status}")
