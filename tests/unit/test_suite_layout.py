"""The test suite's own layout: every test module sits in a tier, and none imports another test module or a
conftest (what tests share lives in tests/harness.py, tests/mock_http.py, tests/responses_stream.py, and the
fixtures in the conftests)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
TIERS = ("unit", "integration", "slow")


def test_every_test_module_is_in_a_tier() -> None:
    stray = sorted(str(p.relative_to(TESTS.parent)) for p in TESTS.rglob("test_*.py")
                   if p.relative_to(TESTS).parts[0] not in TIERS)
    assert not stray, (f"test modules outside the tiers: {stray}; git mv each to tests/unit/ (no process, no "
                       "socket), tests/integration/ (the mock and one evalsup process) or tests/slow/")


def test_no_test_module_imports_another_or_a_conftest() -> None:
    bad = []
    for p in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if last == "conftest" or last.startswith("test_"):
                    bad.append(f"{p.relative_to(TESTS.parent)}:{node.lineno} imports {name}")
    assert not bad, ("shared test code belongs in a helper module (tests/harness.py, ...) or a fixture in a "
                     f"conftest: {bad}")
