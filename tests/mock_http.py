"""Plain HTTP/1.1 requests to the mock (or any server on 127.0.0.1), answers kept whole (test_mock,
test_server_signals)."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class Resp:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """SSE data payloads, parsed; "[DONE]" stays a string."""
        out: list[Any] = []
        for block in self.body.decode().split("\n\n"):
            if block.strip():
                assert block.startswith("data: "), block
                data = block[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
        return out


def request(base: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Resp:
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return Resp(r.status, r.headers, r.read())
    finally:
        conn.close()
