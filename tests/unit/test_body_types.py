"""The pre-scan's check of a request body's types (issue 44): a type the endpoint would refuse is a bad line named
by file:LINE and field, before any request; fields it does not know pass. No process, no socket."""

from __future__ import annotations

from typing import Any

import pytest

from evalsup.tasks.body_types import body_problem
from evalsup.tasks.reader import validate

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body", "says"), [
    (CHAT, {"messages": MSG, "max_tokens": "ten"}, "body.max_tokens must be an integer, not 'ten'"),
    (CHAT, {"messages": MSG, "max_tokens": True}, "body.max_tokens must be an integer"),
    (CHAT, {"messages": MSG, "temperature": "hot"}, "body.temperature must be a number"),
    (CHAT, {"messages": MSG, "model": 7}, "body.model must be a string"),
    (CHAT, {"messages": MSG, "stream": "yes"}, "body.stream must be true or false"),
    (CHAT, {"messages": "hi"}, "body.messages must be a non-empty list"),
    (CHAT, {"messages": ["hi"]}, "body.messages[0] must be an object"),
    (CHAT, {"messages": [{"content": "hi"}]}, "body.messages[0].role must be a string"),
    (CHAT, {"messages": [{"role": "user", "content": 3}]}, "body.messages[0].content must be a string or a list"),
    (CHAT, {"prompt": "hi"}, "body.messages is missing"),
    ("/v1/completions", {"prompt": 3}, "body.prompt must be a string or a list"),
    ("/v1/embeddings", {"input": {"a": 1}}, "body.input must be a string or a list"),
    ("/v1/responses", {"input": "x", "max_output_tokens": 1.5}, "body.max_output_tokens must be an integer"),
])
def test_a_wrong_type_is_named_by_its_field(path: str, body: dict[str, Any], says: str) -> None:
    assert body_problem(path, body) == says or (body_problem(path, body) or "").startswith(says)


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, {"messages": MSG, "max_tokens": 10, "temperature": 0, "guided_json": {"x": 1}, "top_k": "any"}),
    (CHAT, {"messages": [{"role": "assistant", "content": None, "tool_calls": []}], "max_tokens": None}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 3}),
    ("/v1/embeddings", {"input": [1, 2, 3]}),
    ("/v1/responses", {"input": [{"role": "user", "content": "x"}], "max_output_tokens": 16}),
])
def test_good_bodies_and_unknown_fields_pass(path: str, body: dict[str, Any]) -> None:
    assert body_problem(path, body) is None


def test_the_line_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match=r"body\.max_tokens must be an integer, not 'ten'"):
        validate({"custom_id": "a", "url": CHAT, "body": {"messages": MSG, "max_tokens": "ten"}})
    with pytest.raises(ValueError, match=r"'messages'\[0\]\.role must be a string"):
        validate({"id": "a", "messages": [{"content": "x"}]})
