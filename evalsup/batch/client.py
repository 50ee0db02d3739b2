"""The provider's Files and Batches APIs over aiohttp: each call once, its failure a ``ProviderError`` (the
driver decides whether to try again). The base URL is the run's first ``--base-url`` (``.../v1``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from evalsup.tasks.requests import join_url


class ProviderError(Exception):
    """A call the provider refused or that did not get through. ``status`` None: no answer (connection)."""

    def __init__(self, status: int | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    @property
    def transient(self) -> bool:
        """Worth trying again: no answer, flow control, or the server's fault."""
        return self.status is None or self.status in (408, 409, 429) or self.status >= 500


class BatchClient:
    def __init__(self, session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> None:
        self.session = session
        self.base = base_url
        self.headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}

    def url(self, path: str) -> str:
        return join_url(self.base, path)

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        kw.setdefault("headers", self.headers)
        try:
            async with self.session.request(method, self.url(path), **kw) as r:
                raw = await r.read()
                if r.status != 200:
                    raise _refused(r.status, raw)
                return orjson.loads(raw)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as e:
            raise ProviderError(None, f"{method} {path}: {type(e).__name__}: {e}") from None

    async def upload(self, name: str, data: bytes) -> dict[str, Any]:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename=name, content_type="application/jsonl")
        return dict(await self._call("POST", "/files", data=form))

    async def files(self) -> list[dict[str, Any]]:
        got = await self._call("GET", "/files", params={"purpose": "batch"})
        return list(got.get("data") or [])

    async def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str]) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window, "metadata": metadata}
        return dict(await self._call("POST", "/batches", data=orjson.dumps(body),
                                     headers={**self.headers, "Content-Type": "application/json"}))

    async def retrieve(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/batches/{batch_id}"))

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return dict(await self._call("POST", f"/batches/{batch_id}/cancel"))

    async def batches(self, page: int = 100) -> AsyncIterator[dict[str, Any]]:
        """Every batch of the account, newest first, page by page (``after``/``limit``)."""
        after: str | None = None
        while True:
            params = {"limit": str(page)} | ({"after": after} if after else {})
            got = await self._call("GET", "/batches", params=params)
            data = list(got.get("data") or [])
            for b in data:
                yield b
            if not got.get("has_more") or not data:
                return
            after = str(data[-1]["id"])

    async def download(self, file_id: str, path: Path) -> None:
        """A file's content to ``path`` (streamed; the caller renames it into place)."""
        await download(self.session, self.url(f"/files/{file_id}/content"), self.headers, path,
                       f"GET /files/{file_id}/content", _refused)


async def download(session: aiohttp.ClientSession, url: str, headers: dict[str, str], path: Path, what: str,
                   refused: Callable[[int, bytes], ProviderError]) -> None:
    """GET ``url`` into ``path``, streamed a MiB at a time (either provider's results: the caller renames the file
    into place); a non-200 answer is ``refused(status, body)``, a failed connection a ProviderError naming
    ``what``."""
    try:
        async with session.get(url, headers=headers) as r:
            if r.status != 200:
                raise refused(r.status, await r.read())
            with open(path, "wb") as f:
                async for piece in r.content.iter_chunked(1 << 20):
                    f.write(piece)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise ProviderError(None, f"{what}: {type(e).__name__}: {e}") from None


def _refused(status: int, raw: bytes) -> ProviderError:
    try:
        err = orjson.loads(raw).get("error") or {}
        return ProviderError(status, f"HTTP {status}: {err.get('message') or ''}".strip(), err.get("code"))
    except (orjson.JSONDecodeError, AttributeError):
        return ProviderError(status, f"HTTP {status}")
