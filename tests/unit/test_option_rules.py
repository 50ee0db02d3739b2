"""The option table's needs/conflicts (config/options.RULES, issue 44 item 8): every plain "A needs B" and "A
cannot go with B" is refused by one check, in one line of one shape, by `evalsup run` and evalsup.run alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evalsup.cli.main import main
from evalsup.config import options
from evalsup.config.options import BY_NAME, RULES, Option, Rule
from evalsup.config.run_config import ConfigError, build_config

URL = "http://127.0.0.1:9/v1"


def _setting(o: Option) -> Any:
    """A value that sets ``o`` (not its default)."""
    if o.kind in ("flag", "bool"):
        return not o.default
    if o.kind == "choice":
        return o.choices[-1]
    if o.kind in ("int", "float"):
        return 2
    return {"shard": "1/2", "response_schema": {"type": "object"}}.get(o.name, "x")


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.name}-{r.kind}-{r.other}")
def test_each_rule_is_refused_in_one_line(tmp_path: Path, rule: Rule) -> None:
    a, b = BY_NAME[rule.name], BY_NAME[rule.other]
    given: dict[str, Any] = {"base_url": [URL], rule.name: _setting(a)}
    if rule.kind == "conflicts":
        given[rule.other] = _setting(b)
        given |= {r.other: _setting(BY_NAME[r.other]) for r in RULES if r.name == rule.other and r.kind == "needs"}
    with pytest.raises(ConfigError) as got:
        build_config(tmp_path / "t.jsonl", given)
    verb = "needs" if rule.kind == "needs" else "cannot go with"
    said = str(got.value)
    assert said.startswith(f"--{'no-' if a.kind == 'bool' else ''}{a.flag[2:]} {verb} {b.flag}")
    assert "\n" not in said


def test_a_rule_added_to_the_table_is_enforced_with_no_other_code(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a rule is a table row: --metrics-host without --metrics-port is refused once the row is there."""
    given = {"base_url": [URL], "metrics_host": "0.0.0.0"}
    build_config(tmp_path / "t.jsonl", given)  # no rule yet: taken
    monkeypatch.setattr(options, "RULES", (*RULES, Rule("metrics_host", "needs", "metrics_port", "where to serve")))
    with pytest.raises(ConfigError, match=r"^--metrics-host needs --metrics-port: where to serve$"):
        build_config(tmp_path / "t.jsonl", given)


def test_an_option_at_its_default_breaks_no_rule(tmp_path: Path) -> None:
    """--validate-schema given as it is by default goes with --response-schema."""
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object"}')
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [URL], "validate_schema": True,
                                              "response_schema": str(schema)})
    assert cfg.worker.response_schema == {"type": "object"}


def test_the_cli_says_the_same_line_before_anything_moves(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "prompt": "hi"}\n')
    (tmp_path / "t.run").mkdir()
    got = CliRunner().invoke(main, ["run", "--resume", "--fresh", "--base-url", URL, str(tasks)])
    assert got.exit_code == 2
    assert got.output.strip() == ("evalsup: --resume cannot go with --fresh: one resumes the run, the other starts "
                                  "it over; give one")
    assert (tmp_path / "t.run").is_dir()


# flags other commands declare with a meaning of their own (not the run's option of the same name)
OWN = {("score", "--workers"), ("estimate", "--base-url"), ("estimate", "--cache")}


def test_other_commands_take_the_run_flags_from_the_table() -> None:
    """demo, score, cancel and estimate declare a run flag as `evalsup run` does (its short flag, type, range,
    repeatability, metavar): from the option table, not restated."""
    import click

    run = {p.opts[0] if p.opts[0].startswith("--") else p.opts[-1]: p for p in main.commands["run"].params
           if isinstance(p, click.Option)}
    checked = 0
    for name in ("demo", "score", "cancel", "estimate"):
        for p in main.commands[name].params:
            if not isinstance(p, click.Option):
                continue
            flag = next(f for f in p.opts if f.startswith("--"))
            if flag not in run or (name, flag) in OWN:
                continue
            r = run[flag]
            assert sorted(p.opts) == sorted(r.opts) and p.multiple == r.multiple, (name, flag)
            kinds = type(p.type), type(r.type)  # (a command may bound a number otherwise: IntRange of an int)
            assert issubclass(*kinds) or issubclass(*kinds[::-1]), (name, flag)
            assert p.metavar == r.metavar, (name, flag)
            checked += 1
    assert checked >= 25
