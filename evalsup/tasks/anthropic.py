"""A chat task's request as Anthropic's Messages API takes it (``params`` of a Message Batches request), and
the custom_id it goes under. One table (``translate``): what has an Anthropic equivalent is translated, what
has none is refused (``Untranslatable``: one line, which the pre-scan names with the task's file and line),
never dropped in silence.

    OpenAI chat body                       Anthropic params
    model                                  model
    messages: leading system/developer     system (one string; several: text blocks, in order)
    messages: user / assistant             messages (string content as is; parts: text, image_url as an
                                           image block: a data: URL as base64, an http(s) URL as a url source)
    max_tokens / max_completion_tokens     max_tokens (required: the task's, else --max-tokens; else refused)
    temperature (0..1)                     temperature (above 1 refused: Anthropic's range is 0..1)
    top_p                                  top_p
    stop (string or list)                  stop_sequences
    user                                   metadata.user_id
    n (1 only), stream, stream_options     dropped (a batch answers whole, once)
    top_k, stop_sequences, metadata,       passed as they are (Anthropic's own names)
    thinking, system
    mock                                   passed (the project's mock reads its per-request knobs there)
    anything else (tools, response_format, refused
    logprobs, seed, penalties, ...)
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from evalsup.tasks.requests import RequestDefaults, to_request
from evalsup.tasks.routes import CHAT

MESSAGES_PATH = "/v1/messages"  # the route a translated request is for (an online attempt goes there)
ANTHROPIC_VERSION = "2023-06-01"
DROPPED = frozenset({"stream", "stream_options"})
NATIVE = frozenset({"top_k", "stop_sequences", "metadata", "thinking", "system", "mock"})
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Untranslatable(ValueError):
    """A request with no Anthropic equivalent: ``str(e)`` says what, in one line."""


def custom_id(tid: str) -> str:
    """The request's custom_id: the task's id when Anthropic takes it as one (``^[a-zA-Z0-9_-]{1,64}$``), else
    "h-" and 40 hex digits of its sha256 (the chunk's own list of ids maps it back)."""
    return tid if _CUSTOM_ID.match(tid) else "h-" + hashlib.sha256(tid.encode()).hexdigest()[:40]


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise Untranslatable(f"{where}: a system message's content must be text")


def _image(part: dict[str, Any]) -> dict[str, Any]:
    got = part.get("image_url")
    url = got.get("url") if isinstance(got, dict) else got
    if not isinstance(url, str):
        raise Untranslatable("an image_url part without a url")
    m = re.match(r"^data:([\w/+.-]+);base64,(.*)$", url, re.S)
    if m:
        return {"type": "image", "source": {"type": "base64", "media_type": m.group(1), "data": m.group(2)}}
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise Untranslatable("an image_url that is neither a data: URL nor an http(s) URL")


def _content(content: Any, i: int) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise Untranslatable(f"messages[{i}]: content must be a string or a list of parts")
    out: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            out.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            out.append(_image(part))
        else:
            raise Untranslatable(f"messages[{i}]: a content part of type {kind!r} has no Anthropic equivalent")
    return out


def _messages(messages: Any) -> tuple[list[str], list[dict[str, Any]]]:
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("the request has no messages")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise Untranslatable(f"messages[{i}] is not an object")
        role = m.get("role")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise Untranslatable(f"messages[{i}]: {extra[0]!r} has no Anthropic equivalent")
        if role in ("system", "developer"):
            if out:
                raise Untranslatable(f"messages[{i}]: a {role} message after the conversation began (Anthropic "
                                     "takes the system prompt only before it)")
            system.append(_text(m.get("content"), f"messages[{i}]"))
        elif role in ("user", "assistant"):
            out.append({"role": role, "content": _content(m.get("content"), i)})
        else:
            raise Untranslatable(f"messages[{i}]: role {role!r} has no Anthropic equivalent")
    if not out:
        raise Untranslatable("the request has only system messages")
    return system, out


def to_params(body: dict[str, Any], default_max_tokens: int | None = None) -> dict[str, Any]:
    """The Messages API params of an OpenAI chat body (the table above); raises ``Untranslatable``."""
    system, messages = _messages(body.get("messages"))
    params: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("messages", *DROPPED):
            continue
        if key == "model":
            params["model"] = value
        elif key in ("max_tokens", "max_completion_tokens"):
            if value is not None:
                params["max_tokens"] = value
        elif key == "temperature":
            if value is not None:
                if not isinstance(value, int | float) or not 0 <= value <= 1:
                    raise Untranslatable(f"temperature {value!r} is outside Anthropic's range 0..1")
                params["temperature"] = value
        elif key == "top_p":
            if value is not None:
                params["top_p"] = value
        elif key == "stop":
            if value is not None:
                params["stop_sequences"] = [value] if isinstance(value, str) else list(value)
        elif key == "user":
            params["metadata"] = {"user_id": str(value)}
        elif key == "n":
            if value not in (None, 1):
                raise Untranslatable(f"n={value!r}: Anthropic answers one choice a request")
        elif key in NATIVE:
            params[key] = value
        else:
            raise Untranslatable(f"{key!r} has no Anthropic equivalent")
    if "model" not in params:
        raise Untranslatable("no model: give one in the task or with --model")
    if "max_tokens" not in params:
        if default_max_tokens is None:
            raise Untranslatable("no max_tokens, which Anthropic requires: give one in the task or --max-tokens")
        params["max_tokens"] = default_max_tokens
    if system:
        if "system" in params:
            raise Untranslatable("both a 'system' key and system messages")
        params["system"] = system[0] if len(system) == 1 else [{"type": "text", "text": s} for s in system]
    params["messages"] = messages
    return {k: params[k] for k in sorted(params, key=lambda k: (k != "model", k))}


def task_params(obj: dict[str, Any], defaults: RequestDefaults) -> tuple[dict[str, Any], dict[str, Any]]:
    """A parsed task line as (Anthropic params, the record's metadata): chat tasks only (a simple line, or a
    batch line to /v1/chat/completions); raises ``Untranslatable``."""
    url, body, metadata = to_request(obj, RequestDefaults(defaults.model, None, defaults.temperature, False))
    if url != CHAT.path:
        raise Untranslatable(f"url {url!r}: only chat tasks (/v1/chat/completions) go to Anthropic's Message "
                             "Batches")
    return to_params(body, defaults.max_tokens), metadata
