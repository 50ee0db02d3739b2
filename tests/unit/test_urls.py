"""Endpoints as users write them (issue 34): the one URL joiner (``join_url``), the credentials taken out of a
--base-url and sent as HTTP basic auth, and every header of a request built once for both sides."""

from __future__ import annotations

import base64

import pytest

from evalsup.tasks.headers import HeaderError, request_headers
from evalsup.tasks.requests import credentials, join_url, public_url, url_problem
from evalsup.tasks.secrets import url_secrets

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(("base", "path", "url"), [
    ("http://h:8000/v1", CHAT, "http://h:8000/v1/chat/completions"),
    ("http://h:8000/v1/", CHAT, "http://h:8000/v1/chat/completions"),
    ("http://h:8000", CHAT, "http://h:8000/v1/chat/completions"),
    ("https://gw.example/api/openai", "/v1/embeddings", "https://gw.example/api/openai/v1/embeddings"),
    ("http://h:8000/v1", "/v1/models", "http://h:8000/v1/models"),
    # the query is kept, after the path, on every route
    ("http://h:8000/v1?api-version=2024-02-01", CHAT, "http://h:8000/v1/chat/completions?api-version=2024-02-01"),
    ("http://h:8000/v1/?api-version=2024-02-01", "/v1/models", "http://h:8000/v1/models?api-version=2024-02-01"),
    ("http://h:8000/v1?a=1&b=2", CHAT + "?c=3", "http://h:8000/v1/chat/completions?a=1&b=2&c=3"),
    # Azure OpenAI: a deployment's routes sit right under it
    ("https://res.openai.azure.com/openai/deployments/gpt-4o?api-version=2024-02-01", CHAT,
     "https://res.openai.azure.com/openai/deployments/gpt-4o/chat/completions?api-version=2024-02-01"),
    ("https://res.openai.azure.com/openai/deployments/emb/", "/v1/embeddings",
     "https://res.openai.azure.com/openai/deployments/emb/embeddings"),
    # user:password@ is left as given (credentials takes it out)
    ("http://u:p@h:8000/v1?x=1", CHAT, "http://u:p@h:8000/v1/chat/completions?x=1"),
])
def test_join_url_puts_the_route_before_the_query(base: str, path: str, url: str) -> None:
    assert join_url(base, path) == url


def test_credentials_are_taken_out_of_the_url_percent_decoded_and_the_query_kept() -> None:
    assert credentials("http://h:1/v1?q=1") == ("http://h:1/v1?q=1", None)
    assert credentials("http://alice:s%40cret%3A1@h:1/v1?q=1") == ("http://h:1/v1?q=1", ("alice", "s@cret:1"))
    assert credentials("https://alice@h/v1") == ("https://h/v1", ("alice", ""))
    assert credentials("http://alice:p@ss@h:1/v1")[1] == ("alice", "p@ss")  # the last @ ends them, as curl
    assert public_url("http://alice:pw@h:1/v1?api-version=1") == "http://h:1/v1"


def test_basic_auth_from_the_url_or_the_key_never_both() -> None:
    common = {"User-Agent": "evalsup/x", "api-key": "k"}
    h = request_headers("http://alice:s%40cret@h:1/v1", common, None)
    assert h["Authorization"] == "Basic " + base64.b64encode(b"alice:s@cret").decode()
    assert h["Content-Type"] == "application/json" and h["api-key"] == "k" and h["User-Agent"] == "evalsup/x"
    assert request_headers("http://h:1/v1", common, "sk-1")["Authorization"] == "Bearer sk-1"
    assert "Authorization" not in request_headers("http://h:1/v1", common, None)
    with pytest.raises(HeaderError) as e:
        request_headers("http://alice:hunter22@h:1/v1", common, "sk-1", "the API key ($OPENAI_API_KEY)")
    said = str(e.value)
    assert "hunter22" not in said and "sk-1" not in said and "$OPENAI_API_KEY" in said and "http://h:1/v1" in said
    with pytest.raises(HeaderError, match="--header Authorization"):
        request_headers("http://alice:hunter22@h:1/v1", {"authorization": "Token t"}, None)


def test_what_is_secret_in_a_url_and_what_cannot_be_requested() -> None:
    token = base64.b64encode(b"alice:hunter22").decode()
    assert url_secrets("http://alice:hunter22@h:1/v1") == ["hunter22", token]
    assert url_secrets("http://h:1/v1?key=x") == []
    assert url_problem("http://h:1/v1?api-version=1") is None
    assert url_problem("http://alice:pw@h:1/v1") is None
    assert url_problem("http://h:port/v1") == "has a port that is not a number from 0 to 65535"
    assert url_problem("http:///v1") == "has no host"
    assert url_problem("ftp://h/v1") == "must start with http:// or https://"
    assert url_problem("http://h:1/v1#x") == "has a #fragment, which is never sent"
    assert url_problem("http://[::1:8000/v1") == "is not a URL (Invalid IPv6 URL)"
    assert public_url("http://alice:pw@[::1:8000/v1?k=1") == "http://[::1:8000/v1"
