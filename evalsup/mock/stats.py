"""Live counters of the mock server (GET /_mock/stats). Bounded memory: no request bodies are kept."""

from __future__ import annotations

import collections
import re
import time
from typing import Any

MAX_ARRIVALS = 200_000
KNOWN_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/models"})


# Azure OpenAI's routes, counted whatever the deployment's name
_AZURE = re.compile(r"^/openai/deployments/[^/]+/")
AZURE_PATHS = frozenset(f"/openai/deployments/*/{r}" for r in ("chat/completions", "completions", "embeddings"))


class MockStats:
    """Counters for /v1 requests. Only touched from the server's event loop."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.requests = 0
        self.by_path: dict[str, int] = {}
        self.statuses: dict[str, int] = {}
        self.faults: dict[str, int] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.arrivals: collections.deque[float] = collections.deque(maxlen=MAX_ARRIVALS)
        self.auth_headers_seen = 0
        self.bytes_out = 0
        self.billed: dict[str, list[int]] = {}  # model -> [answers, prompt tokens, completion tokens]
        self.billed_keys: dict[str, int] = {}  # with MockConfig.bill: a request's first message -> answers billed

    def reset(self) -> None:
        """Clear everything but the requests still in flight."""
        in_flight = self.in_flight
        self._clear()
        self.in_flight = in_flight
        self.max_in_flight = in_flight

    def arrival(self, path: str, has_auth: bool) -> None:
        self.requests += 1
        key = path
        if key not in KNOWN_PATHS:
            key = _AZURE.sub("/openai/deployments/*/", path, 1)
            if key not in AZURE_PATHS:
                key = "other"
        self.by_path[key] = self.by_path.get(key, 0) + 1
        self.arrivals.append(time.time())
        if has_auth:
            self.auth_headers_seen += 1

    def enter(self) -> None:
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight

    def leave(self) -> None:
        self.in_flight -= 1

    def status(self, code: int, nbytes: int = 0) -> None:
        key = str(code)
        self.statuses[key] = self.statuses.get(key, 0) + 1
        self.bytes_out += nbytes

    def bill(self, model: str, prompt_tokens: int, completion_tokens: int, key: str | None) -> None:
        """An answer generated (whether or not the client is still there to read it: a provider bills what it
        generated): by model always, by ``key`` (the first message's text) when the mock is asked to keep them."""
        b = self.billed.setdefault(model, [0, 0, 0])
        b[0] += 1
        b[1] += prompt_tokens
        b[2] += completion_tokens
        if key is not None:
            self.billed_keys[key] = self.billed_keys.get(key, 0) + 1

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_path": dict(self.by_path),
            "statuses": dict(self.statuses),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "arrivals": list(self.arrivals),
            "auth_headers_seen": self.auth_headers_seen,
            "faults": dict(self.faults),
            "bytes_out": self.bytes_out,
            "billed": {m: {"answers": a, "prompt_tokens": p, "completion_tokens": c}
                       for m, (a, p, c) in self.billed.items()},
            "billed_keys": dict(self.billed_keys),
        }
