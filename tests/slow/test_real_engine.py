"""evalsup against a real engine: Hugging Face `transformers serve --continuous-batching` on 127.0.0.1 (CPU) with a
tiny random-weight model built locally (scripts/engine/build_tiny_model.py, nothing from a hub).

The engine lives in a venv of its own (torch is ~1 GB and never goes into evalsup's): `scripts/engine-venv` builds
it in `.engine/`, or point `EVALSUP_ENGINE_PYTHON` (and `EVALSUP_ENGINE_MODEL`) at one. Without it these tests
skip, saying where they looked. The server is started once for the module and ended by its process group.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    ROOT,
    Run,
    assert_clean_exit,
    assert_exactly_once,
    lines,
    resume_line,
    resumed_done,
    run_cli,
    summary,
)

# scripts/engine/server.py, loaded by path under a name of its own (no sys.path entry for a module named "server")
_spec = importlib.util.spec_from_file_location("evalsup_engine_server", ROOT / "scripts" / "engine" / "server.py")
assert _spec is not None and _spec.loader is not None
engine = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = engine
_spec.loader.exec_module(engine)

pytestmark = pytest.mark.slow
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[engine.EngineServer]:
    found = engine.find_engine()
    if isinstance(found, str):
        pytest.skip(f"no real engine: {found}")
    py, model = found
    log_path = tmp_path_factory.mktemp("engine") / "server.log"
    with open(log_path, "wb") as log:
        srv = engine.EngineServer(py, model, log=log)
        try:
            srv.start()
        except RuntimeError as e:
            srv.stop()
            pytest.fail(f"{e}; its output:\n{log_path.read_text(errors='replace')[-3000:]}")
        try:
            yield srv
        finally:
            srv.stop()


def chat_task(i: int, srv: engine.EngineServer, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": srv.model_id, "max_tokens": MAX_TOKENS,
                            "messages": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]}
    if stream:
        body["stream"] = True
    return {"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def check_answer(rec: dict[str, Any], srv: engine.EngineServer) -> None:
    assert rec["error"] is None, rec
    resp = rec["response"]
    assert resp["status_code"] == 200 and resp["request_id"], rec
    body = resp["body"]
    assert body["object"] == "chat.completion" and body["model"] == srv.model_id, body
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"].strip(), body
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= MAX_TOKENS, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    # the model is random: it stops at max_tokens unless it happens to draw its end token
    assert choice["finish_reason"] == ("length" if usage["completion_tokens"] == MAX_TOKENS else "stop"), body
    assert rec["metrics"]["endpoint"]["url"] == srv.url


def test_chat_tasks_streamed_and_not(tmp_path: Path, served: engine.EngineServer) -> None:
    """20 chat tasks, every other one streamed (SSE with the usage in the last chunk, no [DONE]): each recorded
    once, with the model's answer, its finish_reason and its token counts, reassembled from the stream."""
    tasks = lines(tmp_path / "tasks.jsonl", [chat_task(i, served, stream=i % 2 == 0) for i in range(20)])
    r = run_cli("run", "--base-url", served.url, str(tasks), timeout=300)
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    recs = assert_exactly_once(tmp_path / "tasks.run", {f"t{i}" for i in range(20)})
    for rec in recs:
        check_answer(rec, served)
    s = summary(tmp_path / "tasks.run")
    assert s["succeeded"] == 20 and s["failed"] == 0, s
    got = sum(rec["response"]["body"]["usage"]["completion_tokens"] for rec in recs)
    assert s["tokens"]["completion"] == got, s["tokens"]


def test_killed_mid_run_resumes_exactly_once(tmp_path: Path, served: engine.EngineServer,
                                             start: Callable[..., Run]) -> None:
    """kill -9 of the whole run (supervisor and workers) while the engine answers; the same command finishes the
    job: every task once, each with a real answer."""
    n = 200
    tasks = lines(tmp_path / "tasks.jsonl", [chat_task(i, served, stream=i % 3 == 0) for i in range(n)])
    run_dir = tmp_path / "tasks.run"
    args = ("run", "--base-url", served.url, str(tasks))
    p = start(*args[:-1], "-c", "2", args[-1])  # slow enough to be caught mid-run; the rerun adapts
    p.wait_results(run_dir, 30, timeout=120)
    p.kill_group()
    assert p.wait_workers_gone() == []
    r = run_cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    assert 30 <= resumed_done(resume_line(r.stderr)) < n, r.stderr  # it was stopped mid-way, and resumed
    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    for rec in recs:
        check_answer(rec, served)
