"""Chat completions and (legacy) completions: bodies and SSE events, and the routes that answer with them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from evalsup.mock import content as C
from evalsup.mock import rich
from evalsup.mock.call import Call
from evalsup.mock.faults import Fault
from evalsup.mock.state import FINGERPRINT, MAX_N, SSE_DONE, error, new_id, sse


def usage_of(answers: list[C.Answer], prompt_tokens: int, cached: int = 0, written: int = 0) -> dict[str, Any]:
    """The answers' usage; ``cached``, ``written``: the prompt tokens read from the provider's cache and written
    to it (the details are there only when some are: MockConfig.cached, MockConfig.written)."""
    completion_tokens = sum(a.tokens for a in answers)
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached or written:
        out["prompt_tokens_details"] = {"cached_tokens": cached, **({"cache_write_tokens": written} if written else {})}
    return out


@dataclass(frozen=True)
class Billing:
    """What an answer says it was billed for beyond its tokens: the prompt tokens the cache served and those it
    wrote, and the service tier the request asked (echoed, as OpenAI does; absent when it asked none)."""

    cached: int = 0
    tier: str | None = None
    written: int = 0


NO_BILLING = Billing()


@dataclass(frozen=True)
class Shape:
    """What differs between chat completions and (legacy) completions."""

    chat: bool
    id_prefix: str
    obj: str
    chunk_obj: str

    def choice(self, i: int, a: C.Answer) -> dict[str, Any]:
        if self.chat:
            # only what a stream carries, so that reassembled streams can equal this exactly
            message = {"role": "assistant", "content": a.json_value(i)}
            return {"index": i, "message": message, "logprobs": None, "finish_reason": a.finish}
        return {"text": a.json_value(i), "index": i, "logprobs": None, "finish_reason": a.finish}

    def delta(self, i: int, content: str | None, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta = {} if content is None else {"content": content}
            return {"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"text": content or "", "index": i, "logprobs": None, "finish_reason": finish}

    def body(self, cid: str, created: int, model: str, answers: list[C.Answer], prompt_tokens: int,
             billing: Billing = NO_BILLING) -> bytes:
        return b"".join(self.body_parts(cid, created, model, answers, prompt_tokens, billing))

    def body_parts(
        self, cid: str, created: int, model: str, answers: list[C.Answer], prompt_tokens: int,
        billing: Billing = NO_BILLING,
    ) -> list[bytes | memoryview]:
        out: dict[str, Any] = {
            "id": cid,
            "object": self.obj,
            "created": created,
            "model": model,
            "choices": [self.choice(i, a) for i, a in enumerate(answers)],
            "usage": usage_of(answers, prompt_tokens, billing.cached, billing.written),
            "system_fingerprint": FINGERPRINT,
        }
        if billing.tier is not None:
            out["service_tier"] = billing.tier
        return C.render_parts(out, answers)

    def events(
        self, cid: str, created: int, model: str, answers: list[C.Answer], prompt_tokens: int, usage: bool,
        billing: Billing = NO_BILLING,
    ) -> Iterator[bytes]:
        """SSE events: (chat: a role chunk,) content chunks, a finish chunk per choice; usage chunk; [DONE]."""

        def chunk(choices: list[dict[str, Any]]) -> dict[str, Any]:
            out: dict[str, Any] = {
                "id": cid,
                "object": self.chunk_obj,
                "created": created,
                "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": choices,
            }
            if billing.tier is not None:
                out["service_tier"] = billing.tier
            if usage:
                out["usage"] = None
            return out

        for i, a in enumerate(answers):
            if self.chat:
                role = {"role": "assistant", "content": ""}
                yield sse(chunk([{"index": i, "delta": role, "logprobs": None, "finish_reason": None}]))
            if a.pad:  # JSON-safe byte slices spliced into a pre-encoded chunk
                head, tail = C.split_at_marker(chunk([self.delta(i, C.pad_marker(i))]), i)
                head = b"data: " + head
                tail += b"\n\n"
                for view in a.byte_pieces():
                    yield b"".join((head, view, tail))
            else:
                for piece in a.pieces():
                    yield sse(chunk([self.delta(i, piece)]))
            yield sse(chunk([self.delta(i, None, a.finish)]))
        if usage:
            last = chunk([])
            last["usage"] = usage_of(answers, prompt_tokens, billing.cached, billing.written)
            yield sse(last)
        yield SSE_DONE

    def malformed_events(self, first: bytes, cid: str) -> Iterator[bytes]:
        yield first
        yield b'data: {"id": "' + cid.encode() + b'", "object": "' + self.chunk_obj.encode() + b'", "choices": [{"\n\n'
        yield SSE_DONE


CHAT = Shape(chat=True, id_prefix="chatcmpl-", obj="chat.completion", chunk_obj="chat.completion.chunk")
TEXT = Shape(chat=False, id_prefix="cmpl-", obj="text_completion", chunk_obj="text_completion")


async def generate(
    call: Call, shape: Shape, answers: list[C.Answer], model: str, prompt_tokens: int
) -> web.StreamResponse:
    """Pad, then answer as JSON or SSE, honouring malformed and cut_stream."""
    billing = Billing(call.cached_of(prompt_tokens), call.tier, call.written_of(prompt_tokens))
    answers = call.pad(answers, lambda cid, created, a: shape.body(cid, created, model, a, prompt_tokens, billing))
    call.bill(model, prompt_tokens, sum(a.tokens for a in answers))
    gone = call.gone_response()
    if gone is not None:  # generated and billed; the client that asked is gone
        return gone
    cid = new_id(shape.id_prefix)
    created = int(time.time())
    if call.stream:
        events = shape.events(cid, created, model, answers, prompt_tokens, call.include_usage, billing)
        if call.fault is Fault.MALFORMED:
            call.state.stats.fault("malformed")
            return await call.send_stream(shape.malformed_events(next(events), cid))
        if call.override.cut_stream:
            pieces = answers[0].piece_count() if answers else 0
            return await call.send_stream(events, cut_after=int(shape.chat) + max(1, pieces // 2))
        return await call.send_stream(events)
    parts = shape.body_parts(cid, created, model, answers, prompt_tokens, billing)
    if call.fault is Fault.MALFORMED:
        call.state.stats.fault("malformed")
        body = b"".join(parts)
        return web.Response(body=body[: max(1, len(body) // 2)], content_type="application/json")
    if call.override.cut_stream:
        return await call.send_parts(parts, cut=True)
    if len(parts) == 1:
        return web.Response(body=parts[0], content_type="application/json")
    return await call.send_parts(parts)


async def chat_completions(call: Call) -> web.StreamResponse:
    model, early = await call.open()
    if early is not None:
        return early
    messages = call.body.get("messages")
    if not isinstance(messages, list) or not messages:
        return error(call.request, 400, "messages must be a non-empty array", param="messages")
    n, err = call.choices_n()
    if err is not None:
        return err
    fault = call.random_fault()
    if fault is not None:
        return fault
    key = C.content_key(call.cfg.seed, "chat", call.body)
    max_tokens = call.body.get("max_completion_tokens") or call.body.get("max_tokens")
    answers = call.answers(key, n, max_tokens)
    if rich.wants_rich(call.body, call.override.refusal):  # tools, logprobs, refusal: never padded
        plans = rich.plans(call.body, key, answers, call.override.refusal)
        return await _send_rich(call, model, plans, C.chat_prompt_tokens(messages))
    return await generate(call, CHAT, answers, model, C.chat_prompt_tokens(messages))


async def _send_rich(call: Call, model: str, plans: list[rich.Plan], prompt_tokens: int) -> web.StreamResponse:
    call.bill(model, prompt_tokens, 0)
    gone = call.gone_response()
    if gone is not None:  # generated and billed; the client that asked is gone
        return gone
    cid = new_id(CHAT.id_prefix)
    created = int(time.time())
    if call.stream:
        events = rich.events(cid, created, model, plans, prompt_tokens, call.include_usage)
        if call.override.cut_stream:
            return await call.send_stream(events, cut_after=3)
        return await call.send_stream(events)
    return await call.send_body(rich.body(cid, created, model, plans, prompt_tokens))


async def completions(call: Call) -> web.StreamResponse:
    model, early = await call.open()
    if early is not None:
        return early
    prompts = C.input_items(call.body.get("prompt"))
    if prompts is None:
        return error(call.request, 400, "prompt must be a string, an array of strings or tokens", param="prompt")
    n, err = call.choices_n()
    if err is not None:
        return err
    if len(prompts) * n > MAX_N:
        return error(call.request, 400, f"at most {MAX_N} choices per request", param="n")
    fault = call.random_fault()
    if fault is not None:
        return fault
    key = C.content_key(call.cfg.seed, "completion", call.body)
    answers = call.answers(key, len(prompts) * n, call.body.get("max_tokens"))
    return await generate(call, TEXT, answers, model, sum(C.item_tokens(p) for p in prompts))
