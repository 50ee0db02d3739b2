"""An OpenAI-compatible mock endpoint with fault injection, for tests and benchmarks: the app and how it runs.

Endpoints: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/responses,
GET /v1/models[/{id}], the Files and Batches APIs (batches.py), Anthropic's Message Batches API
(message_batches.py), Azure OpenAI's POST
/openai/deployments/{name}/chat/completions (and /completions, /embeddings),
plus admin endpoints GET /_mock/stats, POST /_mock/reset, GET|POST /_mock/config.

Answers are a pure function of (seed, request content); faults come from a seeded RNG owned by the server
(one draw per generation request, in arrival order) or from the request's own "mock" object.

The parts: state.py (shared state, errors, SSE helpers), call.py (one request and the /v1 wrapper),
completions.py (chat and legacy completions), rich.py (tool calls, logprobs, refusals), responses.py
(the Responses API), routes.py (embeddings, models, admin), this module (the app,
MockServer, MockThread, serve_forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from aiohttp import web

from evalsup.mock.batches import add_routes as add_batch_routes
from evalsup.mock.call import v1
from evalsup.mock.completions import chat_completions, completions
from evalsup.mock.config import MockConfig
from evalsup.mock.message_batches import add_routes as add_message_batch_routes
from evalsup.mock.responses import responses
from evalsup.mock.routes import (
    admin_get_config,
    admin_reset,
    admin_set_config,
    admin_stats,
    embeddings,
    metrics,
    model,
    models,
    tokenize,
    unknown,
)
from evalsup.mock.state import MAX_BODY, SHUTDOWN_TIMEOUT_S, STATE, State, new_id
from evalsup.mock.stats import MockStats

__all__ = ["MockConfig", "MockServer", "MockStats", "MockThread", "create_app", "serve_forever", "start_mock"]

try:
    import uvloop

    _new_loop: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
except ImportError:  # pragma: no cover - uvloop is a dependency, but stay usable without it
    _new_loop = asyncio.new_event_loop


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    if "x-request-id" not in response.headers:
        response.headers["x-request-id"] = new_id("req_")


def create_app(cfg: MockConfig) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app[STATE] = State(cfg)
    app.on_response_prepare.append(_add_request_id)
    r = app.router
    r.add_post("/v1/chat/completions", v1(chat_completions))
    r.add_post("/v1/completions", v1(completions))
    r.add_post("/v1/embeddings", v1(embeddings))
    r.add_post("/v1/responses", v1(responses))
    r.add_get("/v1/models", v1(models), allow_head=False)
    r.add_get("/v1/models/{model}", v1(model), allow_head=False)
    add_batch_routes(app, v1)  # the Files and Batches APIs (issue 31)
    add_message_batch_routes(app, v1)  # Anthropic's Message Batches API (issue 31 item 4)
    r.add_route("*", "/v1/{tail:.*}", v1(unknown))
    # Azure OpenAI's form: the deployment (the model) in the path, the routes right under it (issue 34)
    azure = "/openai/deployments/{deployment}"
    r.add_post(azure + "/chat/completions", v1(chat_completions))
    r.add_post(azure + "/completions", v1(completions))
    r.add_post(azure + "/embeddings", v1(embeddings))
    r.add_route("*", "/openai/{tail:.*}", v1(unknown))
    r.add_get("/metrics", metrics, allow_head=False)  # the capacity model's queue gauges
    r.add_post("/tokenize", tokenize)  # vLLM's and SGLang's tokenizer (issue 30: evalsup estimate)
    r.add_get("/_mock/stats", admin_stats, allow_head=False)
    r.add_post("/_mock/reset", admin_reset)
    r.add_get("/_mock/config", admin_get_config, allow_head=False)
    r.add_post("/_mock/config", admin_set_config)
    return app


# ---------------------------------------------------------------------------------------------- running it


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


class MockServer:
    """A mock endpoint running on the current event loop (see start_mock)."""

    def __init__(self, app: web.Application, runner: web.AppRunner, host: str, port: int) -> None:
        self.app = app
        self._runner = runner
        self.host = host
        self.port = port
        self.url = _url(host, port)
        self._closed = False

    @property
    def stats(self) -> MockStats:
        return self.app[STATE].stats

    @property
    def config(self) -> MockConfig:
        return self.app[STATE].cfg

    def configure(self, **updates: Any) -> MockConfig:
        """Change knobs live, like POST /_mock/config (also accepts down=True/False)."""
        state = self.app[STATE]
        state.update(updates)
        return state.cfg

    def reset_stats(self) -> None:
        """Like POST /_mock/reset: clear the counters and the attempt counts behind mock.times."""
        self.app[STATE].reset()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._runner.cleanup()


async def start_mock(cfg: MockConfig, host: str = "127.0.0.1", port: int = 0) -> MockServer:
    """Start the mock on the running loop; port 0 picks a free port (see MockServer.port)."""
    app = create_app(cfg)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return MockServer(app, runner, host, bound)


class MockThread:
    """The mock server on its own event loop in a daemon thread, for sync code and tests."""

    def __init__(self, cfg: MockConfig, port: int = 0, host: str = "127.0.0.1") -> None:
        self.cfg = cfg
        self.host = host
        self.port = port
        self.url = _url(host, port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: MockServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> MockThread:
        if self._thread is not None:
            raise RuntimeError("MockThread already started")
        self._thread = threading.Thread(target=self._run, name="evalsup-mock", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("mock server did not start within 30 s")
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        loop = _new_loop()
        asyncio.set_event_loop(loop)
        try:
            try:
                self._server = loop.run_until_complete(start_mock(self.cfg, self.host, self.port))
            except BaseException as exc:
                self._error = exc
                return
            self.port = self._server.port
            self.url = self._server.url
            self._loop = loop
            self._ready.set()
            loop.run_forever()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            self._ready.set()
            loop.close()

    def _call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        loop, server = self._loop, self._server
        if loop is None or server is None or loop.is_closed():
            raise RuntimeError("MockThread is not running")

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    @property
    def server(self) -> MockServer:
        if self._server is None:
            raise RuntimeError("MockThread is not running")
        return self._server

    def stats(self) -> dict[str, Any]:
        """Same as GET /_mock/stats."""
        return dict(self._call(lambda: self.server.stats.snapshot()))

    def reset_stats(self) -> None:
        self._call(lambda: self.server.reset_stats())

    def configure(self, **updates: Any) -> MockConfig:
        """Change knobs live, like POST /_mock/config (also accepts down=True/False)."""
        cfg = self._call(lambda: self.server.configure(**updates))
        assert isinstance(cfg, MockConfig)
        return cfg

    def stop(self) -> None:
        loop, server, thread = self._loop, self._server, self._thread
        if loop is None or server is None or thread is None or loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        self._loop = None

    def __enter__(self) -> MockThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def serve_forever(cfg: MockConfig, host: str, port: int) -> None:
    """Run the mock until interrupted (Ctrl-C or SIGTERM). Prints "mock endpoint on <url>" once started."""

    async def main() -> None:
        server = await start_mock(cfg, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
        print(f"mock endpoint on {server.url}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.close()

    with asyncio.Runner(loop_factory=_new_loop) as runner, contextlib.suppress(KeyboardInterrupt):
        runner.run(main())
