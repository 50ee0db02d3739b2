"""Rate limits, global or per endpoint (issue 21 item 1): --max-requests-per-s and --max-tokens-per-min.

Each option is repeatable. A value is ``N`` (one global limit: all requests together) or ``URL=N`` (only the
requests sent to that endpoint; the URL is split from N at the last ``=``). The URL names one of the run's
endpoints, as given to --base-url or as records show it (no credentials); trailing slashes do not count. From
Python the keyword takes a number (global), a dict ``{url: N}``, or a list of both.

Every limit is split evenly among the live workers (``rate_share``: the RATE frame, re-sent whenever the number
of workers changes); a request to endpoint i waits on the global pacer, if any, and then on endpoint i's, if any
(``EndpointPool.apply_rate`` in ``evalsup.worker.endpoints``). Plain data and pure functions: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from evalsup.config.options import BY_NAME
from evalsup.ipc.messages import Rate
from evalsup.tasks.requests import public_url


class RateLimitError(ValueError):
    """A rate-limit value that cannot be used; the message is one line naming the flag."""


@dataclass(frozen=True)
class EndpointRate:
    """The limits of one endpoint (its index in WorkerConfig.endpoints); None: no limit of that kind."""

    index: int
    rps: float | None
    tpm: float | None


class RateLimits(NamedTuple):
    rps: float | None  # the global limits (None: none)
    tpm: float | None
    endpoints: tuple[EndpointRate, ...]  # those of single endpoints, by index


def _number(flag: str, text: Any, what: str, listing: str) -> float:
    """``text`` as a limit > 0; ``what`` is the value as the message shows it (no credentials, and no text
    that is not a number: it may be a mistyped secret)."""
    try:
        n = float(text)
    except (TypeError, ValueError):
        raise RateLimitError(f"{flag} {what}: not a number (give N for all requests together, or URL=N for "
                             f"one endpoint of {listing})") from None
    if not (math.isfinite(n) and n > 0):
        raise RateLimitError(f"{flag} {what}: the limit must be a number > 0 (got {n:g})")
    return n


def _endpoint(flag: str, url: str, endpoints: Sequence[str]) -> int:
    """The index of the endpoint ``url`` names: as given to --base-url, or in its public form."""
    u = url.strip().rstrip("/")
    exact = [i for i, e in enumerate(endpoints) if e.rstrip("/") == u]
    if exact:
        return exact[0]
    public = [i for i, e in enumerate(endpoints) if public_url(e).rstrip("/") == public_url(u).rstrip("/")]
    listing = ", ".join(public_url(e) for e in endpoints)
    if len(public) > 1:
        raise RateLimitError(f"{flag}: {public_url(u)} names {len(public)} endpoints (they differ only in "
                             f"credentials); give it as in --base-url (endpoints: {listing})")
    if not public:
        raise RateLimitError(f"{flag}: {public_url(u)} is not one of the run's endpoints ({listing})")
    return public[0]


def parse_limit(name: str, value: Any, endpoints: Sequence[str]) -> tuple[float | None, dict[int, float]]:
    """One option's values (``name``: max_requests_per_s or max_tokens_per_min; ``value`` as the CLI or
    evalsup.run gives it): (the global limit or None, {endpoint index: limit}). Raises RateLimitError."""
    option = BY_NAME[name]
    flag = option.flag
    glob: float | None = None
    per: dict[int, float] = {}
    listing = ", ".join(public_url(e) for e in endpoints)
    for v in option.values(value):
        url: str | None
        text: Any
        if isinstance(v, int | float) and not isinstance(v, bool):
            url, text = None, v
        else:
            s = str(v).strip()
            url, eq, text = s.rpartition("=")
            if not eq:
                url, text = None, s
        if url is None:
            shown = public_url(str(text)) if "://" in str(text) else repr(str(text).strip())
            n = _number(flag, text, shown, listing)
            if glob is not None:
                raise RateLimitError(f"{flag}: one global limit only (got {glob:g} and {n:g}); give a limit "
                                     f"for one endpoint as URL=N (endpoints: {listing})")
            glob = n
            continue
        i = _endpoint(flag, url, endpoints)
        n = _number(flag, text, f"{public_url(endpoints[i])}=N", listing)
        if i in per:
            raise RateLimitError(f"{flag}: {public_url(endpoints[i])} is given twice")
        per[i] = n
    return glob, per


def parse_rate_limits(rps: Any, tpm: Any, endpoints: Sequence[str]) -> RateLimits:
    """Both options' values, for the run's endpoints (evalsup.config.run_config.build_config)."""
    g_rps, e_rps = parse_limit("max_requests_per_s", rps, endpoints)
    g_tpm, e_tpm = parse_limit("max_tokens_per_min", tpm, endpoints)
    eps = tuple(EndpointRate(i, e_rps.get(i), e_tpm.get(i)) for i in sorted(set(e_rps) | set(e_tpm)))
    return RateLimits(g_rps, g_tpm, eps)


def rate_share(rps: float | None, tpm: float | None, endpoints: Sequence[EndpointRate], arrivals: str,
               workers: int) -> Rate | None:
    """The RATE frame for each of ``workers`` live workers: every limit split evenly among them (together they
    never exceed it); None when the run has no rate limit. ``eps`` is present only with per-endpoint limits."""
    if workers <= 0 or not (rps or tpm or endpoints):
        return None
    n = workers
    share: Rate = {"rps": rps / n if rps else None, "tpm": tpm / n if tpm else None, "arrivals": arrivals}
    if endpoints:
        share["eps"] = {str(e.index): [e.rps / n if e.rps else None, e.tpm / n if e.tpm else None]
                        for e in endpoints}
    return share
