"""A request's cache key: sha256 of its canonical form.

The canonical form is the request body with its keys sorted and its numbers in one format (a float that is a
whole number is that integer: ``1``, ``1.0`` and ``1.00`` are one key; others are written as orjson writes the
shortest round-trip repr), without what does not change the answer (``stream``, ``stream_options``, ``user``), beside
the endpoint path and the model identity, and the run's JSON schema (``--response-schema``, validated in the
worker and never sent: an answer kept without it, or under another, is not this run's answer; a task's own
``response_format`` is in its body already). A sampled request (temperature above 0, or none given, since the
servers' default is 1; or ``n`` above 1) also carries the task's id, so each task keeps its own sample and a
rerun gets the same samples back; ``salt`` (``--cache-salt``) asks for new ones. The run's extra request headers
(``--header``) that are not secrets are in the key too (``key_headers``, issue 39): a gateway may route on one
to another model or provider, so a changed header is a new key; a secret's value (given as ``env:VAR`` or
``@file``, or under a name such as Authorization or api-key) is never in it. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from evalsup.tasks.headers import HeaderError, split_spec
from evalsup.tasks.requests import public_url
from evalsup.tasks.routes import BY_PATH, route_of

# fields that change how an answer is delivered or attributed, never what it says
LEFT_OUT = frozenset({"stream", "stream_options", "user"})
VERSION = 1  # of the canonical form: a change of it makes every old entry a miss, never a wrong answer
# a header whose name has one of these words (split at - _ .) carries a credential, whatever its value's source:
# never in the key (Authorization, api-key, X-Api-Key, Ocp-Apim-Subscription-Key, X-Auth-Token, Cookie, ...;
# not X-Portkey-Config, a gateway's routing)
SECRET_WORDS = frozenset({"auth", "authorization", "key", "apikey", "token", "secret", "password", "passwd",
                          "cookie", "session", "signature", "sig", "credential", "credentials", "bearer"})


def secret_name(name: str) -> bool:
    return any(w in SECRET_WORDS for w in re.split(r"[-_.]", name.lower()))


def key_headers(specs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The --header specs that are in the key: (name lower-cased, value) of each given as a plain value under a
    name that is not a credential's, the last of a name winning (as the request sends it), sorted; a value
    from ``env:VAR`` or ``@file`` (a secret, never read here) and a spec that cannot be used are left out."""
    out: dict[str, str] = {}
    for spec in specs:
        try:
            name, value = split_spec(spec)
        except HeaderError:
            continue
        lower = name.lower()
        out.pop(lower, None)
        if not value.startswith(("env:", "@")) and not secret_name(lower):
            out[lower] = value
    return tuple(sorted(out.items()))


def normalised(value: Any) -> Any:
    """``value`` with every float that is a whole number (and within 2**53) made an int, recursively."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, dict):
        return {k: normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    return value


def sampled(path: str, body: dict[str, Any]) -> bool:
    """Whether the answer to ``body`` at ``path`` is a sample: a route that samples (not embeddings), with
    ``n`` above 1, or a temperature above 0 or not given (the server's default, 1 at OpenAI and vLLM)."""
    route = BY_PATH.get(path) or route_of(path)
    if route is not None and not route.samples:
        return False
    n = body.get("n")
    if isinstance(n, int | float) and not isinstance(n, bool) and n > 1:
        return True
    t = body.get("temperature")
    return not isinstance(t, int | float) or isinstance(t, bool) or t > 0


@dataclass(frozen=True, slots=True)
class KeyMaker:
    """The run's way to a key: ``model_id`` (``--cache-model-id``: replaces the body's ``model``, so replicas
    under other names share entries), the endpoints (the identity of a body without a ``model``), ``salt``,
    ``schema`` (--response-schema when it is validated: ``schema_in_key``), ``headers`` (``key_headers``)."""

    model_id: str | None = None
    endpoints: Sequence[str] = ()
    salt: str = ""
    schema: dict[str, Any] | None = None
    headers: tuple[tuple[str, str], ...] = ()  # key_headers(--header): not secrets

    def identity(self, body: dict[str, Any]) -> str:
        """The model identity: --cache-model-id, else the body's ``model``, else the endpoints' public URLs
        (an Azure deployment's requests name no model: its URL does)."""
        if self.model_id:
            return self.model_id
        model = body.get("model")
        if isinstance(model, str) and model:
            return model
        return "url:" + ",".join(sorted(public_url(u) for u in self.endpoints))

    def canonical(self, path: str, body: dict[str, Any], task_id: str) -> bytes:
        """The bytes the key hashes (sorted keys, fixed number format)."""
        rest = {k: v for k, v in body.items() if k not in LEFT_OUT and k != "model"}
        form: dict[str, Any] = {"v": VERSION, "path": path, "model": self.identity(body), "body": rest}
        if sampled(path, body):
            form["sample"] = task_id
        if self.salt:
            form["salt"] = self.salt
        if self.schema is not None:
            form["schema"] = self.schema
        if self.headers:  # (absent without --header: the keys of runs without one are as before)
            form["headers"] = [list(h) for h in self.headers]
        try:
            # most bodies hold no whole-number float (orjson writes one, below 2**53, as "N.0"): without ".0" in
            # the bytes, normalising would change nothing, so the walk over the body is skipped (same bytes)
            got = orjson.dumps(form, option=orjson.OPT_SORT_KEYS)
            if b".0" not in got:
                return got
            form["body"] = normalised(rest)
            return orjson.dumps(form, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            form["body"] = normalised(rest)  # an integer past 64 bits: the standard library writes it (sorted, compact)
            import json

            return json.dumps(form, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def key(self, path: str, body: dict[str, Any], task_id: str) -> bytes:
        """The 32-byte key of task ``task_id``'s request ``body`` at ``path``."""
        return hashlib.sha256(self.canonical(path, body, task_id)).digest()


def schema_in_key(response_schema: dict[str, Any] | None, validate: bool) -> dict[str, Any] | None:
    """The run's schema as the key holds it: --response-schema's, when answers are validated (else None)."""
    return response_schema if validate else None
