"""The docs' command blocks, and the convention that says which are run (issue 44 item 6: every command shown in
the docs is run by a test, so the docs cannot drift).

The convention: an HTML comment on the line before a fenced block (invisible on GitHub) says what the docs test
does with it::

    <!-- doc-test: run -->                               every line of the block is run
    <!-- doc-test: run; given tasks.jsonl -->            ... after a sample task file is written first
    <!-- doc-test: run; skip 1-2 (your own server: the test's mock stands in) -->
                                                         lines 1 and 2 of the block are shown, not run
    <!-- doc-test: skip (needs a Slurm cluster) -->       the whole block is shown, not run

Clauses are separated by ``;``. A skip always says why, in parentheses. A run block is a shell script
(``bash -e``): its lines run in order, one doc's blocks one after another in one temporary directory (what one
block writes, the next may read, as for a reader following the page), against the project's mock on 127.0.0.1
(``$OPENAI_BASE_URL``, serving the models of ``MODELS``), with ``evalsup`` and ``.venv/bin/evalsup`` both the
test's venv's. A skipped line is replaced by ``:``, so the script's line numbers stay the block's. ``given``
names files the runner writes before the block (``GIVEN``). The environment has ``OPENAI_API_KEY`` set to a
dummy and ``HOME`` in the temporary directory; ``export`` in one block does not reach the next.

Which blocks need a comment: in every docs/*.md, each fenced block whose info string is empty or a shell's
(``sh``, ``bash``, ``shell``, ``console``); ``text``, ``json``, ``toml``, ``yaml``, ``python``... are not
commands. README.md is held to that too (a doc may be let off for a while through PENDING).

tests/unit/test_docs.py checks the comments (well formed, a reason for every skip, lines that exist, every
block marked); tests/integration/test_docs_commands.py runs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.harness import ROOT

SHELLS = frozenset({"", "sh", "bash", "shell", "console"})
# docs whose unmarked shell blocks are allowed for now (none: README.md was the last, until issue 44 item 6 cut it
# down and moved the rest to docs/); a doc named here is still checked for well-formed comments
PENDING: frozenset[str] = frozenset()
GIVEN: dict[str, str] = {  # what `given NAME` writes into the block's directory first
    "tasks.jsonl": "".join(
        f'{{"id": "q{i}", "messages": [{{"role": "user", "content": "What is {i} + {i}?"}}], "expected": "{2 * i}"}}\n'
        for i in range(20)),
}
# the models the docs' examples name, which the runner's mock serves (any other is refused, as a real server does)
MODELS = ("my-model", "mock-model")
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)[^`]*$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")
_SKIP = re.compile(r"^skip(?:\s+(?P<lines>[\d,\s-]+?))?\s*\((?P<reason>.+)\)$")


def rel(doc: Path) -> str:
    """``doc`` as the repository names it (README.md, docs/cli.md)."""
    return doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else str(doc)


class DirectiveError(ValueError):
    """A doc-test comment that does not follow the convention (said as FILE:LINE: what)."""


@dataclass(frozen=True)
class Directive:
    run: bool
    reason: str = ""  # why the block is not run (skip)
    skip: dict[int, str] = field(default_factory=dict)  # a run block's lines (1-based) not run, and why
    given: tuple[str, ...] = ()


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # the opening fence's line in the doc (1-based)
    info: str  # the fence's language ("" when none)
    lines: tuple[str, ...]
    directive: Directive | None
    directive_error: str | None = None

    @property
    def where(self) -> str:
        return f"{rel(self.doc)}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.info.lower() in SHELLS

    def script(self) -> str:
        """The block as a bash script, its skipped lines (and a console block's output lines) made ``:``, so the
        script's line N is the block's line N. A ``console`` block's commands are its ``$ `` lines."""
        d = self.directive
        assert d is not None and d.run
        out = []
        for n, text in enumerate(self.lines, 1):
            if n in d.skip:
                out.append(":")
            elif self.info == "console":
                out.append(text[2:] if text.startswith("$ ") else ":")
            else:
                out.append(text)
        return "\n".join(out) + "\n"


def _clauses(body: str) -> list[str]:
    """``body`` split at each ``;`` outside parentheses (a reason may hold one)."""
    out, depth, cur = [], 0, ""
    for ch in body:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def parse_directive(body: str) -> Directive:
    """The comment's text after ``doc-test:``; DirectiveError says what is wrong with it."""
    clauses = [c.strip() for c in _clauses(body) if c.strip()]
    if not clauses or (clauses[0] != "run" and not clauses[0].startswith("skip")):
        raise DirectiveError(f"starts with neither 'run' nor 'skip (REASON)': {body.strip()!r}")
    run = clauses[0] == "run"
    reason, skip, given = "", {}, []
    for c in clauses if not run else clauses[1:]:
        if c.startswith("given "):
            names = c[len("given "):].split()
            unknown = [n for n in names if n not in GIVEN]
            if unknown or not run:
                raise DirectiveError(f"given {' '.join(names)}: the runner knows only {sorted(GIVEN)}, in a run block")
            given += names
            continue
        m = _SKIP.match(c)
        if m is None and c.startswith("skip"):
            raise DirectiveError(f"{c!r}: a skip says why: skip (REASON), or skip LINES (REASON)")
        if m is None:
            raise DirectiveError(f"not a clause: {c!r} (run; given FILE; skip [LINES] (REASON))")
        if m["lines"] is None:
            if run:
                raise DirectiveError(f"{c!r}: a run block skips lines (skip 1-2 (REASON)); a block not run is "
                                     "'skip (REASON)'")
            reason = m["reason"].strip()
            continue
        if not run:
            raise DirectiveError(f"{c!r}: lines are skipped only in a run block")
        for part in m["lines"].replace(" ", "").split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise DirectiveError(f"{c!r}: lines as N, N-M or N,M")
            for n in range(int(lo), int(hi or lo) + 1):
                skip[n] = m["reason"].strip()
    if not run and not reason:
        raise DirectiveError("a skip says why: skip (REASON)")
    return Directive(run=run, reason=reason, skip=skip, given=tuple(given))


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of ``doc`` with the doc-test comment just before it, if any."""
    text = doc.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(text):
        m = _FENCE.match(text[i])
        if m is None:
            i += 1
            continue
        fence, start = m["fence"], i
        j = i + 1
        while j < len(text) and not (text[j].strip().startswith(fence[0] * len(fence))
                                      and text[j].strip().strip(fence[0]) == ""):
            j += 1
        prev = text[start - 1] if start > 0 else ""
        directive, error = None, None
        dm = _DIRECTIVE.match(prev)
        if dm is not None:
            try:
                directive = parse_directive(dm["body"])
            except DirectiveError as e:
                error = str(e)
        lines = tuple(t[len(m["indent"]):] if t.startswith(m["indent"]) else t for t in text[start + 1:j])
        out.append(Block(doc, start + 1, m["info"].lower(), lines, directive, error))
        i = j + 1
    return out


def docs() -> list[Path]:
    """README.md and every docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def problems(doc: Path) -> list[str]:
    """What is wrong with the doc-test comments of ``doc``, one ``FILE:LINE: what`` each."""
    out = []
    strict = rel(doc) not in PENDING
    for b in blocks(doc):
        if b.directive_error is not None:
            out.append(f"{b.where}: doc-test comment: {b.directive_error}")
            continue
        if b.directive is None:
            if strict and b.is_shell:
                out.append(f"{b.where}: a command block without a doc-test comment before it "
                           "(<!-- doc-test: run --> or <!-- doc-test: skip (REASON) -->; a block that is not "
                           "commands: give its fence a language, e.g. ```text)")
            continue
        if not b.is_shell:
            out.append(f"{b.where}: a doc-test comment on a ```{b.info} block (only shell blocks are run)")
        past = sorted(n for n in b.directive.skip if n > len(b.lines))
        if past:
            out.append(f"{b.where}: skip {past}: the block has {len(b.lines)} lines")
    return out
