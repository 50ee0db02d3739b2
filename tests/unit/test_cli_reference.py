"""docs/cli.md, the command-line reference, is made from click's own command tree (evalsup/cli/reference.py) and
kept current: a command, an option, a default or a help text changed without regenerating it fails here, naming
the one command that regenerates it (issue 44 item 6). In-process: no process, no socket."""

from __future__ import annotations

import difflib
import re

import click
import pytest

from evalsup.cli.main import main
from evalsup.cli.reference import REGENERATE, render
from evalsup.config.options import GROUPS, RUN_OPTIONS, env_var
from tests.harness import ROOT

CLI_MD = ROOT / "docs" / "cli.md"


def test_docs_cli_md_is_current() -> None:
    assert CLI_MD.exists(), f"docs/cli.md is missing: run {REGENERATE}"
    have, want = CLI_MD.read_text(), render()
    if have != want:
        diff = list(difflib.unified_diff(have.splitlines(), want.splitlines(), "docs/cli.md", "generated", lineterm=""))
        pytest.fail(f"docs/cli.md is out of date: run {REGENERATE}\n" + "\n".join(diff[:20]), pytrace=False)


def _paths(cmd: click.Command, ctx: click.Context) -> list[str]:
    out = [ctx.command_path]
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            if not sub.hidden:
                out += _paths(sub, click.Context(sub, info_name=name, parent=ctx))
    return out


def test_every_command_and_subcommand_has_its_section() -> None:
    text = render()
    paths = _paths(main, click.Context(main, info_name="evalsup"))
    assert {"evalsup run", "evalsup status", "evalsup cache stats", "evalsup cache import"} <= set(paths)
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == paths


def _run_section(text: str) -> str:
    return text[text.index("\n## evalsup run\n"):text.index("\n## ", text.index("\n## evalsup run\n") + 1)]


def test_run_options_are_in_their_help_groups_in_order_with_default_and_environment() -> None:
    run = _run_section(render())
    at = [run.index(f"\n### evalsup run: {g.title}\n") for g in GROUPS]
    assert at == sorted(at)
    for o in RUN_OPTIONS:
        if o.hidden:
            assert f"`{o.flag}" not in run and f" {o.flag} " not in run, o.flag
            continue
        row = next((line for line in run.splitlines() if line.startswith("| `") and o.flag in line.split("|")[1]),
                   None)
        assert row is not None, o.flag
        group = next(g for g in GROUPS if o.name in g.names)
        start = run.index(f"\n### evalsup run: {group.title}\n")
        end = run.find("\n### ", start + 1)
        assert row in run[start:end if end > 0 else None], f"{o.flag} is not under {group.title}"
        cells = [c.strip() for c in row.split(" | ")]
        env = env_var(o)
        assert (f"`${env}`" in cells[2]) if env else cells[2] == "", (o.flag, cells[2])
        if o.show_default and o.kind not in ("flag", "bool"):
            assert cells[1] == f"`{o.default}`", (o.flag, cells[1])


def test_a_pipe_in_a_value_does_not_break_the_table() -> None:
    run = _run_section(render())
    row = next(line for line in run.splitlines() if "--on-invalid" in line.split(" | ")[0])
    assert len(re.split(r"(?<!\\)\|", row)) == 6  # four cells: the choices' pipe is escaped
