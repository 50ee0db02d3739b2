"""The docs keep true (issue 44 item 6), in-process: every shell block carries a well-formed doc-test comment
(tests/doc_blocks.py: run, or skip with a reason), the map docs/README.md links every guide and every link of it
is there, and each guide's "Moving here from README.md" list names README sections that exist, each claimed
once, so the README's cut-down is a move. The blocks themselves run in tests/integration/test_docs_commands.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks import DirectiveError, blocks, docs, parse_directive, problems, rel
from tests.harness import ROOT

DOCS_DIR = ROOT / "docs"
MAP = DOCS_DIR / "README.md"
# guides the map links before they land: docs/serve.md is being written on another branch (issue 42)
COMING: frozenset[str] = frozenset()
MOVING = "## Moving here from README.md"
STAYS = "## Stays in README.md"


def test_every_shell_block_of_the_docs_says_whether_it_runs() -> None:
    found = [p for d in docs() for p in problems(d)]
    assert not found, "\n".join(found)
    marked = [b for d in docs() for b in blocks(d) if b.directive is not None]
    assert any(b.directive is not None and b.directive.run for b in marked)
    assert all(b.directive is not None and (b.directive.run or b.directive.reason) for b in marked)


def test_an_unmarked_command_block_or_a_skip_without_a_reason_is_named(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text("# A guide\n\n```sh\nevalsup status tasks.run\n```\n\n<!-- doc-test: skip -->\n```sh\nx\n```\n\n"
                   "<!-- doc-test: run; skip 3 (no such line) -->\n```sh\nevalsup --help\n```\n\n"
                   "```text\nnot a command\n```\n")
    found = problems(doc)
    assert [f.split(": ", 1)[0] for f in found] == [f"{doc}:3", f"{doc}:8", f"{doc}:13"], found
    assert "without a doc-test comment" in found[0]
    assert "skip (REASON)" in found[1]
    assert "the block has 1 lines" in found[2]


def test_the_convention_reads_runs_skips_and_given_files() -> None:
    d = parse_directive(" run; given tasks.jsonl; skip 1-2 (your server); skip 4 (a paid API) ")
    assert d.run and d.given == ("tasks.jsonl",) and d.skip == {1: "your server", 2: "your server", 4: "a paid API"}
    d = parse_directive(" skip (needs a Slurm cluster) ")
    assert not d.run and d.reason == "needs a Slurm cluster"
    for bad in ("", "runs", "skip", "run; skip (why)", "run; given nothing.txt", "skip (why); skip 1 (why)",
                "run; skip x (why)", "run; maybe"):
        with pytest.raises(DirectiveError):
            parse_directive(bad)


def test_a_run_block_keeps_its_line_numbers_with_lines_skipped(tmp_path: Path) -> None:
    doc = tmp_path / "g.md"
    doc.write_text("<!-- doc-test: run; skip 1 (your server) -->\n```sh\nexport X=1\necho a\n```\n"
                   "<!-- doc-test: run -->\n```console\n$ evalsup status t.run\nsome output\n```\n")
    sh, console = blocks(doc)
    assert sh.script() == ":\necho a\n"
    assert console.script() == "evalsup status t.run\n:\n"


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", text)


def test_the_map_links_every_guide_and_each_link_is_there() -> None:
    linked = _links(MAP.read_text())
    missing = [name for name in linked if not (DOCS_DIR / name).exists() and name not in COMING]
    assert not missing, f"docs/README.md links {missing}, which are not in docs/"
    unlinked = sorted(p.name for p in DOCS_DIR.glob("*.md") if p != MAP and p.name not in linked)
    assert not unlinked, f"docs/README.md (the map) does not link {unlinked}: give each a line there"
    for name in ("evaluations.md", "paid-apis.md", "clusters.md", "operations.md", "serve.md", "cli.md"):
        assert name in linked, name


def _headings(doc: Path) -> set[str]:
    """The titles of ``doc``'s headings (## and deeper), outside its fenced blocks."""
    out, fenced = set(), False
    for line in doc.read_text().splitlines():
        if re.match(r"^ {0,3}(```|~~~)", line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{2,6} (.+?)\s*$", line)):
            out.add(m[1])
    return out


def _listed(doc: Path, heading: str) -> list[str]:
    """The titles listed under ``heading`` in ``doc``: one ``- TITLE`` a line, a note after " — " aside."""
    text = doc.read_text()
    if heading not in text:
        return []
    part = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [ln[2:].split(" — ", 1)[0].strip() for ln in part.splitlines() if ln.startswith("- ")]


def test_each_readme_section_to_move_exists_and_is_claimed_once() -> None:
    readme = _headings(ROOT / "README.md") | {"evalsup"}
    guides = [DOCS_DIR / name for name in _links(MAP.read_text()) if (DOCS_DIR / name).exists()]
    claims: dict[str, list[str]] = {}
    for g in guides:
        for title in _listed(g, MOVING):
            where = readme | _headings(g)  # in the README now, or in the guide once moved
            assert title in where, (f"{rel(g)}: '{title}' (under '{MOVING}') is no heading of README.md: "
                                    "give its current title")
            claims.setdefault(title, []).append(rel(g))
    for title in _listed(MAP, STAYS):
        assert title in readme, f"docs/README.md: '{title}' (under '{STAYS}') is no heading of README.md"
        claims.setdefault(title, []).append("README.md")
    twice = {t: w for t, w in claims.items() if len(w) > 1}
    assert not twice, f"README sections claimed more than once: {twice}"
    for name in ("evaluations.md", "paid-apis.md", "clusters.md", "operations.md"):
        assert _listed(DOCS_DIR / name, MOVING), f"docs/{name} lists no README section to move"
