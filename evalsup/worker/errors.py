"""What can go wrong with one attempt, named once (after httpx, whose exceptions mirror a request's life).

Each failure has a code (what a record's ``error.code`` says) and a kind (what evalsup does about it). The
client builds a ``Failure``; the retry policy (``retry.RetryPolicy.decide``) and the breaker
(``breaker.LocalBreaker``) read its kind; the record carries its code. Nothing else spells a code.

    Failure
    ├── local (nothing was sent)       internal_error       a request that could not leave: a client library's
    │                                                       ValueError, a bad header, an unsupported URL. The
    │                                                       settings' or evalsup's problem, never the endpoint's
    ├── transport (no HTTP answer)     connection_refused   the connection itself was refused: endpoint down
    │                                  connection_error     reset or closed mid-request
    │                                  timeout_connect | timeout_read | timeout_total
    │                                  timeout_stall        abandoned: the run had no result for --stall-after
    │                                                       while it was on the wire (the supervisor's STALL)
    │                                  stream_cut           an SSE stream stopped before its end
    │                                  stream_error         the server failed mid-stream (an error event)
    ├── answer (a 200 that is broken)  invalid_json | invalid_response | response_too_large
    │   (after the answer: schema_invalid, an answer that fails --response-schema after its re-asks; reask.py)
    └── status (an HTTP error)         rate_limited (429; 503 with Retry-After): the server's flow control
                                       http_401, http_403: the key was refused
                                       http_5xx: the server failed; http_4xx: the request is wrong

The transport failures come from aiohttp's (and asyncio's) exceptions through one table, ``EXCEPTIONS``, read
by ``from_exception``: the client catches ``CAUGHT`` around an attempt and asks it, nothing else maps them. An
exception raised before any answer came that says the request itself could not be made (``local``) is never
the endpoint's: no breaker evidence, no retry; the client stops the run (issue 34).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from evalsup.worker.server_errors import http_error


class Code(enum.StrEnum):
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION = "connection_error"
    TIMEOUT_CONNECT = "timeout_connect"
    TIMEOUT_READ = "timeout_read"
    TIMEOUT_TOTAL = "timeout_total"
    # abandoned on the supervisor's word: no result in the whole run for --stall-after while it was on the wire
    TIMEOUT_STALL = "timeout_stall"
    STREAM_CUT = "stream_cut"
    STREAM_ERROR = "stream_error"  # an error event inside a 200 stream (the server's code kept beside it)
    INVALID_JSON = "invalid_json"
    INVALID_RESPONSE = "invalid_response"
    TOO_LARGE = "response_too_large"
    RATE_LIMITED = "rate_limited"
    INTERNAL = "internal_error"  # a bug in evalsup: one record, never the worker
    WORKER_CRASHED = "worker_crashed"  # written by the supervisor for a task that kept killing its worker
    # not an attempt's failure: an answer that still fails its JSON schema after --max-reasks (worker.reask)
    SCHEMA_INVALID = "schema_invalid"


class FailureKind(enum.Enum):
    """What to do about a failed attempt."""

    ENDPOINT = "endpoint"  # the endpoint may be unwell: retry; evidence for the breaker
    ANSWER = "answer"  # a broken answer to this request: retry
    FLOW = "flow"  # the server asks to wait: wait as long as it says, no attempt used
    AUTH = "auth"  # the key was refused: evidence that the run must stop
    REQUEST = "request"  # this request will not succeed: no retry
    FINAL = "final"  # no retry whatever the status (too large)
    LOCAL = "local"  # the request never left (evalsup's or the settings' problem): the run stops, exit 2


ENDPOINT_STATUSES = frozenset({500, 502, 503, 504, 529})  # (529: Anthropic's overloaded_error)
RETRY_STATUSES = frozenset({408, 409})  # other statuses worth another attempt, not endpoint evidence
AUTH_STATUSES = frozenset({401, 403})


def http_code(status: int) -> str:
    return f"http_{status}"


@dataclass(frozen=True, slots=True)
class Failure:
    code: str  # a Code, or http_<status>
    message: str
    kind: FailureKind
    status: int | None = None  # the HTTP status, when the attempt got an answer
    retry_after: float | None = None  # seconds the server asked to wait
    said: dict[str, str] = field(default_factory=dict)  # the server's own code/type/param (server_errors)

    @property
    def endpoint_side(self) -> bool:
        return self.kind is FailureKind.ENDPOINT

    @property
    def refused(self) -> bool:
        return self.code == Code.CONNECTION_REFUSED

    def record(self) -> dict[str, str]:
        """The attempt's error as the record builder takes it (tasks.record_error): evalsup's code, the
        message, and what the server said of its own (``server_code``, ``type``, ``param``)."""
        return {"code": str(self.code), "message": self.message, **self.said}


def transport(code: Code, message: str, said: dict[str, str] | None = None) -> Failure:
    """No HTTP answer: refused, reset, a timeout, a cut stream, or an error event mid-stream."""
    return Failure(code, message, FailureKind.ENDPOINT, said=said or {})


def stalled(age_s: float) -> Failure:
    """An attempt abandoned on the supervisor's STALL: the run had seen no result for --stall-after while this
    one was on the wire for ``age_s`` s. The endpoint's, like any timeout: retried, an attempt used (so it cannot
    loop for ever), and evidence for the breaker, whose probe then says whether the endpoint as a whole answers
    (its parked attempts are then counted) or is down (they are not: no task pays for an outage)."""
    return transport(Code.TIMEOUT_STALL, f"no answer after {age_s:.0f}s on the wire while the run had no result "
                                         "for --stall-after; abandoned and retried")


# aiohttp's (and asyncio's) exceptions -> the failure of the attempt, as httpx maps httpcore's: (exception types,
# the code, the code when the response was a stream, the message; None: the exception's type and text). The first
# row that matches wins, so a subclass stands above its base (aiohttp's timeouts are TimeoutErrors too, its
# connector errors ClientErrors; the certificate errors are ValueErrors as well as connector errors).
EXCEPTIONS: tuple[tuple[tuple[type[BaseException], ...], Code, Code, str | None], ...] = (
    ((aiohttp.ConnectionTimeoutError,), Code.TIMEOUT_CONNECT, Code.TIMEOUT_CONNECT,
     "no connection within --connect-timeout"),
    ((aiohttp.SocketTimeoutError,), Code.TIMEOUT_READ, Code.TIMEOUT_READ, "no data within --read-timeout"),
    ((TimeoutError,), Code.TIMEOUT_TOTAL, Code.TIMEOUT_TOTAL, "the attempt took longer than --timeout"),
    # the body cut off, the connection closed under it: a stream cut when it was a stream
    ((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError), Code.CONNECTION, Code.STREAM_CUT, None),
    # the connection itself: refused, no route, no such host, a proxy or TLS that would not connect
    ((aiohttp.ClientConnectorError,), Code.CONNECTION_REFUSED, Code.CONNECTION_REFUSED, None),
    ((aiohttp.ClientError, ValueError), Code.CONNECTION, Code.CONNECTION, None),  # anything else on the way
)
CAUGHT: tuple[type[BaseException], ...] = tuple(t for types, *_ in EXCEPTIONS for t in types)


class LocalError(Exception):
    """A request of the worker's own (a probe, the key check) could not be sent: ``local``'s case."""


def local(e: BaseException) -> bool:
    """Whether ``e``, raised before any answer came, says the request could not be made at all: a ValueError
    of the client library (aiohttp's "Cannot combine AUTHORIZATION header with ...", a header holding a line
    break), a URL it cannot request (``InvalidURL``, a scheme it does not speak). Not an error of the connection
    (certificate errors are ValueErrors too, and OSErrors), nor a redirect the server sent to a bad URL."""
    if isinstance(e, OSError | aiohttp.RedirectClientError):
        return False
    return isinstance(e, ValueError | aiohttp.NonHttpUrlClientError)


def from_exception(e: BaseException, stream: bool, answered: bool = False) -> Failure:
    """The failure an exception of ``CAUGHT`` raised by an attempt stands for (``stream``: a stream was asked;
    ``answered``: the server had answered, so it was raised reading the answer, never local)."""
    if not answered and local(e):
        return Failure(Code.INTERNAL, f"{type(e).__name__}: {e}"[:300], FailureKind.LOCAL)
    for types, code, stream_code, message in EXCEPTIONS:
        if isinstance(e, types):
            return transport(stream_code if stream else code, message or f"{type(e).__name__}: {e}"[:300])
    raise TypeError(f"{type(e).__name__} is not in errors.EXCEPTIONS") from e


def answer(code: Code, message: str, status: int | None = 200) -> Failure:
    """A 200 whose body cannot be used; ``response_too_large`` is final whatever the status."""
    return Failure(code, message, FailureKind.FINAL if code is Code.TOO_LARGE else FailureKind.ANSWER, status)


def status_kind(status: int, retry_after: float | None = None) -> FailureKind:
    """What an HTTP error status is: 429, and 503 with Retry-After, the server's flow control (not failures);
    401/403 the key; 500/502/503/504 the endpoint's; 408/409 worth another attempt; anything else the request's.
    The one reading of a status: the client's failures, the adaptive limit (``pushback``) and the Batch planner
    (``batch.plan.retryable``) all ask it."""
    if status == 429 or (status == 503 and retry_after is not None):
        return FailureKind.FLOW
    if status in AUTH_STATUSES:
        return FailureKind.AUTH
    if status in ENDPOINT_STATUSES:
        return FailureKind.ENDPOINT
    if status in RETRY_STATUSES:
        return FailureKind.ANSWER
    return FailureKind.REQUEST


# kinds worth another attempt (the Batch planner's follow-up chunk; the client's retry policy reads the kinds too)
RETRYABLE_KINDS = frozenset({FailureKind.FLOW, FailureKind.ENDPOINT, FailureKind.ANSWER})
# an overloaded server's statuses without Retry-After: a proxy's 503, Anthropic's 529
OVERLOADED = frozenset({503, 529})
# the timeouts: an overloaded server answers late (a refused or reset connection is an outage, not load)
TIMEOUTS = frozenset({Code.TIMEOUT_CONNECT, Code.TIMEOUT_READ, Code.TIMEOUT_TOTAL})


def pushback(status: int | None, code: str | None) -> bool:
    """Whether an attempt's end is the server pushing back on the load, the adaptive limit's evidence
    (``worker.adaptive``): its flow control (429, a 503 with or without Retry-After: what an overloaded proxy
    answers; Anthropic's 529), or a timeout. Not a 500, a cut stream, a reset or a broken answer: a task's own
    failure, or the breaker's business."""
    if status is not None and status != 200:
        return status in OVERLOADED or status_kind(status) is FailureKind.FLOW
    return code in TIMEOUTS


def from_status(status: int, body: Any, retry_after: float | None) -> Failure:
    """An HTTP error answer, its message and code read from the body whatever its shape (server_errors);
    its kind by ``status_kind``."""
    err = http_error(status, body)
    message = err.pop("message")
    err.pop("code")
    return Failure(http_code(status), message, status_kind(status, retry_after), status, retry_after, err)

