"""The docs keep true (issue 44 item 6), in-process: every shell block carries a well-formed doc-test comment
(tests/doc_blocks.py: run, or skip with a reason), the map docs/README.md links every guide and every link of it
is there, every link of the docs leads to a file and a heading that are there (sections moved out of README.md
took their links with them), and the README stays the first hour with a map of every guide. The blocks themselves
run in tests/integration/test_docs_commands.py."""

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


def _slug(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _headings(doc: Path) -> set[str]:
    """The titles of ``doc``'s headings, outside its fenced blocks."""
    out, fenced = set(), False
    for line in doc.read_text().splitlines():
        if re.match(r"^ {0,3}(```|~~~)", line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+?)\s*$", line)):
            out.add(m[1])
    return out


def _relative_links(doc: Path) -> list[tuple[int, str]]:
    """``doc``'s links that lead into the repository (not http:, not mailto:), outside fenced blocks and code."""
    out, fenced = [], False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if re.match(r"^ {0,3}(```|~~~)", line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z]+:", target):
                out.append((n, target))
    return out


def test_every_link_of_the_docs_leads_to_a_file_and_heading_that_are_there() -> None:
    """A section moved from README.md to a guide takes its links with it: each must still lead somewhere."""
    broken = []
    for doc in docs():
        for n, target in _relative_links(doc):
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path) if path else doc
            if not dest.exists():
                broken.append(f"{rel(doc)}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in {_slug(h) for h in _headings(dest)}:
                broken.append(f"{rel(doc)}:{n}: {target}: no heading of {rel(dest)} has that anchor")
    assert not broken, "\n".join(broken)


def test_the_readme_is_the_first_hour_and_maps_every_guide() -> None:
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) <= 160, (f"README.md is {len(lines)} lines: it is the first hour (~150); a feature's detail "
                               "goes to its guide in docs/ (docs/README.md)")
    linked = {t.split("#", 1)[0] for _, t in _relative_links(readme)}
    guides = {f"docs/{name}" for name in _links(MAP.read_text())}
    assert guides <= linked, f"README.md's map of the docs lacks {sorted(guides - linked)}"
    for title in ("Install", "The options that matter"):
        assert any(h.startswith(title) for h in _headings(readme)), title
