"""Absurd values and broken user code are one line and exit 2 before a run starts (issue 39 item 7): a number past
its option's bound (`--max-total-tokens 1e30`, `--connect-timeout 1e300`, `--memory-limit 1e30`, `--max-tokens
1e23`: each crashed with a traceback where it was used), and a `--scorer file.py:fn` whose file does not compile
(config/options.py BOUNDS, config/caps.py, scoring/plugin.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from evalsup.cli.main import main
from evalsup.config.caps import CapError, parse_caps
from evalsup.config.options import BOUNDS, BY_NAME, INT64_MAX, out_of_bounds
from evalsup.config.run_config import ConfigError, build_config
from evalsup.scoring.plugin import PluginError, check, load_callable


@pytest.mark.parametrize(("name", "value", "said"), [
    ("max_tokens", 10**23, "--max-tokens must be at most 9,223,372,036,854,775,807 (a 64-bit integer"),
    ("batch_max_bytes", 10**20, "--batch-max-bytes must be at most 9,223,372,036,854,775,807"),
    ("connect_timeout", 1e300, "--connect-timeout must be from 0 to 31,536,000 seconds (a year"),
    ("timeout", -1.0, "--timeout must be from 0 to 31,536,000 seconds"),
    ("timeout", float("inf"), "--timeout must be a finite number, got inf"),
    ("temperature", float("nan"), "--temperature must be a finite number, got nan"),
    ("memory_limit_mb", 1e30, "--memory-limit must be from 0 to 1,073,741,824 MiB (1 PiB"),
    ("max_line_mb", 1e30, "--max-line-mb must be from 0 to 1,073,741,824 MiB"),
])
def test_a_number_past_its_bound_is_one_line_naming_the_flag_and_the_bound(name: str, value: float, said: str,
                                                                           tmp_path: Path) -> None:
    problem = out_of_bounds(BY_NAME[name], value)
    assert problem is not None and problem.startswith(said) and "\n" not in problem, problem
    with pytest.raises(ConfigError) as e:
        build_config(tmp_path / "t.jsonl", {name: value, "base_url": ("http://127.0.0.1:9/v1",)})
    assert str(e.value) == problem


@pytest.mark.parametrize(("name", "value"), [
    ("max_tokens", INT64_MAX), ("timeout", 0.0), ("timeout", 365 * 86_400.0), ("max_wait_down", 1e6),
    ("memory_limit_mb", 512.0), ("temperature", -0.5), ("max_response_mb", 64.0),
])
def test_values_within_their_bounds_pass(name: str, value: float) -> None:
    assert out_of_bounds(BY_NAME[name], value) is None


def test_every_bound_names_a_numeric_option() -> None:
    assert all(BY_NAME[name].kind == "float" for name in BOUNDS)


def test_a_token_cap_past_a_64_bit_integer_is_refused_and_the_largest_one_kept_exactly() -> None:
    for flag, given in (("--max-total-tokens", (None, None, "1e30")),
                        ("--max-completion-tokens-total", (None, "9223372036854775808", None))):
        with pytest.raises(CapError, match=re.escape(f"{flag} must be at most 9,223,372,036,854,775,807 tokens")):
            parse_caps(*given, None)
    assert parse_caps(None, None, str(INT64_MAX), None).total_tokens == INT64_MAX
    assert parse_caps(None, f"{INT64_MAX}/shard", None, (0, 4)).completion_tokens == INT64_MAX


def test_the_cli_says_it_in_one_line_with_exit_2(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "prompt": "hi"}\n')
    got = CliRunner().invoke(main, ["run", "--base-url", "http://127.0.0.1:9/v1", "--max-total-tokens", "1e30",
                                    str(tasks)])
    assert got.exit_code == 2
    assert got.output.splitlines() == [
        "evalsup: --max-total-tokens must be at most 9,223,372,036,854,775,807 tokens (a 64-bit integer: run.json, "
        "the checkpoint and the cache keep it as one), got '1e30'"]
    assert not (tmp_path / "t.run").exists()


def test_a_scorer_file_with_a_syntax_error_is_named_at_its_line_and_never_run(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    bad = tmp_path / "bad.py"
    bad.write_text(f"open({str(ran)!r}, 'w').close()\n\ndef fn(task, resp):\n    return 1 +\n")
    with pytest.raises(PluginError) as e:
        check(f"{bad}:fn")
    assert str(e.value) == f"{bad}:4: SyntaxError: invalid syntax ('return 1 +') ({bad}:fn)"
    assert not ran.exists()  # compiled, not executed
    with pytest.raises(PluginError) as e2:
        load_callable(f"{bad}:fn")  # the worker's and `evalsup score`'s load says the same
    assert str(e2.value) == str(e.value)
    with pytest.raises(ConfigError) as e3:
        build_config(tmp_path / "t.jsonl", {"scorers": (f"{bad}:fn",), "base_url": ("http://127.0.0.1:9/v1",)})
    assert str(e3.value) == str(e.value)


def test_a_scorer_that_cannot_load_is_one_line(tmp_path: Path) -> None:
    raises = tmp_path / "raises.py"
    raises.write_text("import os\n\nx = os.environ['EVALSUP_NOT_SET_ANYWHERE']\n")
    with pytest.raises(PluginError) as e:
        load_callable(f"{raises}:fn")
    assert str(e.value) == (f"{raises}:3: importing it raised KeyError: 'EVALSUP_NOT_SET_ANYWHERE' "
                            f"({raises}:fn)")
    with pytest.raises(PluginError, match=re.escape(f"{tmp_path}/nope.py:fn: cannot read {tmp_path}/nope.py")):
        check(f"{tmp_path}/nope.py:fn")
    with pytest.raises(PluginError, match="no_such_module_here:fn: no module named 'no_such_module_here'"):
        check("no_such_module_here:fn")
    with pytest.raises(PluginError, match="no module named 'no_such_module_here'"):
        load_callable("no_such_module_here.sub:fn")
