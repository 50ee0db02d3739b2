"""A local error is never an outage (issue 34): an exception raised before any answer that says the request
could not be made at all is ``FailureKind.LOCAL`` (the run stops, exit 2), never endpoint evidence; the same
exception raised while an answer was read stays the endpoint's, and connection errors stay what they were."""

from __future__ import annotations

import ssl
import types

import aiohttp
import pytest
import yarl

from evalsup.worker import errors
from evalsup.worker.errors import Code, FailureKind

KEY = types.SimpleNamespace(host="127.0.0.1", port=9, ssl=True, is_ssl=False)
URL = yarl.URL("http://127.0.0.1:9/v1")

LOCAL = [
    ValueError("Cannot combine AUTHORIZATION header with AUTH argument or credentials encoded in URL"),
    ValueError("Newline or carriage return character detected in HTTP status message or header."),
    aiohttp.InvalidURL("http://h:port/v1"),
    aiohttp.InvalidUrlClientError("http:///v1"),
    aiohttp.NonHttpUrlClientError("ftp://h/v1"),
]
NOT_LOCAL = [
    aiohttp.ClientConnectorCertificateError(KEY, ssl.SSLCertVerificationError("bad cert")),
    aiohttp.ClientConnectorError(KEY, ConnectionRefusedError(111, "Connection refused")),
    aiohttp.InvalidUrlRedirectClientError("http:///x"),  # the server's redirect: the endpoint's
    aiohttp.NonHttpUrlRedirectClientError("ftp://h/x"),
    aiohttp.ServerDisconnectedError(),
    aiohttp.ClientError("anything"),
    TimeoutError(),
]


@pytest.mark.parametrize("exc", LOCAL, ids=lambda e: type(e).__name__)
def test_a_request_that_could_not_be_made_is_local_not_the_endpoints(exc: BaseException) -> None:
    assert isinstance(exc, errors.CAUGHT) and errors.local(exc)
    for stream in (False, True):
        f = errors.from_exception(exc, stream)
        assert f.kind is FailureKind.LOCAL and f.code == Code.INTERNAL
        assert not f.endpoint_side and not f.refused  # no evidence for the breaker
        assert f.message == f"{type(exc).__name__}: {exc}"[:300]
        # raised while reading an answer (a broken SSE event's JSON), the same type is the endpoint's
        assert errors.from_exception(exc, stream, answered=True).kind is FailureKind.ENDPOINT


@pytest.mark.parametrize("exc", NOT_LOCAL, ids=lambda e: type(e).__name__)
def test_connection_errors_and_redirects_stay_the_endpoints(exc: BaseException) -> None:
    assert isinstance(exc, errors.CAUGHT) and not errors.local(exc)
    assert errors.from_exception(exc, False).kind is FailureKind.ENDPOINT
