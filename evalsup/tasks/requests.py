"""A task line turned into a request: the routes evalsup sends to, the endpoint's URL (joined, and shown without
credentials), and the body with the run's defaults filled in. Worker side, and the connection check."""

from __future__ import annotations

import base64
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from evalsup.tasks.routes import BY_PATH, DEFAULT, ROUTES

BATCH_URLS = tuple(r.path for r in ROUTES)  # the routes a task may name (evalsup.tasks.routes)
# the keys of each input form; any other top-level key goes to the record's metadata (a "metadata" object: its
# keys, beside the others)
BATCH_KEYS = frozenset(("custom_id", "method", "url", "body"))
SIMPLE_KEYS = frozenset(("id", "messages", "prompt"))


def public_url(url: str) -> str:
    """An endpoint's URL as records, logs and the summary show it: no user:password@ and no query (either may
    hold a credential)."""
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError:  # (not a URL: "http://[::1:8000/v1") the same, by hand
        scheme, sep, rest = url.partition("://")
        return scheme + sep + rest.split("?")[0].split("#")[0].rpartition("@")[2]
    host = u.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((u.scheme, host, u.path, "", ""))


def credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without user:password@, the query kept; (user, password), percent-decoded as curl and the openai
    SDK's client read them, or None). Requests go to the first, with the second as HTTP basic auth."""
    u = urllib.parse.urlsplit(url)
    userinfo, at, host = u.netloc.rpartition("@")
    if not at:
        return url, None
    user, _, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit((u.scheme, host, u.path, u.query, u.fragment))
    return bare, (urllib.parse.unquote(user), urllib.parse.unquote(password))


def basic_auth(user: str, password: str) -> str:
    """The Authorization header's value for HTTP basic auth (RFC 7617, UTF-8)."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


# Azure OpenAI's deployment path: its routes sit right under it (.../openai/deployments/NAME/chat/completions)
_AZURE_DEPLOYMENT = re.compile(r"/openai/deployments/[^/]+$")


def join_url(base_url: str, path: str) -> str:
    """The URL of a route (``path``, e.g. "/v1/chat/completions") at an endpoint, as the openai SDK joins them:
    ".../v1" + "/v1/chat/completions" -> ".../v1/chat/completions" (no doubled /v1); an Azure OpenAI deployment
    (".../openai/deployments/NAME") takes the route without /v1; any other base gets it whole. The base's query
    (``?api-version=...``) is kept, after the path (then the path's own, if it has one). User:password@ stays as
    given: ``credentials`` takes it out. The one joiner of both sides (the workers' requests and probes, the
    connection check)."""
    u = urllib.parse.urlsplit(base_url)
    route, _, route_query = path.partition("?")
    base = u.path.rstrip("/")
    if route.startswith("/v1/") and (base.endswith("/v1") or _AZURE_DEPLOYMENT.search(base)):
        route = route[3:]
    query = "&".join(q for q in (u.query, route_query) if q)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, base + route, query, ""))


def url_problem(url: str) -> str | None:
    """What keeps a --base-url from being requested (checked before the run starts), or None."""
    try:
        u = urllib.parse.urlsplit(url)
    except ValueError as e:
        return f"is not a URL ({e})"
    if u.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    try:
        u.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError:
        return "has a port that is not a number from 0 to 65535"
    if not u.hostname:
        return "has no host"
    if u.fragment:
        return "has a #fragment, which is never sent"
    return None


@dataclass(frozen=True, slots=True)
class RequestDefaults:
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False


def metadata_problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with a line's own ``metadata`` (checked by ``reader.validate``, so the pre-scan refuses the
    line before any request), or None: it must be an object, and a key in it may not also be a top-level extra
    key (which would win is not guessed)."""
    own = obj.get("metadata")
    if own is None:
        return None
    if not isinstance(own, dict):
        return f"'metadata' must be an object, not {type(own).__name__}"
    form = BATCH_KEYS if "custom_id" in obj else SIMPLE_KEYS
    both = sorted(k for k in own if k in obj and k not in form and k != "metadata")
    if both:
        return (f"{', '.join(repr(k) for k in both)} is both a key of 'metadata' and a top-level key: keep one "
                "(the record's metadata holds both sets)")
    return None


def _metadata(extra: dict[str, Any]) -> dict[str, Any]:
    """The record's metadata: the line's own ``metadata`` object as given, its other extra keys beside it."""
    own = extra.pop("metadata", None)
    return {**own, **extra} if isinstance(own, dict) else extra


def simple_body(obj: dict[str, Any]) -> dict[str, Any]:
    """The body a simple line (``{"id", "messages"|"prompt", ...}``) sends before the run's defaults: its messages
    (a prompt as one user message). Every other key of the line (``model``, ``max_tokens``, ``n`` too) is its
    record's metadata and never sent: the run's --model and --max-tokens are. ``to_request`` sends this, and
    ``tasks.tokens.figures`` (the budget's reservation and the estimate) prices it, so both read one rule."""
    messages = obj["messages"] if "messages" in obj else [{"role": "user", "content": obj["prompt"]}]
    return {"messages": messages}


def to_request(obj: dict[str, Any], defaults: RequestDefaults) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """A parsed task line as (url path, request body, metadata): the metadata is the line's ``metadata`` object
    as given with its other extra keys beside it (``{"expected": "B", "metadata": {"subject": "law"}}`` gives
    ``{"subject": "law", "expected": "B"}``), what a scorer reads as the task's fields."""
    if "custom_id" in obj:
        url = obj.get("url", DEFAULT.path)
        body = dict(obj["body"])
        meta = _metadata({k: v for k, v in obj.items() if k not in BATCH_KEYS})
    else:
        url = DEFAULT.path
        body = simple_body(obj)
        meta = _metadata({k: v for k, v in obj.items() if k not in SIMPLE_KEYS})
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
