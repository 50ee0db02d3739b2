"""`evalsup serve` from a test: a server on a free port of 127.0.0.1 in front of the mock, the openai SDK as its
client, a batch's input lines, waiting for a batch's end (tests/integration/test_serve*.py)."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import orjson
from openai.types import Batch

from evalsup.mock.server import MockThread
from tests.harness import Run, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch_lines(n: int, extra: Callable[[int], dict[str, Any]] | None = None,
                url: str = "/v1/chat/completions") -> bytes:
    out = []
    for i in range(n):
        body: dict[str, Any] = {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}]}
        body.update(extra(i) if extra else {})
        out.append(orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}) + b"\n")
    return b"".join(out)


def serve(start: Callable[..., Run], data: Path, mock: MockThread, *extra: str,
          env: dict[str, str] | None = None) -> tuple[Run, str]:
    port = free_port()
    p = start("serve", "--upstream", mock.url, "--data", str(data), "--port", str(port), *extra, env=env)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_until(up, "the server's /health", proc=p)
    return p, base + "/v1"


def client(base: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0)


def wait_ended(c: openai.OpenAI, batch_id: str, proc: Run | None = None) -> Batch:
    out: list[Batch] = []

    def ended() -> bool:
        out[:] = [c.batches.retrieve(batch_id)]
        return out[0].status in ("completed", "failed", "expired", "cancelled")

    wait_until(ended, f"batch {batch_id} to end", proc=proc)
    return out[0]


def output_of(c: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(x) for x in c.files.content(file_id).content.splitlines()]
