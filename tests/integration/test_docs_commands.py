"""Every command the docs mark to run, run (issue 44 item 6): the shell blocks of README.md and docs/*.md with
``<!-- doc-test: run ... -->`` before them (the convention: tests/doc_blocks.py), in a temporary directory, against
the project's mock on 127.0.0.1, with ``evalsup`` and ``.venv/bin/evalsup`` the venv's own. A block that fails
is named by FILE:LINE of its fence and the line of the block that failed, with what it printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.doc_blocks import GIVEN, MODELS, Block, blocks, docs
from tests.harness import LIVENESS_S, ROOT, env_for

VENV_BIN = Path(sys.executable).parent
# the first line of every script: the block's line that failed, said on stderr (the line number less this one)
TRAP = "trap 'echo \"doc-test: line $((LINENO - 1)) failed (exit $?)\" >&2' ERR\n"


def _runnable(doc: Path) -> list[Block]:
    return [b for b in blocks(doc) if b.directive is not None and b.directive.run]


DOCS = [d for d in docs() if _runnable(d)]


def test_the_readme_quick_start_and_the_guides_have_commands_to_run() -> None:
    assert ROOT / "README.md" in DOCS, "the README's first run is no longer marked <!-- doc-test: run -->"
    assert len(DOCS) >= 2


@pytest.mark.parametrize("doc", DOCS, ids=[d.relative_to(ROOT).as_posix() for d in DOCS])
def test_the_commands_of_a_doc_run(doc: Path, tmp_path: Path) -> None:
    with MockThread(MockConfig(latency_ms=2, jitter_ms=1, models=MODELS)) as mock:
        _run_blocks(doc, tmp_path, mock)


def _run_blocks(doc: Path, tmp_path: Path, mock: MockThread) -> None:
    evalsup = VENV_BIN / "evalsup"
    assert evalsup.exists(), f"{evalsup}: the venv's evalsup is missing (pip install -e .)"
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "evalsup").symlink_to(evalsup)
    (tmp_path / "home").mkdir()
    env = env_for({"OPENAI_BASE_URL": mock.url, "OPENAI_API_KEY": "sk-doc-test", "HOME": str(tmp_path / "home"),
                   "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    for b in _runnable(doc):
        assert b.directive is not None
        for name in b.directive.given:
            (tmp_path / name).write_text(GIVEN[name])
        script = tmp_path / "block.sh"
        script.write_text(TRAP + b.script())
        r = subprocess.run(["bash", "-e", "-o", "pipefail", str(script)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=LIVENESS_S)
        if r.returncode != 0:
            said = [ln for ln in r.stderr.splitlines() if ln.startswith("doc-test: line ")]
            n = int(said[-1].split()[2]) if said else 0
            line = b.lines[n - 1] if 0 < n <= len(b.lines) else "?"
            pytest.fail(f"{b.where}: line {n} of the block failed: {line}\n--- stdout\n{r.stdout[-2000:]}\n"
                        f"--- stderr\n{r.stderr[-3000:]}", pytrace=False)
