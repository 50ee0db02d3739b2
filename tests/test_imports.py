"""The boundaries between the two sides of the pipe, read from the source (AST), not from a run."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "evalsup"
# what both sides may import: the pipe's contract, and pure libraries with no process of their own
SHARED = {"evalsup.ipc", "evalsup.tasks", "evalsup.idset", "evalsup.scorers", "evalsup.plugin", "evalsup.process",
          "evalsup.headers"}


def imports_of(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return {m for m in out if m == "evalsup" or m.startswith("evalsup.")}


def modules(under: str) -> dict[str, set[str]]:
    return {str(p.relative_to(PKG.parent)): imports_of(p) for p in sorted((PKG / under).rglob("*.py"))}


def shared(mod: str) -> bool:
    # the package itself (its __init__ holds the version and lazy exports only) and the shared few
    return mod == "evalsup" or any(mod == s or mod.startswith(s + ".") for s in SHARED)


def test_worker_code_imports_only_itself_and_the_shared_few() -> None:
    bad = {f: sorted(m for m in ms if not (m.startswith("evalsup.worker") or shared(m)))
           for f, ms in modules("worker").items()}
    assert not {f: ms for f, ms in bad.items() if ms}


def test_supervisor_code_never_imports_worker_code() -> None:
    bad = {f: sorted(m for m in ms if m.startswith("evalsup.worker")) for f, ms in modules("supervisor").items()}
    assert not {f: ms for f, ms in bad.items() if ms}


def test_shared_modules_import_only_shared_modules() -> None:
    files = [PKG.parent / (s.replace(".", "/") + ".py") for s in SHARED]
    files = [f for f in files if f.exists()] + sorted((PKG / "ipc").rglob("*.py"))
    bad = {str(f): sorted(m for m in imports_of(f) if not shared(m)) for f in files}
    assert not {f: ms for f, ms in bad.items() if ms}


def test_only_the_run_entry_imports_the_arbiter() -> None:
    users = [str(p.relative_to(PKG.parent)) for p in sorted(PKG.rglob("*.py"))
             if "evalsup.supervisor.arbiter" in imports_of(p)]
    assert users == ["evalsup/supervisor/run.py"]


def test_the_rule_sees_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("from evalsup.supervisor.ledger import TaskLedger\nimport evalsup.worker.main\n")
    assert imports_of(f) == {"evalsup.supervisor.ledger", "evalsup.worker.main"}
