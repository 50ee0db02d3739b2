"""The first hour (issue 44): --resume, --config and $EVALSUP_<OPTION> on real runs against the mock."""

from __future__ import annotations

from pathlib import Path

from evalsup.mock.server import MockThread
from tests.harness import assert_exactly_once, chat_requests, ids_of, run_cli, write_tasks


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
