"""Extra request headers (`--header 'Name: value'`, issue 21), evalsup's User-Agent and the API key.

A value may come from the environment (``Name: env:VAR``) or a file (``Name: @path``) so a secret is never on a
command line. Only the specs travel (the CONFIG frame); each side resolves them itself, and no value is ever
printed: errors name the header and where its value was to come from, never the value.
"""

from __future__ import annotations

import os
import re

from evalsup import __version__

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
