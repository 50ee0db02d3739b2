"""The connection check before a run: one tiny request, so a wrong URL, key or model stops the run at once."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import urllib.parse

import orjson

from evalsup.config.run_config import RunConfig
from evalsup.tasks.headers import api_key, build_headers, secret_values
from evalsup.tasks.requests import join_url, public_url
from evalsup.tasks.routes import CHAT, probe_body


class CheckFailed(Exception):
    """The endpoint cannot serve this run; the message says which and how to fix it."""


def first_model(cfg: RunConfig) -> str | None:
    """--model, or the model named by the first task line."""
    if cfg.worker.model:
        return cfg.worker.model
    with open(cfg.tasks_path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    return None
                body = obj.get("body") if isinstance(obj, dict) else None
                m = body.get("model") if isinstance(body, dict) else None
                return m if isinstance(m, str) else None
    return None


def _message(data: bytes, key: str | None) -> str:
    try:
        err = orjson.loads(data).get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (orjson.JSONDecodeError, AttributeError):
        msg = None
    text = str(msg or data[:200].decode("utf-8", "replace")).strip()
    return text.replace(key, "[redacted]") if key else text


class _Unreachable(Exception):
    pass


def _http(cfg: RunConfig, method: str, url: str, headers: dict[str, str],
          body: bytes | None = None) -> tuple[int, bytes]:
    """One request with the standard library (the supervisor does not load aiohttp for one request): the
    connection within --connect-timeout, the answer within 30 s. Raises _Unreachable."""
    u = urllib.parse.urlsplit(url)
    try:
        conn: http.client.HTTPConnection
        if u.scheme == "https":
            ctx = ssl._create_unverified_context() if cfg.worker.insecure else ssl.create_default_context()
            conn = http.client.HTTPSConnection(u.hostname or "", u.port, timeout=cfg.worker.connect_timeout_s,
                                               context=ctx)
        else:
            conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=cfg.worker.connect_timeout_s)
        try:
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(30)
            conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.read(1 << 20)
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise _Unreachable(f"{type(e).__name__}: {e}") from None


def _check(cfg: RunConfig, url: str) -> str:
    base = public_url(url)  # for messages: no credentials
    key = api_key(cfg.worker.api_key_env, cfg.worker.api_key_file)
    headers = build_headers(cfg.worker.headers)  # issue 21: --header and the User-Agent, as the workers send
    if key:
        headers["Authorization"] = f"Bearer {key}"
    model = first_model(cfg)
    auth_hint = (f"the endpoint refused the API key: set ${cfg.worker.api_key_env}"
                 " (or --api-key-env NAME / --api-key-file PATH)" if not cfg.worker.api_key_file
                 else f"the endpoint refused the API key in {cfg.worker.api_key_file}")
    try:
        status, data = _http(cfg, "GET", join_url(url, "/v1/models"), headers)
    except _Unreachable as e:
        raise CheckFailed(f"cannot reach the endpoint {base}: {e} (is the server running? is --base-url / "
                          "$OPENAI_BASE_URL right? --no-check skips this check)") from None
    if status in (401, 403):
        raise CheckFailed(f"{auth_hint} (HTTP {status}: {_message(data, key)})")
    served: list[str] = []
    if status == 200:
        try:
            served = [m["id"] for m in orjson.loads(data).get("data", []) if isinstance(m, dict) and "id" in m]
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            served = []
    if model and served:
        if model not in served:
            raise CheckFailed(f"model {model!r} is not served by {base}; it serves: {', '.join(served[:10])}")
        return f"endpoint {base} is up and serves {model}"
    if not model:
        return f"endpoint {base} is up"
    body = probe_body(CHAT.path, model)
    try:
        status, data = _http(cfg, "POST", join_url(url, CHAT.path),
                             {**headers, "Content-Type": "application/json"}, orjson.dumps(body))
    except _Unreachable as e:
        raise CheckFailed(f"cannot reach the endpoint {base}: {e}") from None
    if status in (401, 403):
        raise CheckFailed(f"{auth_hint} (HTTP {status}: {_message(data, key)})")
    if status == 404:
        raise CheckFailed(f"model {model!r} or its route is not found at {base} (HTTP 404: {_message(data, key)})")
    return f"endpoint {base} answered HTTP {status} for {model}"


async def check_endpoints(cfg: RunConfig) -> tuple[list[str], dict[int, str]]:
    """Every endpoint at once (issue 21 item 1): the lines describing what was found, and the failures by the
    endpoint's index (those are left out of the run). Raises CheckFailed when every endpoint fails: with one
    endpoint, its own message."""
    urls = cfg.worker.endpoints
    got = await asyncio.gather(*(check_endpoint(cfg, u) for u in urls), return_exceptions=True)
    found: list[str] = []
    failed: dict[int, str] = {}
    for i, r in enumerate(got):
        if isinstance(r, CheckFailed):
            failed[i] = str(r)
        elif isinstance(r, BaseException):
            raise r
        else:
            found.append(r)
    if len(failed) == len(urls):
        if len(urls) == 1:
            raise CheckFailed(failed[0])
        raise CheckFailed("no endpoint passed the connection check: "
                          + "; ".join(f"endpoint {i}: {m}" for i, m in failed.items()))
    return found, failed


async def check_endpoint(cfg: RunConfig, url: str | None = None) -> str:
    """Returns a line describing what was found at ``url`` (default: the first endpoint); raises CheckFailed.
    Runs in a thread, while workers start."""
    try:
        return await asyncio.to_thread(_check, cfg, url or cfg.worker.base_url)
    except CheckFailed as e:  # issue 21: an endpoint may echo a --header secret in its error
        msg = str(e)
        for secret in secret_values(cfg.worker.headers):
            msg = msg.replace(secret, "[redacted]")
        raise CheckFailed(msg) from None
