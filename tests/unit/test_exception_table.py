"""errors.EXCEPTIONS: every exception an attempt may raise maps to the failure it always did (code, kind, message),
by the first row that matches, whatever the exception's place among aiohttp's subclasses; except one raised
before any answer that says the request could not be made at all (issue 34: tests/unit/test_local_errors.py)."""

from __future__ import annotations

import asyncio
import types

import aiohttp
import pytest

from evalsup.worker import errors
from evalsup.worker.errors import Code, FailureKind

KEY = types.SimpleNamespace(host="127.0.0.1", port=9, ssl=True, is_ssl=False)
REFUSED = aiohttp.ClientConnectorError(KEY, ConnectionRefusedError(111, "Connection refused"))

# (the exception, the code without a stream, the code with one, the message; None: "Type: text")
CASES: list[tuple[BaseException, Code, Code, str | None]] = [
    (aiohttp.ConnectionTimeoutError(), Code.TIMEOUT_CONNECT, Code.TIMEOUT_CONNECT,
     "no connection within --connect-timeout"),
    (aiohttp.SocketTimeoutError(), Code.TIMEOUT_READ, Code.TIMEOUT_READ, "no data within --read-timeout"),
    (TimeoutError(), Code.TIMEOUT_TOTAL, Code.TIMEOUT_TOTAL, "the attempt took longer than --timeout"),
    (aiohttp.ServerTimeoutError(), Code.TIMEOUT_TOTAL, Code.TIMEOUT_TOTAL, "the attempt took longer than --timeout"),
    (aiohttp.ClientPayloadError("Response payload is not completed"), Code.CONNECTION, Code.STREAM_CUT, None),
    (aiohttp.ServerDisconnectedError(), Code.CONNECTION, Code.STREAM_CUT, None),
    (REFUSED, Code.CONNECTION_REFUSED, Code.CONNECTION_REFUSED, None),
    (aiohttp.ClientProxyConnectionError(KEY, OSError(1, "no proxy")), Code.CONNECTION_REFUSED,
     Code.CONNECTION_REFUSED, None),
    # a ValueError too, and a connector error first
    (aiohttp.ClientConnectorCertificateError(KEY, ValueError("bad cert")), Code.CONNECTION_REFUSED,
     Code.CONNECTION_REFUSED, None),
    (aiohttp.ClientOSError(104, "Connection reset by peer"), Code.CONNECTION, Code.CONNECTION, None),
    (aiohttp.ServerFingerprintMismatch(b"a", b"b", "h", 1), Code.CONNECTION, Code.CONNECTION, None),
    (aiohttp.ClientError("anything"), Code.CONNECTION, Code.CONNECTION, None),
    # raised while the answer was read (a broken SSE event's JSON): the endpoint's, as always; before any answer
    # these two are local (test_local_errors.py)
    (aiohttp.InvalidURL("nope"), Code.CONNECTION, Code.CONNECTION, None),
    (ValueError("a broken event"), Code.CONNECTION, Code.CONNECTION, None),
]


@pytest.mark.parametrize(("exc", "code", "stream_code", "message"), CASES, ids=lambda c: type(c).__name__)
def test_each_exception_maps_as_it_always_did(exc: BaseException, code: Code, stream_code: Code,
                                              message: str | None) -> None:
    assert isinstance(exc, errors.CAUGHT)
    for stream, want in ((False, code), (True, stream_code)):
        f = errors.from_exception(exc, stream, answered=True)
        assert errors.local(exc) or f == errors.from_exception(exc, stream, answered=False)
        assert f.code == want and f.kind is FailureKind.ENDPOINT and f.status is None and f.said == {}
        assert f.message == (message if message is not None else f"{type(exc).__name__}: {exc}"[:300])
    assert errors.from_exception(REFUSED, False).refused  # the breaker's evidence of an endpoint down


def test_a_long_message_is_cut_and_anything_else_is_not_caught() -> None:
    f = errors.from_exception(aiohttp.ClientError("x" * 1000), False)
    assert len(f.message) == 300 and f.message.startswith("ClientError: xxx")
    assert not isinstance(KeyError("k"), errors.CAUGHT) and not isinstance(asyncio.CancelledError(), errors.CAUGHT)
    with pytest.raises(TypeError):
        errors.from_exception(KeyError("k"), False)
    # every exception type is in one row only
    types_ = [t for row in errors.EXCEPTIONS for t in row[0]]
    assert len(types_) == len(set(types_)) == len(errors.CAUGHT)
