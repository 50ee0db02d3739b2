"""Issue 28 item 3, without a run: which options the user gave (click's parameter source), the merge of run.json's
request settings into a resume's config (evalsup.rundir.run_json.resume_config), the line that says so, an older
run.json's missing keys, and the API's arguments and message. (Runs: integration/test_resume_settings.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.config.run_config import ConfigError
from evalsup.rundir.run_json import differences, guard, recorded_options, request_settings, resume_config

URL = "http://127.0.0.1:9/v1"
RECORDED = {"model": "m", "max_tokens": 7, "temperature": 0.5, "stream": True, "endpoint_path": "/v1",
            "scorers": ["exact_match"], "score_strip": False, "score_ignore_case": True, "score_pattern": "(a)",
            "score_normalize": True, "response_schema": {"type": "object"}, "max_reasks": 1, "batch_api": False,
            "batch_provider": "auto", "group_by": "metadata.subject", "validate_schema": True}


def _run_json(run_dir: Path, settings: dict[str, Any]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_bytes(orjson.dumps({"version": 1, "settings": settings, "created": 1.0}))
    return run_dir


def _given(*argv: str) -> dict[str, Any]:
    """What `evalsup run ARGV` hands to resume_config."""
    from evalsup.cli.main import given_options
    from evalsup.cli.main import run as run_command

    ctx = run_command.make_context("evalsup run", list(argv))
    return given_options(ctx, ctx.params)


def test_only_the_options_given_are_given() -> None:
    assert _given("t.jsonl") == {}
    assert _given("--model", "m", "-w", "2", "--no-stream", "t.jsonl") == {"model": "m", "workers": 2,
                                                                            "stream": False}
    assert _given("--stream", "--scorer", "contains", "--max-tokens", "0", "t.jsonl") == {
        "stream": True, "scorers": ("contains",), "max_tokens": 0}


def test_a_fresh_run_takes_todays_defaults(tmp_path: Path) -> None:
    cfg, line = resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})
    assert line is None and cfg.run_dir == tmp_path / "t.run"
    assert request_settings(cfg) == {"model": None, "max_tokens": None, "temperature": None, "stream": False,
                                     "endpoint_path": "/v1", "scorers": [], "score_strip": True,
                                     "score_ignore_case": False, "score_pattern": None,
                                     "score_normalize": False, "response_schema": None, "max_reasks": 2,
                                     "batch_api": False, "batch_provider": "auto", "group_by": None,
                                     "validate_schema": True}


def test_a_resume_takes_every_request_flag_left_out_from_run_json(tmp_path: Path) -> None:
    run_dir = _run_json(tmp_path / "t.run", RECORDED)
    cfg, line = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "workers": 3})
    assert request_settings(cfg) == RECORDED and cfg.workers == 3
    assert line == (f"resuming with the settings of {run_dir}/run.json: model='m', max_tokens=7, temperature=0.5, "
                    "stream=True, scorers=['exact_match'], score_strip=False, score_ignore_case=True, "
                    "score_pattern='(a)', score_normalize=True, response_schema={'type': 'object'}, max_reasks=1, "
                    "group_by='metadata.subject'")
    # a flag given with the recorded value is not taken (and not listed); the rest still are
    cfg, line = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "model": "m", "stream": True})
    assert request_settings(cfg) == RECORDED
    assert line is not None and "model" not in line and "stream" not in line and "max_tokens=7" in line


def test_a_flag_given_with_another_value_wins_and_the_guard_refuses_it(tmp_path: Path) -> None:
    run_dir = _run_json(tmp_path / "t.run", RECORDED)
    cfg, line = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "model": "other"})
    assert cfg.worker.model == "other" and cfg.worker.max_tokens == 7
    assert line is None  # the resume will be refused: no "resuming with" before the refusal
    assert differences(RECORDED, request_settings(cfg)) == ["model (--model): 'm' then, 'other' now"]
    cfg, line = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "model": "other",
                                                     "accept_changed_settings": True})
    assert line is not None and line.endswith("max_tokens=7, temperature=0.5, stream=True, scorers=['exact_match'], "
                                              "score_strip=False, score_ignore_case=True, score_pattern='(a)', "
                                              "score_normalize=True, response_schema={'type': 'object'}, "
                                              "max_reasks=1, group_by='metadata.subject'")
    assert guard(run_dir, request_settings(cfg), True, True) == ["model (--model): 'm' then, 'other' now"]


def test_settings_at_todays_defaults_need_no_line(tmp_path: Path) -> None:
    _run_json(tmp_path / "t.run", {"model": None, "max_tokens": None, "temperature": None, "stream": False,
                                   "endpoint_path": "/v1", "scorers": [], "score_strip": True,
                                   "score_ignore_case": False, "score_pattern": None,
                                     "score_normalize": False})
    assert resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})[1] is None


def test_fresh_out_and_shards_read_their_own_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = tmp_path / "t.jsonl"
    _run_json(tmp_path / "t.run", RECORDED)
    cfg, line = resume_config(tasks, {"base_url": [URL], "fresh": True})  # the old directory is moved aside
    assert cfg.worker.model is None and line is None
    cfg, _ = resume_config(tasks, {"base_url": [URL], "out": tmp_path / "elsewhere"})
    assert cfg.worker.model is None
    _run_json(tmp_path / "elsewhere", {**RECORDED, "model": "e"})
    assert resume_config(tasks, {"base_url": [URL], "out": str(tmp_path / "elsewhere")})[0].worker.model == "e"
    _run_json(tmp_path / "t.run" / "shard-1-of-2", {**RECORDED, "model": "s1"})
    assert resume_config(tasks, {"base_url": [URL], "shard": "1/2"})[0].worker.model == "s1"
    assert resume_config(tasks, {"base_url": [URL], "shard": "0/2"})[0].worker.model is None  # not started
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("EVALSUP_SHARDS", "2")
    cfg, line = resume_config(tasks, {"base_url": [URL], "shard": "auto"})
    assert cfg.worker.model == "s1" and line is not None and "shard-1-of-2/run.json" in line


def test_an_older_run_json_takes_todays_default_for_a_key_it_lacks(tmp_path: Path) -> None:
    old = {k: v for k, v in RECORDED.items() if k not in ("score_strip", "score_ignore_case", "score_pattern",
                                                             "score_normalize", "response_schema",
                                                             "max_reasks", "batch_api", "batch_provider",
                                                             "endpoint_path", "group_by", "validate_schema")}
    run_dir = _run_json(tmp_path / "t.run", old)
    assert recorded_options(run_dir, {}) == {"model": "m", "max_tokens": 7, "temperature": 0.5, "stream": True,
                                             "scorers": ("exact_match",)}
    cfg, _ = resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})
    assert cfg.worker.score_strip is True and cfg.worker.score_ignore_case is False
    assert differences(old, request_settings(cfg)) == []  # not a change: they were today's defaults then
    assert guard(run_dir, request_settings(cfg), True, False) == []
    assert orjson.loads((run_dir / "run.json").read_bytes())["settings"] == request_settings(cfg)  # filled in
    # but another value given for a key it lacks is a change
    cfg, _ = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "ignore_case": True})
    assert differences(old, request_settings(cfg)) == ["score_ignore_case (--ignore-case): False then, True now"]


def test_group_by_is_restored_when_left_out_and_free_to_change(tmp_path: Path) -> None:
    """--group-by changes no request: recorded and restored like a request flag, but another value on a resume is
    taken (not refused) and kept for the next one; 'off' stops grouping."""
    run_dir = _run_json(tmp_path / "t.run", RECORDED)
    cfg, line = resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})
    assert cfg.worker.group_by == "metadata.subject" and line is not None and "group_by='metadata.subject'" in line
    cfg, _ = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "group_by": "metadata.level"})
    assert cfg.worker.group_by == "metadata.level" and differences(RECORDED, request_settings(cfg)) == []
    assert guard(run_dir, request_settings(cfg), True, False) == []  # not refused, nothing to accept
    assert orjson.loads((run_dir / "run.json").read_bytes())["settings"]["group_by"] == "metadata.level"
    assert resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})[0].worker.group_by == "metadata.level"
    cfg, _ = resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "group_by": "off"})
    assert cfg.worker.group_by is None
    guard(run_dir, request_settings(cfg), True, False)
    assert resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})[0].worker.group_by is None


def test_a_run_json_that_cannot_be_read_is_left_to_the_guard(tmp_path: Path) -> None:
    run_dir = tmp_path / "t.run"
    run_dir.mkdir()
    (run_dir / "run.json").write_bytes(b"{not json")
    assert recorded_options(run_dir, {}) == {}
    (run_dir / "run.json").write_bytes(orjson.dumps({"version": 9, "settings": {}}))
    assert recorded_options(run_dir, {}) == {}


def test_a_recorded_value_no_flag_could_set_is_refused_unless_the_flag_is_given(tmp_path: Path) -> None:
    _run_json(tmp_path / "t.run", {**RECORDED, "max_tokens": "7"})
    with pytest.raises(ConfigError, match=r"settings\.max_tokens is '7', which --max-tokens cannot be"):
        resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})
    assert resume_config(tmp_path / "t.jsonl", {"base_url": [URL], "max_tokens": 9})[0].worker.max_tokens == 9
    _run_json(tmp_path / "t.run", {**RECORDED, "stream": 1})
    with pytest.raises(ConfigError, match=r"settings\.stream"):
        resume_config(tmp_path / "t.jsonl", {"base_url": [URL]})


def test_the_api_passes_on_only_the_keywords_given() -> None:
    from evalsup.common.child import last_message as _last_message
    from evalsup.config.options import argv_of as _argv

    assert _argv({"out": "r", "stream": False}) == ["--out", "r", "--no-stream"]
    assert _argv({"out": "r", "model": None, "stream": True}) == ["--out", "r", "--stream"]
    refused = ["evalsup: r: the run was started with other request settings; resuming would mix them in one "
               "results file:", "  model (--model): 'm' then, 'other' now", "  rerun without those flags"]
    assert _last_message(["evalsup: endpoint up", *refused]) == "\n".join(
        [refused[0][len("evalsup: "):], *refused[1:]])
    assert _last_message(["evalsup: stopped", "  not the end", "evalsup: last"]) == "last"
