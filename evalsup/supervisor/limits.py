"""The supervisor's view of the workers' concurrency limits (issue 21): each worker runs an adaptive limit per
endpoint (``evalsup.worker.adaptive``) under the supervisor's LIMIT cap and reports it in its heartbeats. The
sums are what the progress line, ``evalsup status``, Prometheus (``evalsup_concurrency_limit``,
``evalsup_endpoint_*``), ``memory.jsonl`` (``concurrency_limit``, ``endpoints``) and the report show; a low
limit's reason (``limit_reason``, issue 41) goes beside it in the progress line and ``evalsup status``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypedDict

from evalsup.common.states import EndpointState
from evalsup.supervisor.endpoints import Endpoints


class _Limited(Protocol):
    conc_limit: int
    wire: int
    ep_load: list[list[int]] | None
    limit_why: list[Any] | None

    @property
    def alive(self) -> bool: ...


class EndpointLoad(TypedDict):
    url: str  # its public URL (no credentials)
    state: EndpointState  # UP, DOWN (ejected: its breaker is open, probed until it answers) or OUT (left out:
    # it failed the connection check, or refused the key)
    limit: int  # requests the live workers may send it now (their limits for it, summed)
    in_flight: int  # requests on the wire to it


def limit_total(workers: Iterable[_Limited]) -> int:
    """Requests the live workers may have in flight now, by their last heartbeats (0 before the first)."""
    return sum(w.conc_limit for w in workers if w.alive)


def limit_reason(workers: Iterable[_Limited]) -> str | None:
    """Why the limit is low, in words, from the heartbeats of the live workers (the lowest one's reason), and,
    when every one of them measured a --concurrency that served answers 1.5x as fast, the sum of those as the
    setting to try. None unless every live worker's limit is low (one low worker beside others that are not
    does not make the run's limit low)."""
    live = [w for w in workers if w.alive]
    low = [(w.conc_limit, w.limit_why) for w in live if w.limit_why]
    if not low or len(low) < len(live):
        return None
    text = str(min(low, key=lambda x: x[0])[1][0])
    tries = [int(why[1]) if len(why) > 1 else 0 for _, why in low]
    if all(tries):
        text += f"; --concurrency {sum(tries)} served answers faster in this run: try it"
    return text


def endpoint_loads(workers: Sequence[_Limited], endpoints: Endpoints) -> list[EndpointLoad]:
    """Each endpoint's state, limit and requests on the wire, summed over the live workers' last heartbeats.
    With one endpoint, the workers' totals are its own."""
    n = len(endpoints.urls)
    limit, wire = [0] * n, [0] * n
    for w in workers:
        if not w.alive:
            continue
        if n == 1:
            limit[0] += w.conc_limit
            wire[0] += w.wire
            continue
        for i, pair in enumerate((w.ep_load or [])[:n]):
            limit[i] += int(pair[0])
            wire[i] += int(pair[1])
    return [EndpointLoad(url=url, state=_state(endpoints, i), limit=limit[i], in_flight=wire[i])
            for i, url in enumerate(endpoints.urls)]


def _state(endpoints: Endpoints, i: int) -> EndpointState:
    if i in endpoints.left_out:
        return EndpointState.OUT
    return EndpointState.DOWN if endpoints.breakers[i].open else EndpointState.UP
