"""Embeddings, models, unknown URLs and the admin endpoints (/_mock/...)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from evalsup.mock import content as C
from evalsup.mock.call import Call
from evalsup.mock.capacity import prometheus_text
from evalsup.mock.faults import Fault
from evalsup.mock.state import MAX_DIMS, MODEL_CREATED, STATE, error, json_response


async def embeddings(call: Call) -> web.StreamResponse:
    model, early = await call.open()
    if early is not None:
        return early
    items = C.input_items(call.body.get("input"))
    if items is None:
        return error(call.request, 400, "input must be a string, an array of strings or tokens", param="input")
    dims = call.body.get("dimensions")
    if dims is None:
        dims = 8
    if isinstance(dims, bool) or not isinstance(dims, int) or not 1 <= dims <= MAX_DIMS:
        return error(call.request, 400, "dimensions must be a positive integer", param="dimensions")
    fmt = call.body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        return error(call.request, 400, "encoding_format must be 'float' or 'base64'", param="encoding_format")
    fault = call.random_fault()
    if fault is not None:
        return fault
    data = []
    for i, item in enumerate(items):
        vec = C.embedding(call.cfg.seed, model, item, dims)
        emb: list[float] | str = C.embedding_base64(vec) if fmt == "base64" else vec
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(C.item_tokens(x) for x in items)
    body = orjson.dumps(
        {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )
    if call.fault is Fault.MALFORMED:
        call.state.stats.fault("malformed")
        body = body[: max(1, len(body) // 2)]
    return web.Response(body=body, content_type="application/json")


def model_obj(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": MODEL_CREATED, "owned_by": "evalsup-mock"}


async def models(call: Call) -> web.StreamResponse:
    delay = call.state.faults.latency_s(call.cfg)
    if delay > 0:
        await asyncio.sleep(delay)
    return json_response({"object": "list", "data": [model_obj(m) for m in call.cfg.models]})


async def model(call: Call) -> web.StreamResponse:
    model = call.request.match_info["model"]
    if call.cfg.models and model not in call.cfg.models:
        msg = f"The model `{model}` does not exist or you do not have access to it."
        return error(call.request, 404, msg, code="model_not_found", param="model")
    return json_response(model_obj(model))


async def unknown(call: Call) -> web.StreamResponse:
    request = call.request
    return error(request, 404, f"Invalid URL ({request.method} {request.path})", code="unknown_url")


# ---------------------------------------------------------------------------------------------- admin


async def admin_stats(request: web.Request) -> web.StreamResponse:
    return json_response(request.app[STATE].stats.snapshot())


async def admin_reset(request: web.Request) -> web.StreamResponse:
    request.app[STATE].reset()
    return json_response({"ok": True})


async def admin_get_config(request: web.Request) -> web.StreamResponse:
    return json_response(request.app[STATE].config_json())


async def admin_set_config(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        updates = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return json_response({"error": "body must be a JSON object"}, status=400)
    if not isinstance(updates, dict):
        return json_response({"error": "body must be a JSON object"}, status=400)
    try:
        state.update(updates)
    except ValueError as exc:
        return json_response({"error": str(exc)}, status=400)
    return json_response(state.config_json())


async def tokenize(request: web.Request) -> web.StreamResponse:
    """vLLM's and SGLang's ``POST /tokenize`` (at the server's root): ``{"model", "messages"}`` or ``{"model",
    "prompt"}`` -> ``{"count", "max_model_len", "tokens"}``, counting as the answers' ``usage.prompt_tokens``
    does. Off (``tokenize: false``): 404, as an endpoint without one answers."""
    st = request.app[STATE]
    if not st.cfg.tokenize:
        return error(request, 404, f"Invalid URL ({request.method} {request.path})", code="unknown_url")
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return error(request, 400, "the body is not JSON")
    if not isinstance(body, dict):
        return error(request, 400, "the body must be a JSON object")
    if isinstance(body.get("messages"), list):
        count = C.chat_prompt_tokens(body["messages"])
    else:
        items = C.input_items(body.get("prompt"))
        if items is None:
            return error(request, 400, "give messages or prompt", param="prompt")
        count = sum(C.item_tokens(x) for x in items)
    return json_response({"count": count, "max_model_len": 32768, "tokens": list(range(count))})


async def metrics(request: web.Request) -> web.StreamResponse:
    """vLLM-style queue gauges of the capacity model (running, waiting), for the adaptive limit's scraper."""
    st = request.app[STATE]
    return web.Response(text=prometheus_text(st.capacity, st.stats.in_flight, st.cfg.models),
                        content_type="text/plain")
