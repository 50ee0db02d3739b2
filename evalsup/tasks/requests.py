"""A task line turned into a request: the routes evalsup sends to, the endpoint's URL (joined, and shown without
credentials), and the body with the run's defaults filled in. Worker side, and the connection check."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from evalsup.tasks.routes import BY_PATH, DEFAULT, ROUTES

BATCH_URLS = tuple(r.path for r in ROUTES)  # the routes a task may name (evalsup.tasks.routes)
# the keys of each input form; any other top-level key goes to the record's metadata
BATCH_KEYS = frozenset(("custom_id", "method", "url", "body"))
SIMPLE_KEYS = frozenset(("id", "messages", "prompt"))



def public_url(url: str) -> str:
    """An endpoint's URL as records, logs and the summary show it: no user:password@ and no query (either may
    hold a credential)."""
    u = urllib.parse.urlsplit(url)
    host = u.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((u.scheme, host, u.path, "", ""))


def join_url(base_url: str, path: str) -> str:
    """base ".../v1" + "/v1/chat/completions" -> ".../v1/chat/completions" (no doubled /v1), as the openai SDK."""
    base = base_url.rstrip("/")
    if base.endswith("/v1") and path.startswith("/v1/"):
        path = path[3:]
    return base + path


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False


def to_request(obj: dict[str, Any], defaults: RequestDefaults) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A parsed task line as (url path, request body, metadata of extra keys)."""
    if "custom_id" in obj:
        url = obj.get("url", DEFAULT.path)
        body = dict(obj["body"])
        meta = {k: v for k, v in obj.items() if k not in BATCH_KEYS}
    else:
        url = DEFAULT.path
        messages = obj["messages"] if "messages" in obj else [{"role": "user", "content": obj["prompt"]}]
        body = {"messages": messages}
        meta = {k: v for k, v in obj.items() if k not in SIMPLE_KEYS}
        if "mock" in meta:  # the project's mock server reads per-request test behaviour from the body
            body["mock"] = meta.pop("mock")
    if defaults.model is not None:
        body.setdefault("model", defaults.model)
    route = BY_PATH.get(url)
    samples = route is None or route.samples  # a route evalsup does not know of gets them too
    if defaults.max_tokens is not None and samples:
        body.setdefault("max_tokens", defaults.max_tokens)
    if defaults.temperature is not None and samples:
        body.setdefault("temperature", defaults.temperature)
    if defaults.stream and route is not None and route.streams:
        body.setdefault("stream", True)
    return url, body, meta
