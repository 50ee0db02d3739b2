"""Structured outputs with re-ask: what to do with an answer that must follow a JSON schema. Pure: no I/O.

After an answer (a 200), ``check`` says whether its text is JSON the schema accepts (``tasks.response_schema``);
if not, ``next_request`` builds the request that asks again: the same request with the invalid answer as the
assistant's turn and the validation error as a user turn after it (chat: ``messages``; Responses API:
``input``). A legacy completion (a prompt) cannot be asked again this way: its invalid answer is final. The
worker (``main.Worker.process``) sends it through the same client (retries, limits, breaker) up to
``--max-reasks`` times; an answer still invalid after them becomes the record's error ``schema_invalid``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalsup.scoring.scorers import response_text
from evalsup.tasks.response_schema import WHERE, SchemaError, check_schema, schema_of_request, validation_error
from evalsup.worker.errors import Code

REASK_PROMPT = ("Your answer is not valid: {error}. Answer again with only the JSON value, matching the "
                "JSON schema.")


@dataclass(frozen=True, slots=True)
class Verdict:
    """An answer against its schema: ``error`` None when it is valid."""

    text: str
    error: str | None


def schema_for(body: Any, run_schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema a task's answer must follow: --response-schema's, else the request's own (checked:
    SchemaError, one line, when it is not a valid JSON schema); None: no validation."""
    if run_schema is not None:
        return run_schema
    own = schema_of_request(body)
    return None if own is None else check_schema(own, WHERE)


def check(parsed: Any, schema: dict[str, Any]) -> Verdict:
    """The answer's text (from the parsed body, any route) and why it fails ``schema``, if it does."""
    text = response_text(parsed)
    return Verdict(text, validation_error(text, schema))


def tokens_of(parsed: Any) -> tuple[int, int]:
    """An answer's (prompt, completion) tokens from its body's usage (either API's names; none: 0)."""
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    if not isinstance(usage, dict):
        return 0, 0

    def count(*names: str) -> int:
        for name in names:
            v = usage.get(name)
            if isinstance(v, int) and not isinstance(v, bool):
                return max(0, v)
        return 0

    return count("prompt_tokens", "input_tokens"), count("completion_tokens", "output_tokens")


def next_request(body: dict[str, Any], answer: str, error: str) -> dict[str, Any] | None:
    """The request that asks again after the invalid ``answer``: ``body`` with the answer as an assistant turn
    and ``error`` as a user turn after it; None when the request has no conversation to extend (a legacy
    completion's prompt)."""
    turns = [{"role": "assistant", "content": answer},
             {"role": "user", "content": REASK_PROMPT.format(error=error)}]
    messages = body.get("messages")
    if isinstance(messages, list):
        return {**body, "messages": [*messages, *turns]}
    given = body.get("input")
    if isinstance(given, str):
        return {**body, "input": [{"role": "user", "content": given}, *turns]}
    if isinstance(given, list):
        return {**body, "input": [*given, *turns]}
    return None


def failure(error: str, reasks: int) -> dict[str, str]:
    """The record's error for an answer still invalid after ``reasks`` re-asks."""
    after = f" after {reasks} re-ask{'s' if reasks != 1 else ''}" if reasks else ""
    return {"code": str(Code.SCHEMA_INVALID), "message": f"{error}{after}"}


def bad_schema(e: SchemaError) -> dict[str, str]:
    """The record's error for a task whose own response_format schema is not a valid JSON schema."""
    return {"code": str(Code.SCHEMA_INVALID), "message": str(e)}
