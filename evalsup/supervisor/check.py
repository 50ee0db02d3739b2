"""The connection check before a run: one tiny request, so a wrong URL, key or model stops the run at once."""

from __future__ import annotations

import asyncio
import http.client
import ssl
import urllib.parse

import orjson

from evalsup.config.run_config import RunConfig
from evalsup.scoring.judge import judge_check_problem
from evalsup.tasks.headers import (
    HeaderError,
    api_key,
    build_headers,
    key_source,
    request_headers,
)
from evalsup.tasks.requests import credentials, join_url, public_url
from evalsup.tasks.routes import BY_PATH, CHAT, probe_body, served_models


class CheckFailed(Exception):
    """The endpoint cannot serve this run; the message says which and how to fix it."""


def first_request(cfg: RunConfig) -> tuple[str, str | None]:
    """The route the first task line names (a known one; else chat completions, the simple form's) and the model
    (--model, or the one that line names): what the check's tiny request asks, as the tasks will."""
    path, model = CHAT.path, cfg.worker.model
    with open(cfg.tasks_path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError:
                    break
                if not isinstance(obj, dict):
                    break
                url = obj.get("url")
                if isinstance(url, str) and url in BY_PATH and probe_body(url, "m") is not None:
                    path = url
                body = obj.get("body")
                m = body.get("model") if isinstance(body, dict) else None
                model = model or (m if isinstance(m, str) else None)
                break
    return path, model


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


class _Unsendable(Exception):
    """The request could not be made at all (a header, the URL): a setting is wrong, not the endpoint."""


def _http(cfg: RunConfig, method: str, url: str, headers: dict[str, str],
          body: bytes | None = None) -> tuple[int, bytes]:
    """One request with the standard library (the supervisor does not load aiohttp for one request): the
    connection within --connect-timeout, the answer within 30 s. Raises _Unreachable, or _Unsendable when the
    request could not be made (a ValueError that is no connection's: a header value, the URL)."""
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
    except (OSError, http.client.HTTPException) as e:  # (ssl's certificate errors are OSErrors too)
        raise _Unreachable(f"{type(e).__name__}: {e}") from None
    except ValueError as e:
        raise _Unsendable(f"{type(e).__name__}: {e}") from None


def _check(cfg: RunConfig, url: str) -> str:
    base = public_url(url)  # for messages: no credentials
    key = api_key(cfg.worker.api_key_env, cfg.worker.api_key_file)
    # exactly what the workers send (tasks.headers.request_headers): Content-Type, User-Agent, --header, and the
    # key or the URL's basic auth; to the URL without user:password@, its query kept (issue 34)
    try:
        headers = request_headers(url, build_headers(cfg.worker.headers), key,
                                  key_source(cfg.worker.api_key_env, cfg.worker.api_key_file))
    except HeaderError as e:  # (refused by build_config before a run starts)
        raise CheckFailed(str(e)) from None
    address = credentials(url)[0]
    path, model = first_request(cfg)
    auth_hint = (f"the endpoint refused the API key: set ${cfg.worker.api_key_env}"
                 " (or --api-key-env NAME / --api-key-file PATH)" if not cfg.worker.api_key_file
                 else f"the endpoint refused the API key in {cfg.worker.api_key_file}")
    if credentials(url)[1] is not None and not key:
        auth_hint = f"the endpoint refused the user:password in --base-url {base} (HTTP basic auth)"
    try:
        status, data = _http(cfg, "GET", join_url(address, "/v1/models"), headers)
    except _Unsendable as e:
        raise CheckFailed(_unsendable(base, address, e)) from None
    except _Unreachable as e:
        raise CheckFailed(f"cannot reach the endpoint {base}: {e} (is the server running? is --base-url / "
                          "$OPENAI_BASE_URL right? --no-check skips this check)") from None
    if status in (401, 403):
        raise CheckFailed(f"{auth_hint} (HTTP {status}: {_message(data, key)})")
    served = served_models(status, data)
    if model and served:
        if model not in served:
            raise CheckFailed(f"model {model!r} is not served by {base}; it serves: {', '.join(served[:10])}")
        return f"endpoint {base} is up and serves {model}"
    if not model:
        return f"endpoint {base} is up"
    body = probe_body(path, model)
    try:
        status, data = _http(cfg, "POST", join_url(address, path), headers, orjson.dumps(body))
    except _Unsendable as e:
        raise CheckFailed(_unsendable(base, address, e)) from None
    except _Unreachable as e:
        raise CheckFailed(f"cannot reach the endpoint {base}: {e}") from None
    if status in (401, 403):
        raise CheckFailed(f"{auth_hint} (HTTP {status}: {_message(data, key)})")
    if status == 404:
        raise CheckFailed(f"model {model!r} or its route is not found at {base} (HTTP 404: {_message(data, key)})")
    return f"endpoint {base} answered HTTP {status} for {model}"


def _unsendable(base: str, address: str, e: Exception) -> str:
    return (f"a request to {base} could not be sent ({str(e).replace(address, base)}): a setting is wrong, not the "
            "endpoint; nothing was sent")


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
    if cfg.worker.judge_base_url is not None:  # --scorer judge: the judge is checked too, and cannot be left out
        found.append(await asyncio.to_thread(_check_judge, cfg, cfg.worker.judge_base_url))
    return found, failed


def _check_judge(cfg: RunConfig, url: str) -> str:
    """The judge's endpoint (--judge-base-url): reachable, its key taken, its model served (GET /models, as the
    judge's requests go: the User-Agent and the judge's key only). Raises CheckFailed."""
    w = cfg.worker
    base = public_url(url)
    if w.judge_api_key_env:
        key, source = api_key(w.judge_api_key_env, None), f"the judge's API key (${w.judge_api_key_env})"
    else:
        key, source = api_key(w.api_key_env, w.api_key_file), key_source(w.api_key_env, w.api_key_file)
    try:
        headers = request_headers(url, build_headers(()), key, source)
        status, data = _http(cfg, "GET", join_url(credentials(url)[0], "/v1/models"), headers)
    except (HeaderError, _Unsendable) as e:
        raise CheckFailed(f"--judge-base-url {base}: {e}") from None
    except _Unreachable as e:
        raise CheckFailed(f"cannot reach the judge {base}: {e} (is --judge-base-url right? --no-check skips "
                          "this check)") from None
    served = served_models(status, data)
    problem = judge_check_problem(base, status, served, w.judge_model or "", source,
                                  _message(data, key) if status in (401, 403) else "")
    if problem is not None:
        raise CheckFailed(problem)
    return f"judge {base} is up" + (f" and serves {w.judge_model}" if served else "")


async def check_endpoint(cfg: RunConfig, url: str | None = None) -> str:
    """Returns a line describing what was found at ``url`` (default: the first endpoint); raises CheckFailed.
    Runs in a thread, while workers start."""
    try:
        return await asyncio.to_thread(_check, cfg, url or cfg.worker.base_url)
    except CheckFailed as e:  # an endpoint may echo any secret of the run (tasks.secrets)
        raise CheckFailed(cfg.scrub.text(str(e))) from None
