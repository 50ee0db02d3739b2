"""The first hour (issue 44), on real runs against the mock (127.0.0.1): --resume, --config and
$EVALSUP_<OPTION>; one start line (the rest with -v); `status` naming the oldest requests' ids and an exact
total with only the settings that differ; refusals before any other line or request; the demo's next steps
that run as printed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import (
    Run,
    assert_exactly_once,
    chat_requests,
    env_for,
    evalsup_cmd,
    ids_of,
    memory_samples,
    run_args,
    run_cli,
    wait_until,
    write_tasks,
)


def test_resume_refuses_when_there_is_nothing_to_resume_then_resumes_a_run(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 20)
    base = ("--model", "mock-model", "--base-url", mock.url, str(tasks))
    r = run_cli("run", "--resume", *base)
    assert r.returncode == 2 and chat_requests(mock) == 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing to resume in" in lines[0] and "t.run" in lines[0], r.stderr
    r = run_cli("run", *base)
    assert r.returncode == 0, r.stderr
    r = run_cli("run", "--resume", *base)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(20))
    assert chat_requests(mock) == 20


def test_a_config_file_and_the_environment_set_a_run(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 10)
    cfg = tmp_path / "nightly.toml"
    cfg.write_text(f'base-url = "{mock.url}"\nmodel = "mock-model"\nmax-tokens = 8\n')
    r = run_cli("run", "--config", str(cfg), str(tasks), env={"EVALSUP_MAX_TOKENS": "9"})
    assert r.returncode == 0, r.stderr
    assert f"settings from {cfg}" in r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", ids_of(10))
    assert recs  # the environment's 9 beat the file's 8: recorded as the run's setting
    import orjson

    settings = orjson.loads((tmp_path / "t.run" / "run.json").read_bytes())["settings"]
    assert settings["max_tokens"] == 9 and settings["model"] == "mock-model"
    # a resume whose file now says another max-tokens: a change of a request setting, refused as a flag's is
    cfg.write_text(f'base-url = "{mock.url}"\nmodel = "mock-model"\nmax-tokens = 16\n')
    r = run_cli("run", "--config", str(cfg), str(tasks))
    assert r.returncode == 2 and "max-tokens" in r.stderr and "Traceback" not in r.stderr


def _said(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("evalsup: ")]


def test_a_run_says_one_start_line_and_v_says_the_rest(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 50)
    r = run_cli(*run_args(mock, tasks, "-w", "2", "-c", "8", "--self-hosted", "--max-tokens", "50"))
    assert r.returncode == 0, r.stderr
    assert _said(r.stderr) == [f"evalsup: {mock.url}: mock-model, 50 tasks, 2 workers x 4, no cost"]
    v = run_cli(*run_args(mock, tasks, "-w", "2", "-c", "8", "--self-hosted", "--max-tokens", "50", "--fresh", "-v"))
    assert v.returncode == 0, v.stderr
    said = "\n".join(_said(v.stderr))
    for line in (f"endpoint {mock.url} is up and serves mock-model", "estimate for this run: 50 requests",
                 "sizing: memory limit"):
        assert line in said, said


def test_status_names_the_oldest_requests_and_an_exact_total(tmp_path: Path,
                                                             start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 40)
    run_dir = tmp_path / "t.run"
    with MockThread(MockConfig(latency_ms=1500)) as slow:
        run = start(*run_args(slow, tasks, "-w", "1", "-c", "4", "--max-tokens", "7", "--monitor-interval", "0.2"))
        wait_until(lambda: any(s.get("oldest") for s in memory_samples(run_dir)), "requests on the wire", proc=run)
        named = [o["id"] for s in memory_samples(run_dir) for o in s.get("oldest") or ()]
        assert named and set(named) <= ids_of(40)  # never None
        seen: list[dict[str, Any]] = []

        def status_names_some() -> bool:
            seen.append(json.loads(run_cli("status", "--json", str(run_dir)).stdout))
            return bool(seen[-1]["oldest"])

        wait_until(status_names_some, "status naming requests on the wire", proc=run)
        st = seen[-1]
        assert st["state"] == "running" and st["total"] == 40 and st["total_estimated"] is False, st
        assert {o["id"] for o in st["oldest"]} <= ids_of(40)
        text = run_cli("status", str(run_dir)).stdout
        assert " of 40 " in text or " of 40," in text or "of 40" in text, text
        assert "~" not in text
        settings = next(x for x in text.splitlines() if x.strip().startswith("settings"))
        assert "max_tokens=7" in settings and "stream=" not in settings and len(settings) < 80, settings
        run.interrupt()


def test_a_resume_refused_for_the_lock_says_only_that(tmp_path: Path, start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 40)
    run_dir = tmp_path / "t.run"
    with MockThread(MockConfig(latency_ms=1500)) as slow:
        first = run_cli(*run_args(slow, tasks, "-c", "40", "--max-tokens", "7", "--max-wait-down", "1"))
        assert first.returncode == 0, first.stderr
        (tmp_path / "t.jsonl").write_text((tmp_path / "t.jsonl").read_text() + '{"id": "t40", "prompt": "q"}\n')
        holder = start(*run_args(slow, tasks, "-c", "1"))  # resumes (max_tokens 7 taken), holds the directory
        wait_until(lambda: (run_dir / "evalsup.lock").exists() and holder.running, "the first run", proc=holder)
        wait_until(lambda: "resuming" in holder.stderr, "the first run's resume", proc=holder)
        second = run_cli(*run_args(slow, tasks))
        assert second.returncode == 73, second.stderr
        assert len(_said(second.stderr)) == 1 and "resuming with the settings" not in second.stderr, second.stderr
        holder.interrupt()


def test_changed_settings_are_refused_before_the_endpoint_check(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 5)
    first = run_cli(*run_args(mock, tasks, "--max-tokens", "7"))
    assert first.returncode == 0, first.stderr
    before = mock.stats()["by_path"].get("/v1/models", 0)
    r = run_cli(*run_args(mock, tasks, "--max-tokens", "9"))
    assert r.returncode == 2
    assert r.stderr.startswith("evalsup: ") and "the run was started with other request settings" in \
        r.stderr.splitlines()[0], r.stderr
    assert mock.stats()["by_path"].get("/v1/models", 0) == before  # no connection-check request


def test_the_demos_next_steps_run_as_printed(tmp_path: Path) -> None:
    env = env_for({"PATH": "/usr/bin:/bin"})  # as after scripts/demo: no venv on PATH
    r = subprocess.run(evalsup_cmd("demo", "--tasks", "20", "--dir", str(tmp_path / "demo")), capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if re.search(r" status \S+ ", x))
    argv = shlex.split(line.split("  progress")[0].strip())
    assert argv[0] != "evalsup"  # not on this PATH: the full path, or the interpreter with -m
    got = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert got.returncode == 0, got.stderr
    assert "finished" in got.stdout and "20" in got.stdout, got.stdout
