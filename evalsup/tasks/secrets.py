"""Every secret a run knows, on one list, and the one scrubber that takes them out of whatever is written
(issue 39 item 4): the API keys, a base URL's basic-auth password (and the token made of it), every value of a
base URL's query (``?sig=``, ``?api-key=``, ``?code=``...: a query may hold a credential; only ``api-version``,
which is public and which an error names usefully, is kept), and the ``--header`` values given as ``env:VAR`` or
``@file``. ``Scrubber`` is built once from them; each writer (the worker's records and messages, the supervisor's
log, events and summary, the connection check, `evalsup score`) passes its text through it.

An endpoint echoes what it was sent in its own way: a query value raw (percent-encoded as given), decoded, or
encoded again, inside JSON (``/`` maybe as ``\\/``). Each of those forms is on the list; the longest is
replaced first. A value shorter than ``MIN_LEN`` is not scrubbed: replacing ``"json"`` or ``"1"`` in every answer
would damage the records and protect nothing.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, AnyStr

import orjson

from evalsup.tasks.headers import api_key, secret_values
from evalsup.tasks.requests import basic_auth, credentials

REDACTED = "[redacted]"
_REDACTED = REDACTED.encode()
_ALNUM = re.compile(r"[A-Za-z0-9]+")
MIN_LEN = 4
PUBLIC_QUERY = frozenset({"api-version"})  # Azure OpenAI's: public, and what its errors are about


def url_secrets(base_url: str) -> list[str]:
    """What of a base URL is secret: its password and the basic-auth token made of it, and its query's values
    (all but ``PUBLIC_QUERY``'s), as given (the forms an echo may take are ``forms``')."""
    out: list[str] = []
    try:
        _, userinfo = credentials(base_url)
        query = urllib.parse.urlsplit(base_url).query
    except ValueError:  # not a URL (refused elsewhere): its query by hand
        userinfo, query = None, base_url.partition("?")[2].partition("#")[0]
    if userinfo is not None:
        out += [userinfo[1], basic_auth(*userinfo).partition(" ")[2]]
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if urllib.parse.unquote_plus(name).lower() not in PUBLIC_QUERY:
            out.append(value)
    return [s for s in out if len(s) >= MIN_LEN]


def forms(value: str) -> set[str]:
    """The ways an endpoint may echo ``value``: as given, percent-decoded, percent-encoded again (each way),
    and each of those escaped as in a JSON string (with ``/`` as ``\\/`` too)."""
    plain: set[str] = set()
    for d in {value, urllib.parse.unquote(value), urllib.parse.unquote_plus(value)}:
        plain |= {d, urllib.parse.quote(d, safe=""), urllib.parse.quote(d, safe="/:"), urllib.parse.quote_plus(d)}
    out = set(plain)
    for s in plain:
        escaped = s.replace("\\", "\\\\").replace('"', '\\"')
        out |= {escaped, escaped.replace("/", "\\/")}
    return {s for s in out if len(s) >= MIN_LEN}


def anchor(group: Iterable[str]) -> str | None:
    """The longest run of letters and digits found in every form of one secret (no encoding or escape changes
    them), or None when there is none of 3 or more: the one string a text is searched for before the forms."""
    group = list(group)
    shortest = min(group, key=len)
    runs: list[str] = _ALNUM.findall(shortest)
    for run in sorted(runs, key=len, reverse=True):
        if len(run) >= 3 and all(run in g for g in group):
            return run
    return None


@dataclass(frozen=True)
class Scrubber:
    """The run's secrets in every form (``forms``), longest first; ``text`` and ``raw`` replace each with
    ``[redacted]``. Empty (a run with no secret), it returns what it is given.

    A text is searched once for each secret's ``anchor``, and for that secret's forms only when it is there:
    the cost of a clean text is one search a secret, not one a form (a 16 KiB body, a key, a password and a
    query value: 9 forms, 3 searches)."""

    secrets: tuple[str, ...] = ()
    encoded: tuple[bytes, ...] = field(default=(), repr=False)  # the same, UTF-8
    anchors: tuple[str, ...] = field(default=(), repr=False)
    anchors_encoded: tuple[bytes, ...] = field(default=(), repr=False)
    gate: tuple[int, ...] = field(default=(), repr=False)  # each form's anchor (an index), -1: none

    @classmethod
    def of(cls, values: Iterable[str | None]) -> Scrubber:
        by_form: dict[str, int] = {}
        anchors: list[str] = []
        for v in values:
            if not v or len(v) < MIN_LEN:
                continue
            group = forms(v)
            a = anchor(group)
            if a is not None and a not in anchors:
                anchors.append(a)
            for f in group:  # a form of two secrets (never in practice) is searched for always
                gate = anchors.index(a) if a is not None else -1
                by_form[f] = gate if by_form.get(f, gate) == gate else -1
        ordered = tuple(sorted(by_form, key=lambda s: (-len(s), s)))
        return cls(ordered, tuple(s.encode() for s in ordered), tuple(anchors), tuple(a.encode() for a in anchors),
                   tuple(by_form[f] for f in ordered))

    @classmethod
    def for_run(cls, urls: Iterable[str], headers: Iterable[str] = (), keys: Iterable[str | None] = (),
                env: dict[str, str] | None = None) -> Scrubber:
        """The scrubber of a run: the base URLs' secrets, the --header specs' env:/@file values (one that cannot
        be read is refused where it is used, and adds nothing here) and the keys."""
        values: list[str | None] = [*keys]
        for u in urls:
            values += url_secrets(u)
        for spec in headers:
            try:
                values += secret_values([spec], env)
            except ValueError:  # (HeaderError)
                continue
        return cls.of(values)

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def text(self, s: str) -> str:
        return _scrubbed(s, self.secrets, self.anchors, self.gate, REDACTED)

    def json(self, value: Any) -> Any:
        """``value`` (a small JSON value: an error, scorers' messages) with the secrets out of its strings."""
        if not self.secrets:
            return value
        raw = orjson.dumps(value)
        clean = self.raw(raw)  # (each secret's JSON-escaped form is on the list)
        if clean == raw:
            return value
        try:
            return orjson.loads(clean)
        except orjson.JSONDecodeError:  # a secret that cut an escape in two: the text goes, never the secret
            return REDACTED

    def raw(self, b: bytes) -> bytes:
        return _scrubbed(b, self.encoded, self.anchors_encoded, self.gate, _REDACTED)


def _scrubbed(s: AnyStr, secrets: Sequence[AnyStr], anchors: Sequence[AnyStr], gate: Sequence[int],
              redacted: AnyStr) -> AnyStr:
    """``s`` with each secret replaced, the text and the bytes forms alike: a secret gated on an anchor is looked
    for only where its anchor is (one search for the anchor instead of one for each of its forms)."""
    if not secrets:
        return s
    there = [a in s for a in anchors]
    for secret, g in zip(secrets, gate, strict=True):
        if (g < 0 or there[g]) and secret in s:
            s = s.replace(secret, redacted)
    return s


def run_scrubber(endpoints: Iterable[str], headers: Iterable[str], api_key_env: str | None, api_key_file: str | None,
                 judge_base_url: str | None = None, judge_api_key_env: str | None = None) -> Scrubber:
    """The scrubber of a run from its settings (``WorkerConfig``'s fields: each side builds the same one): the
    endpoints' and the judge's URL secrets, the --header secrets, the API key and the judge's. A key that cannot
    be read adds nothing (its use says why)."""
    keys: list[str | None] = []
    for env, file in ((api_key_env, api_key_file), (judge_api_key_env, None)):
        if env or file:
            try:
                keys.append(api_key(env, file))
            except OSError:
                continue
    urls = [*endpoints, *([judge_base_url] if judge_base_url else [])]
    return Scrubber.for_run(urls, headers, keys)
