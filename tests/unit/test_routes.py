"""The route table (evalsup.tasks.routes): one row per route, and the places that still spell a route their own
way agree with it (the worker's probe, the scorers' response text, the mock). No process, no
socket."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from evalsup.mock.config import MockConfig
from evalsup.mock.server import create_app
from evalsup.mock.stats import KNOWN_PATHS
from evalsup.scoring.scorers import response_text
from evalsup.tasks import routes
from evalsup.tasks.requests import BATCH_URLS, RequestDefaults, to_request
from evalsup.tasks.routes import ROUTES, Each, TextPath, answer_text, route_of
from evalsup.worker import probes
from evalsup.worker.endpoints import Endpoint

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]


def test_the_table_has_the_four_routes_a_task_may_name() -> None:
    assert [r.path for r in ROUTES] == PATHS
    assert tuple(PATHS) == BATCH_URLS
    assert routes.DEFAULT is routes.CHAT


@pytest.mark.parametrize("path", PATHS)
def test_route_of_finds_a_route_under_any_base(path: str) -> None:
    r = routes.BY_PATH[path]
    for url in (path, path + "/", path + "?api-version=1", "/openai/deployments/x" + path.removeprefix("/v1"),
                "http://h:8000/v1" + path.removeprefix("/v1")):
        assert route_of(url) is r, url


def test_chat_completions_is_not_taken_for_completions() -> None:
    assert route_of("/v1/chat/completions") is routes.CHAT
    assert route_of("/v1/completions") is routes.COMPLETIONS
    assert route_of("/v1/models") is None and route_of("/v1/chat") is None and routes.answer_key("/v1/x") is None


@pytest.mark.parametrize("path", [*PATHS, "/v1/models", "/v1/x"])
def test_the_probe_agrees(path: str) -> None:
    ep = Endpoint(0, "http://127.0.0.1:9/v1")
    req = probes.probe_request(ep, (path, "m"))
    body = routes.probe_body(path, "m")
    if req is None:
        assert body is None
    else:
        assert body is not None and req[1] == orjson.dumps(body)  # the same bytes, key order included
    if body is not None:  # a fresh body each time: nobody edits the table through it
        body.setdefault("messages", []).append("x")
        assert routes.probe_body(path, "m") != body


def test_the_defaults_follow_the_table() -> None:
    d = RequestDefaults(model="m", max_tokens=5, temperature=0.5, stream=True)
    for r in ROUTES:
        _, body, _ = to_request({"custom_id": "a", "url": r.path, "body": {}}, d)
        assert ("max_tokens" in body) is r.samples and ("temperature" in body) is r.samples
        assert body.get("stream", False) is r.streams
        assert (r.sse is not None) is r.streams
    url, body, _ = to_request({"id": "a", "prompt": "q"}, d)
    assert url == routes.DEFAULT.path and body["stream"] is True
    assert routes.asks_stream_usage("/v1/chat/completions") and routes.asks_stream_usage("/v1/completions")
    assert not routes.asks_stream_usage("/v1/responses") and not routes.asks_stream_usage("/v1/embeddings")
    assert not routes.asks_stream_usage("/x/v1/chat/completions")  # exact paths only, as a task names them


def _body_with(path: TextPath, text: str) -> Any:
    """A body holding ``text`` at ``path`` ("*": a one-item list)."""
    if not path:
        return text
    step, rest = path[0], path[1:]
    if isinstance(step, Each):
        inner = _body_with(rest, text)
        return [{**inner, "type": step.type} if step.type else inner]
    if isinstance(step, int):
        return [_body_with(rest, text)]
    return {step: _body_with(rest, text)}


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.path)
def test_the_scorers_find_the_text_where_the_table_says(route: routes.Route) -> None:
    for path in route.text:
        body = _body_with(path, "forty-two")
        assert response_text(body) == "forty-two" == answer_text(body), path


def _msg(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": list(parts)}


def _out(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _response(*items: dict[str, Any]) -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "m",
            "output": list(items), "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


_REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking A"}],
              "content": [{"type": "reasoning_text", "text": "maybe A"}]}
_CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"}
# (a body as each route answers, the answer's text)
BODIES: list[tuple[Any, str | None]] = [
    ({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "B"},
                                                 "finish_reason": "stop"}]}, "B"),
    ({"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": None,
                                                                        "tool_calls": []}}]}, None),
    ({"object": "text_completion", "choices": [{"index": 0, "text": " Paris", "finish_reason": "stop"}]}, " Paris"),
    ({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}]}, None),
    (_response(_msg(_out("The answer is C."))), "The answer is C."),
    (_response(_REASONING, _msg(_out("Answer: "), _out("D"))), "Answer: D"),  # not the reasoning's text
    (_response(_msg({"type": "refusal", "refusal": "no"})), None),
    (_response(_CALL), None),
    ({**_response(_msg(_out("x"))), "output_text": "x"}, "x"),
    (None, None), ("text", None), ({}, None),
]


@pytest.mark.parametrize(("body", "text"), BODIES)
def test_the_two_text_rules_agree_on_every_route(body: Any, text: str | None) -> None:
    assert answer_text(body) == text
    assert response_text(body) == (text or "")


@pytest.mark.parametrize(("body", "text"), [b for b in BODIES if isinstance(b[0], dict) and "output" in b[0]])
def test_a_responses_text_is_what_the_openai_sdk_calls_output_text(body: Any, text: str | None) -> None:
    from openai.types.responses import Response

    assert Response.model_validate({"error": None, "incomplete_details": None, "instructions": None,
                                    "metadata": {}, "temperature": 1.0, "top_p": 1.0, **body}).output_text == (
        text or "")


def test_the_mock_serves_and_counts_every_route() -> None:
    app = create_app(MockConfig())
    posts = {r.resource.canonical for r in app.router.routes() if r.method == "POST" and r.resource is not None}
    assert set(PATHS) <= posts
    assert set(PATHS) <= KNOWN_PATHS
