"""Issue 28 item 3: a resume continues with the request settings recorded in run.json. Rerunning with only the
task file (the endpoint from $OPENAI_BASE_URL) takes --model, --max-tokens, --temperature and --stream from the
run and says so in one line; a flag given with another value is still refused, or accepted with
--accept-changed-settings; evalsup.run(tasks, out=...) does the same. Real processes, real files, a mock on
127.0.0.1 that keeps what it was sent."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import (
    Run,
    assert_clean_exit,
    assert_exactly_once,
    complete_lines,
    ids_of,
    quiesce,
    read_results,
    run_cli,
    write_tasks,
)

SETTINGS = ("--model", "m", "--max-tokens", "7", "--temperature", "0.5", "--stream")
SENT = {"model": "m", "max_tokens": 7, "temperature": 0.5, "stream": True}
RESUMED = "resuming with the settings of"


class Sent:
    """What the mock was sent: the request settings of each chat request."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def settings(self) -> list[dict[str, Any]]:
        return [{k: b.get(k) for k in SENT} for b in self.bodies]

    def clear(self) -> None:
        self.bodies.clear()


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def recording_mock(sent: Sent, monkeypatch: pytest.MonkeyPatch) -> Iterator[MockThread]:
    """The project's mock, serving the models m and other, keeping every chat request's body."""
    import evalsup.mock.server as server

    inner = server.chat_completions

    async def chat_completions(call: Any) -> Any:
        sent.bodies.append(orjson.loads(await call.request.read()))  # aiohttp keeps the body for the mock
        return await inner(call)

    monkeypatch.setattr(server, "chat_completions", chat_completions)
    with MockThread(MockConfig(latency_ms=5, jitter_ms=2, seed=1, models=("m", "other"))) as m:
        yield m


def _stopped_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run], how: str,
                 n: int = 1000) -> tuple[Path, Path]:
    """A run with --model m --max-tokens 7 --temperature 0.5 --stream, stopped mid-way (SIGTERM or kill -9)."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, form="prompt")
    run_dir = tmp_path / "sig.run"
    mock.configure(latency_ms=150, jitter_ms=20)
    p = start("run", *SETTINGS, "-w", "1", "-c", "16", "--out", str(run_dir), str(tasks),
              env={"OPENAI_BASE_URL": mock.url})
    p.wait_results(run_dir, 50)
    if how == "sigterm":
        p.signal(signal.SIGTERM)
        assert p.finish() == 75, p.stderr
    else:
        p.kill_group()
    assert p.wait_workers_gone() == []
    assert complete_lines(run_dir / "results.jsonl") < n, "the run finished before it could be stopped"
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    return tasks, run_dir


def _resumed_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if RESUMED in x]


@pytest.mark.parametrize("how", ["sigterm", "kill"])
def test_a_resume_with_only_the_task_file_continues_with_the_recorded_settings(
        tmp_path: Path, recording_mock: MockThread, sent: Sent, start: Callable[..., Run], how: str) -> None:
    tasks, run_dir = _stopped_run(tmp_path, recording_mock, start, how)
    assert set(map(str, sent.settings())) == {str(SENT)}
    run_json = (run_dir / "run.json").read_bytes()
    sent.clear()

    r = run_cli("run", "--out", str(run_dir), str(tasks), env={"OPENAI_BASE_URL": recording_mock.url})
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    said = _resumed_lines(r.stderr)
    assert said == [f"evalsup: {RESUMED} {run_dir}/run.json: model='m', max_tokens=7, temperature=0.5, "
                    "stream=True"], r.stderr
    recs = assert_exactly_once(run_dir, ids_of(1000))
    assert sent.bodies, "the resume sent nothing"
    assert all(s == SENT for s in sent.settings()), sent.settings()[:3]  # every request, as the run began
    assert all(x["error"] is None and x["metrics"]["ttft_s"] is not None for x in recs)  # streamed, before and after
    assert all(x["response"]["body"]["usage"]["completion_tokens"] <= 7 for x in recs)  # max_tokens 7
    assert (run_dir / "run.json").read_bytes() == run_json  # nothing changed, nothing to record

    # the run is finished: the same short command once more sends nothing and says the same
    sent.clear()
    r = run_cli("run", "--out", str(run_dir), str(tasks), env={"OPENAI_BASE_URL": recording_mock.url})
    assert r.returncode == 0 and len(_resumed_lines(r.stderr)) == 1, r.stderr
    assert sent.bodies == []


def test_a_flag_given_with_another_value_is_refused_unless_accepted(
        tmp_path: Path, recording_mock: MockThread, sent: Sent, start: Callable[..., Run]) -> None:
    tasks, run_dir = _stopped_run(tmp_path, recording_mock, start, "kill")
    before = (run_dir / "results.jsonl").read_bytes()
    env = {"OPENAI_BASE_URL": recording_mock.url}
    sent.clear()

    r = run_cli("run", "--model", "other", "--out", str(run_dir), str(tasks), env=env)
    assert r.returncode == 2, r.stderr
    assert_clean_exit(r)
    diff = [x for x in r.stderr.splitlines() if " then, " in x]
    assert diff == ["  model (--model): 'm' then, 'other' now"], r.stderr  # only the flag given, not those left out
    assert "--accept-changed-settings" in r.stderr and _resumed_lines(r.stderr) == [], r.stderr
    assert sent.bodies == [] and (run_dir / "results.jsonl").read_bytes() == before

    # the same value as recorded is no change; --no-stream given is one
    r = run_cli("run", "--no-stream", "--model", "m", "--out", str(run_dir), str(tasks), env=env)
    assert r.returncode == 2, r.stderr
    assert [x for x in r.stderr.splitlines() if " then, " in x] == ["  stream (--stream): True then, False now"]

    r = run_cli("run", "--model", "other", "--accept-changed-settings", "--out", str(run_dir), str(tasks), env=env)
    assert r.returncode == 0, r.stderr
    assert _resumed_lines(r.stderr) == [f"evalsup: {RESUMED} {run_dir}/run.json: max_tokens=7, temperature=0.5, "
                                        "stream=True"], r.stderr
    assert any("--accept-changed-settings: model" in x for x in r.stderr.splitlines()), r.stderr
    assert_exactly_once(run_dir, ids_of(1000))
    assert sent.bodies and all(s == {**SENT, "model": "other"} for s in sent.settings())
    rec = orjson.loads((run_dir / "run.json").read_bytes())
    assert rec["settings"] | {"model": "m"} == rec["changes"][-1]["from"]
    assert {k: rec["settings"][k] for k in SENT} == {**SENT, "model": "other"}
    assert len(rec["changes"]) == 1


def test_the_api_resumes_with_only_tasks_and_out(tmp_path: Path, recording_mock: MockThread, sent: Sent,
                                                 start: Callable[..., Run], monkeypatch: pytest.MonkeyPatch) -> None:
    import evalsup

    tasks, run_dir = _stopped_run(tmp_path, recording_mock, start, "sigterm")
    sent.clear()
    monkeypatch.setenv("OPENAI_BASE_URL", recording_mock.url)  # the endpoint is never recorded
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(evalsup.BadSettings, match=r"'m' then, 'other' now"):
        evalsup.run(tasks, out=run_dir, model="other", progress=False)
    assert sent.bodies == []
    result = evalsup.run(tasks, out=run_dir, progress=False)
    assert result.total == 1000 and result.succeeded == 1000
    assert_exactly_once(run_dir, ids_of(1000))
    assert sent.bodies and all(s == SENT for s in sent.settings())
    assert result.summary["settings"]["model"] == "m"
    assert len(read_results(run_dir)) == 1000
