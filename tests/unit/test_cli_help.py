"""`evalsup run --help` by what a person wants to do, --config and $EVALSUP_<OPTION> with their precedence, and
usage errors in one line (issue 44). In-process (click's own parsing), no process, no socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from evalsup.cli.main import given_options, main, run
from evalsup.config.options import GROUPS, RUN_OPTIONS

TITLES = ["Endpoint and model", "Input and output", "Speed", "Retries and timeouts", "Cost and cache", "Scoring",
          "Provider Batch APIs", "Memory", "Scale-out", "Logging"]


def _help() -> str:
    r = CliRunner().invoke(main, ["run", "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    return r.output


def test_help_is_grouped_in_the_order_a_person_needs() -> None:
    out = _help()
    at = [out.index(f"\n{t}:\n") for t in TITLES]
    assert at == sorted(at)  # the sections, in this order
    first = out[at[0]:at[1]]
    for flag in ("--base-url", "--model", "--max-tokens"):  # what a first run needs, first
        assert flag in first
    assert out.index("--model") < out.index("--workers") < out.index("--max-attempts") < out.index("--max-cost")
    assert "evalsup run --base-url http://localhost:8000/v1 --model MODEL tasks.jsonl" in out  # one example line


def test_every_option_is_in_exactly_one_group_and_shown_once() -> None:
    names = [n for g in GROUPS for n in g.names]
    assert sorted(names) == sorted(o.name for o in RUN_OPTIONS) and len(set(names)) == len(names)
    out = _help()
    for o in RUN_OPTIONS:
        if not o.hidden:
            assert f" {o.flag}" in out, o.flag


def _params(args: list[str], env: dict[str, str] | None = None) -> tuple[dict[str, Any], click.Context]:
    ctx = run.make_context("evalsup run", ["t.jsonl", *args])
    return given_options(ctx, ctx.params), ctx


def test_flag_beats_environment_beats_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "evalsup.toml"
    cfg.write_text('max-tokens = 100\nmodel = "from-file"\ntemperature = 0.5\nscorer = ["choice", "math"]\n'
                   "hedge = true\n")
    given, ctx = _params(["--config", str(cfg)])
    assert given == {"max_tokens": 100, "model": "from-file", "temperature": 0.5, "scorers": ("choice", "math"),
                     "hedge": True}
    assert ctx.meta["evalsup.config"] == str(cfg)
    monkeypatch.setenv("EVALSUP_MAX_TOKENS", "200")
    monkeypatch.setenv("EVALSUP_MODEL", "from-env")
    given, _ = _params(["--config", str(cfg), "--model", "from-flag"])
    assert given["max_tokens"] == 200 and given["model"] == "from-flag" and given["temperature"] == 0.5
    # what nobody gave stays out of `given`: on a resume it takes the run's recorded value (run.json)
    assert "stream" not in given and "workers" not in given


def test_variables_that_already_mean_something_else_are_not_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSUP_SHARDS", "4")  # an indexed Kubernetes Job's shard count for --shard auto
    monkeypatch.setenv("EVALSUP_CACHE", "/tmp/c")  # --cache's own default, read with the cache's rules
    given, _ = _params([])
    assert "shards" not in given and "cache" not in given and "shard" not in given


@pytest.mark.parametrize(("text", "says"), [
    ('api_key = "sk-123"', "a key does not belong in a config file"),
    ('openai-api-key = "sk-123"', "api-key-env"),
    ('header = ["Authorization: Bearer sk-1"]', "holds a credential"),
    ('base-url = "http://u:pw@host/v1"', "does not belong in a config file"),
    ('base-url = "http://host/v1?sig=abc"', "does not belong in a config file"),
    ("max-tokns = 3", "did you mean 'max-tokens'"),
    ("hedge = 1", "must be true or false"),
    ("model = [1, 2]", "takes one value"),
    ("model = ", "not TOML"),
])
def test_a_bad_config_file_is_one_line_naming_it(tmp_path: Path, text: str, says: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text + "\n")
    r = CliRunner().invoke(main, ["run", "--config", str(cfg), "t.jsonl"])
    assert r.exit_code == 2
    err = r.output.strip()
    assert len(err.splitlines()) == 1 and "bad.toml" in err and says in err and "sk-" not in err, err


def test_credentials_through_the_environment_are_accepted(tmp_path: Path) -> None:
    cfg = tmp_path / "ok.toml"
    cfg.write_text('header = ["Authorization: env:MY_TOKEN"]\napi-key-env = "MY_KEY"\n')
    given, _ = _params(["--config", str(cfg)])
    assert given["headers"] == ("Authorization: env:MY_TOKEN",) and given["api_key_env"] == "MY_KEY"


def test_a_usage_error_is_one_line_with_the_help_hint() -> None:
    r = CliRunner().invoke(main, ["run", "--resum", "t.jsonl"], prog_name="evalsup")
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "evalsup run --help" in lines[0], r.output
