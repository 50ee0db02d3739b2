"""The routes evalsup sends to, one row each: what the rest of the code knows of a route is read from here.

A row says, for its path: what a 200 body must hold to be an answer, whether the run's sampling defaults
(--max-tokens, --temperature) and --stream apply, which SSE reassembler rebuilds a streamed answer
(evalsup.worker.sse: ``chat`` or ``responses``) and whether the stream is asked for its usage chunk, the tiny
request that probes the route (the breaker's probe and key check, the connection check), and where the answer's
text sits in the body (the scorers' response_text).

Exact paths (``BY_PATH``) are what a task names; ``route_of`` finds the row of any URL that ends with a route
(a base URL's prefix, a query or a trailing slash aside), ``/chat/completions`` before ``/completions``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Each:
    """A step into each item of a list (only the dicts whose "type" is ``type``, when given): the texts found
    under them are joined."""

    type: str | None = None


# a step into a body: a key, a list index, or Each (every item of a list)
Step = str | int | Each
TextPath = tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Route:
    path: str  # as a task names it (the OpenAI Batch API's "url")
    answer_key: str  # a 200 body without this key is not an answer (invalid_response)
    samples: bool  # --max-tokens and --temperature fill the body (not for embeddings)
    streams: bool  # --stream sets "stream": true
    sse: str | None  # the reassembler of its stream (evalsup.worker.sse.chat / .responses); None: never streamed
    stream_usage: bool  # a streamed request asks for the usage chunk (stream_options.include_usage)
    probe: tuple[tuple[str, Any], ...]  # the tiny request's body, besides "model" (probe_body)
    text: tuple[TextPath, ...]  # where the answer's text is, first found wins (answer_text; the scorers'
    #                             response_text is the same rule written again: tests/unit/test_routes.py)

    @property
    def suffix(self) -> str:
        """The end of a URL that names this route: the path without its /v1 ("/chat/completions")."""
        return self.path.removeprefix("/v1")


CHAT = Route("/v1/chat/completions", "choices", samples=True, streams=True, sse="chat", stream_usage=True,
             probe=(("messages", [{"role": "user", "content": "ping"}]), ("max_tokens", 1)),
             text=(("choices", 0, "message", "content"),))
COMPLETIONS = Route("/v1/completions", "choices", samples=True, streams=True, sse="chat", stream_usage=True,
                    probe=(("prompt", "ping"), ("max_tokens", 1)),
                    text=(("choices", 0, "text"),))
EMBEDDINGS = Route("/v1/embeddings", "data", samples=False, streams=False, sse=None, stream_usage=False,
                   probe=(("input", "ping"),),
                   text=())
RESPONSES = Route("/v1/responses", "output", samples=True, streams=True, sse="responses", stream_usage=False,
                  probe=(("input", "ping"), ("max_output_tokens", 16)),
                  # the raw body has no output_text (the openai SDK computes it): the message items' output_text
                  # parts, joined; a reasoning item's text is not the answer
                  text=(("output_text",), ("output", Each("message"), "content", Each("output_text"), "text")))

ROUTES: tuple[Route, ...] = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)  # route_of tries them in this order
BY_PATH: dict[str, Route] = {r.path: r for r in ROUTES}
# an answer that no task route gives but a --batch-api run to Anthropic keeps as it came (a Message): its text
# blocks joined (a thinking or tool_use block is not the answer)
ANTHROPIC_MESSAGE_TEXT: tuple[TextPath, ...] = (("content", Each("text"), "text"),)
DEFAULT = CHAT  # a simple task ({"id", "messages"|"prompt"}) and a batch line without "url"


def route_of(path: str) -> Route | None:
    """The route a URL path ends with, its query and a trailing slash aside; None for any other path."""
    p = path.partition("?")[0].rstrip("/")
    for r in ROUTES:
        if p.endswith(r.suffix):
            return r
    return None


def _at(value: Any, path: TextPath) -> str | None:
    for i, step in enumerate(path):
        if isinstance(step, Each):
            if not isinstance(value, list):
                return None
            found = [_at(v, path[i + 1:]) for v in value
                     if isinstance(v, dict) and (step.type is None or v.get("type") == step.type)]
            texts = [t for t in found if t is not None]
            return "".join(texts) if texts else None
        if isinstance(step, int):
            if not isinstance(value, list) or len(value) <= step:
                return None
            value = value[step]
        else:
            if not isinstance(value, dict):
                return None
            value = value.get(step)
    return value if isinstance(value, str) else None


def answer_text(body: Any) -> str | None:
    """The answer's text in a response body of any route (each route's ``text`` rows tried in table order, the
    first found wins, then an Anthropic Message's): chat's message content, a completion's text, a Responses
    answer, a Message's text blocks; None when it holds none (embeddings, a tool call)."""
    for path in (*(p for r in ROUTES for p in r.text), *ANTHROPIC_MESSAGE_TEXT):
        got = _at(body, path)
        if got is not None:
            return got
    return None


def answer_key(path: str) -> str | None:
    """What a 200 body of ``path`` must hold to be an answer; None: anything goes (an unknown route)."""
    r = route_of(path)
    return None if r is None else r.answer_key


def asks_stream_usage(path: str) -> bool:
    """Does a streamed request to ``path`` (exactly a route's path) ask for the usage chunk?"""
    r = BY_PATH.get(path)
    return r is not None and r.stream_usage


def probe_body(path: str, model: str) -> dict[str, Any] | None:
    """The tiny request that checks ``path`` serves ``model`` (1 token, or 16 where the route's minimum is
    higher); None for a path of no known route (GET /models must do)."""
    r = route_of(path)
    if r is None:
        return None
    return {"model": model, **{k: copy.deepcopy(v) for k, v in r.probe}}


def served_models(status: int, data: bytes) -> list[str]:
    """The model ids a GET /v1/models answer lists ([] for any other status, or a body that is not that list):
    the connection check's and `evalsup score`'s judge check's one reading of it."""
    if status != 200:
        return []
    try:
        return [m["id"] for m in orjson.loads(data).get("data", []) if isinstance(m, dict) and "id" in m]
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return []
