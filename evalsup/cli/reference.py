"""docs/cli.md, the command-line reference, made from click's own command tree (issue 44 item 6).

Every command and subcommand of `evalsup`, in the order `evalsup --help` lists them: its usage line, its help,
and its options (those of `evalsup run` in their help sections, config/options.py's GROUPS through cloup), each
with its default and its environment variable. Nothing here restates an option: a row is read from the click
parameter the command parses with, so the reference says what `--help` says.

    python -m evalsup.cli.reference docs/cli.md     # write it (the one command that regenerates it)
    python -m evalsup.cli.reference --check docs/cli.md    # exit 1 when the file is out of date

tests/unit/test_cli_reference.py fails when docs/cli.md differs from what this writes.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import cloup

from evalsup.cli.main import main as evalsup_command

REGENERATE = "python -m evalsup.cli.reference docs/cli.md"


def _cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    """``text`` as inline code (a longer fence when it holds a backtick)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _help_blocks(text: str) -> list[str]:
    """A click help text as Markdown: a paragraph is joined into one line, a ``\\b`` paragraph (kept as typed
    by click) becomes a ``text`` block; what follows ``\\f`` is not help."""
    text = inspect.cleandoc(text.split("\f", 1)[0])
    out: list[str] = []
    for para in text.split("\n\n"):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            body = inspect.cleandoc("\n".join(lines[1:]))
            out.append(f"```text\n{body}\n```")
        elif para.strip():
            out.append(" ".join(para.split()))
    return out


def _default(p: click.Option, ctx: click.Context) -> str:
    """The default as a person would type it, or "" when there is none to say (an off flag, nothing)."""
    if isinstance(p.show_default, str):
        return p.show_default
    value: Any = p.get_default(ctx, call=False)
    if callable(value):
        return "(computed)"
    if p.is_bool_flag and p.secondary_opts:  # --stream/--no-stream: the flag that is in effect
        return (p.opts if value else p.secondary_opts)[-1]
    if p.is_flag and not p.secondary_opts:
        return ""  # a plain flag is off unless given
    if value is None or value == () or type(value).__name__ == "Sentinel":
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def _envvar(p: click.Option) -> str:
    env = p.envvar
    if not env:
        return ""
    names = [env] if isinstance(env, str) else list(env)
    return ", ".join(_code(f"${n}") for n in names)


def _option_row(p: click.Option, ctx: click.Context) -> str:
    record = p.get_help_record(ctx)
    flags = record[0] if record else "/".join(p.opts)
    notes = []
    if p.multiple and "repeatable" not in (p.help or "").lower():
        notes.append("repeatable")
    if p.required:
        notes.append("required")
    if isinstance(p.type, click.IntRange | click.FloatRange) and (p.type.min, p.type.max) != (None, None):
        lo, hi = p.type.min, p.type.max
        notes.append(f"{lo} to {hi}" if lo is not None and hi is not None else f"at least {lo}" if lo is not None
                     else f"at most {hi}")
    what = _cell(p.help or "") + (f" ({', '.join(notes)})" if notes else "")
    default = _default(p, ctx)
    return f"| {_code(_cell(flags))} | {_code(_cell(default)) if default else ''} | {_envvar(p)} | {what} |"


def _table(options: Sequence[click.Option], ctx: click.Context) -> list[str]:
    rows = [_option_row(p, ctx) for p in options if not p.hidden and not set(p.opts) & set(ctx.help_option_names)]
    if not rows:
        return []
    return ["| option | default | environment | what it does |", "|---|---|---|---|", *rows]


def _anchor(path: str) -> str:
    """GitHub's anchor for a heading ``path`` (``evalsup cache stats`` -> ``evalsup-cache-stats``)."""
    return path.lower().replace(" ", "-")


def _commands(cmd: click.Command, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    """``cmd`` and every command below it, depth first in the order its group lists them; hidden ones left out."""
    yield cmd, ctx
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _commands(sub, click.Context(sub, info_name=name, parent=ctx))


def _section(cmd: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    out = [f"## {path}", "", f"```text\n{path} {' '.join(cmd.collect_usage_pieces(ctx))}\n```", ""]
    for block in _help_blocks(cmd.help or ""):
        out += [block, ""]
    if isinstance(cmd, click.Group):
        subs = [(n, cmd.get_command(ctx, n)) for n in cmd.list_commands(ctx)]
        out += ["| command | what it does |", "|---|---|"]
        out += [f"| [{_code(f'{path} {n}')}](#{_anchor(f'{path} {n}')}) | {_cell(s.get_short_help_str(200))} |"
                for n, s in subs if s is not None and not s.hidden]
        out.append("")
    options = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option)]
    groups = cmd.option_groups if isinstance(cmd, cloup.Command) else []
    grouped = {id(p) for g in groups for p in g.options}
    for g in groups:
        if g.hidden or not [p for p in g.options if not p.hidden]:
            continue
        out += [f"### {path}: {g.title}", ""]
        if g.help:
            out += [f"{g.help[0].upper()}{g.help[1:]}.", ""]
        out += [*_table(g.options, ctx), ""]
    rest = _table([p for p in options if id(p) not in grouped], ctx)
    if rest:
        out += [f"### {path}: options" if groups else "Options:", "", *rest, ""]
    return out


def render() -> str:
    """The whole of docs/cli.md."""
    root = click.Context(evalsup_command, info_name="evalsup")
    out = ["# evalsup command-line reference", "",
           f"Made from the commands' own definitions by `{REGENERATE}`: do not edit it by hand (a unit test fails "
           "when it is out of date). Every run option may also come from `--config FILE` (TOML, the flag's name "
           "as the key) or from the environment variable shown; a flag given beats the environment, which beats "
           "the file, which beats the run's recorded settings on a resume, which beat the default.", ""]
    out += [f"- [{_code(c.command_path)}](#{_anchor(c.command_path)})" for _, c in _commands(evalsup_command, root)]
    out.append("")
    for cmd, ctx in _commands(evalsup_command, root):
        out += _section(cmd, ctx)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    if len(paths) != 1:
        print("usage: python -m evalsup.cli.reference [--check] docs/cli.md", file=sys.stderr)
        return 2
    path = Path(paths[0])
    text = render()
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
