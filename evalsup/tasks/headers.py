"""Extra request headers (`--header 'Name: value'`, issue 21), evalsup's User-Agent, the API key and HTTP basic
auth from a --base-url's user:password@ (issue 34): every header of a request, built once for both sides
(``request_headers``), so the connection check sends what the tasks send.

A value may come from the environment (``Name: env:VAR``) or a file (``Name: @path``) so a secret is never on a
command line. Only the specs travel (the CONFIG frame); each side resolves them itself, and no value is ever
printed: errors name the header and where its value was to come from, never the value.
"""

from __future__ import annotations

import os
import re

from evalsup import __version__
from evalsup.tasks.requests import basic_auth, credentials, public_url

_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP token (RFC 9110)
# set by evalsup itself: a --header must not replace them (the key has its own flags)
RESERVED = frozenset({"content-type", "content-length", "host", "transfer-encoding", "connection"})


class HeaderError(ValueError):
    """A --header that cannot be used; the message names it, never its value."""


def api_key(key_env: str | None, key_file: str | None) -> str | None:
    """The API key: from --api-key-file, else the environment (--api-key-env, default OPENAI_API_KEY)."""
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            return f.read().strip() or None
    return os.environ.get(key_env or "OPENAI_API_KEY") or None


def key_source(key_env: str | None, key_file: str | None) -> str:
    """Where the API key comes from, for a message (never the key)."""
    return f"the API key in {key_file}" if key_file else f"the API key (${key_env or 'OPENAI_API_KEY'})"


def user_agent() -> str:
    return f"evalsup/{__version__}"


def split_spec(spec: str) -> tuple[str, str]:
    name, sep, value = spec.partition(":")
    name = name.strip()
    if not sep or not _NAME.match(name):
        shown = name if _NAME.match(name) else "(no valid name)"
        raise HeaderError(f"--header {shown}: expected 'Name: value', 'Name: env:VAR' or 'Name: @file'")
    if name.lower() in RESERVED:
        raise HeaderError(f"--header {name}: evalsup sets this header itself")
    return name, value.strip()


def resolve(spec: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """(name, value) of one --header spec. Raises HeaderError."""
    name, raw = split_spec(spec)
    env = dict(os.environ) if env is None else env
    if raw.startswith("env:"):
        var = raw[4:].strip()
        if var not in env:
            raise HeaderError(f"--header {name}: environment variable {var} is not set")
        value = env[var]
    elif raw.startswith("@"):
        path = raw[1:].strip()
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as e:
            raise HeaderError(f"--header {name}: cannot read {path}: {e.strerror}") from None
    else:
        value = raw
    if "\r" in value or "\n" in value:
        raise HeaderError(f"--header {name}: the value holds a line break")
    return name, value


def build_headers(specs: tuple[str, ...] | list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """The User-Agent, then every --header in order (a --header User-Agent replaces evalsup's)."""
    out = {"User-Agent": user_agent()}
    for spec in specs:
        name, value = resolve(spec, env)
        for k in [k for k in out if k.lower() == name.lower()]:
            del out[k]
        out[name] = value
    return out


def secret_values(specs: tuple[str, ...] | list[str], env: dict[str, str] | None = None) -> list[str]:
    """The values given as secrets (env:VAR, @file), to scrub from whatever an endpoint echoes back."""
    out = []
    for spec in specs:
        if split_spec(spec)[1].startswith(("env:", "@")):
            value = resolve(spec, env)[1]
            if len(value) >= 4:
                out.append(value)
    return out


def request_headers(base_url: str, common: dict[str, str], key: str | None,
                    key_from: str = "the API key") -> dict[str, str]:
    """Every header of a request to the endpoint at ``base_url``: Content-Type, ``common`` (``build_headers``'
    User-Agent and --header), and the Authorization: ``Bearer KEY``, or HTTP basic auth from the URL's
    user:password@ (sent as curl and the openai SDK's client send it; the URL is then requested without it,
    ``requests.credentials``). Both would be the one Authorization header, as would user:password@ and a
    --header Authorization: HeaderError (``key_from`` names the key's source), never a silent choice."""
    out = {"Content-Type": "application/json", **common}
    _, userinfo = credentials(base_url)
    if userinfo is not None:
        where = f"--base-url {public_url(base_url)}: its user:password@ (HTTP basic auth)"
        if key:
            raise HeaderError(f"{where} and {key_from} would both be the Authorization header: drop one, or "
                              "send the key in a header of its own (--header 'api-key: env:VAR')")
        if any(k.lower() == "authorization" for k in common):
            raise HeaderError(f"{where} and --header Authorization would both be the Authorization header: "
                              "give one")
        out["Authorization"] = basic_auth(*userinfo)
    elif key:
        out["Authorization"] = f"Bearer {key}"
    return out
