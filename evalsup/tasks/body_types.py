"""The request body's types, for the routes evalsup knows (issue 44): a body the endpoint would refuse with a 400
for a wrong type (``"max_tokens": "ten"``) is refused by the pre-scan instead, naming the line and the field, before
any request is paid for. Only the fields whose type OpenAI's API fixes are checked; any other field passes as it
is (a server's own extensions: vLLM's ``guided_json``, SGLang's ``regex``...). Pure."""

from __future__ import annotations

from typing import Any

from evalsup.tasks.routes import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES

_INT = "an integer"
_NUM = "a number"
_STR = "a string"
_BOOL = "true or false"
_OBJ = "an object"
_LIST = "a list"


def _is(value: Any, want: str) -> bool:
    if want == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if want == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if want == _STR:
        return isinstance(value, str)
    if want == _BOOL:
        return isinstance(value, bool)
    if want == _OBJ:
        return isinstance(value, dict)
    return isinstance(value, list)


# field -> the type it must have (None is allowed for every optional field, as the API allows it)
_COMMON = {"model": _STR, "temperature": _NUM, "top_p": _NUM, "n": _INT, "seed": _INT, "stream": _BOOL,
           "presence_penalty": _NUM, "frequency_penalty": _NUM, "user": _STR}
_BY_ROUTE: dict[str, dict[str, str]] = {
    CHAT.path: {**_COMMON, "max_tokens": _INT, "max_completion_tokens": _INT,
                "logprobs": _BOOL, "top_logprobs": _INT, "response_format": _OBJ, "tools": _LIST,
                "stream_options": _OBJ, "parallel_tool_calls": _BOOL, "logit_bias": _OBJ},
    COMPLETIONS.path: {**_COMMON, "max_tokens": _INT, "logprobs": _INT, "echo": _BOOL, "best_of": _INT,
                       "suffix": _STR, "stream_options": _OBJ, "logit_bias": _OBJ},
    EMBEDDINGS.path: {"model": _STR, "dimensions": _INT, "encoding_format": _STR, "user": _STR},
    RESPONSES.path: {"model": _STR, "temperature": _NUM, "top_p": _NUM, "max_output_tokens": _INT,
                     "instructions": _STR, "stream": _BOOL, "text": _OBJ, "tools": _LIST, "store": _BOOL,
                     "reasoning": _OBJ, "parallel_tool_calls": _BOOL, "previous_response_id": _STR},
}


def body_problem(path: str, body: dict[str, Any]) -> str | None:
    """What is wrong with a request body's types for the route ``path`` (one line, naming the field), or None."""
    fields = _BY_ROUTE.get(path)
    if fields is None:
        return None
    for name, want in fields.items():
        value = body.get(name)
        if value is not None and not _is(value, want):
            return f"body.{name} must be {want}, not {_shown(value)}"
    if path == CHAT.path:
        return messages_problem(body.get("messages"), "body.messages")
    if path in (COMPLETIONS.path, EMBEDDINGS.path, RESPONSES.path):
        key = "prompt" if path == COMPLETIONS.path else "input"
        value = body.get(key)
        if value is not None and not isinstance(value, str | list):
            return f"body.{key} must be a string or a list, not {_shown(value)}"
    return None


def messages_problem(messages: Any, where: str) -> str | None:
    """Chat messages: a non-empty list of objects, each with a string ``role`` and a ``content`` that is a
    string, a list of parts, or null (an assistant's tool call)."""
    if messages is None:
        return f"{where} is missing: a chat request needs its messages"
    if not isinstance(messages, list) or not messages:
        return f"{where} must be a non-empty list of messages"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"{where}[{i}] must be an object with 'role' and 'content', not {_shown(m)}"
        if not isinstance(m.get("role"), str):
            return f"{where}[{i}].role must be a string (system, user, assistant, tool...)"
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"{where}[{i}].content must be a string or a list of parts, not {_shown(content)}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
