"""The house's rules, read from the source (AST), not from a run: which package may import which
(docs/architecture.md, "Packages and the imports between them"), no import cycle between modules (imports inside
functions and under TYPE_CHECKING count), and only the run's entry imports the arbiter."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.harness import ROOT

PKG = ROOT / "evalsup"

# package -> the packages it may import (besides itself). The table of docs/architecture.md; keep both the same.
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "ipc": set(),
    "mock": set(),
    "tasks": set(),
    "scoring": set(),
    "cache": {"tasks"},
    "config": {"ipc", "tasks", "scoring"},
    "rundir": {"config", "tasks"},
    "worker": {"common", "ipc", "tasks", "scoring", "cache"},
    "supervisor": {"common", "ipc", "tasks", "scoring", "config", "rundir", "cache"},
    "batch": {"common", "ipc", "tasks", "scoring", "config", "rundir", "worker"},
    "tools": {"common", "tasks", "scoring", "config", "rundir", "worker", "batch", "cache"},
    "serve": {"common", "tasks", "config", "rundir", "tools"},
    "cli": {"common", "tasks", "config", "rundir", "supervisor", "tools", "mock", "ray", "cache", "batch", "serve"},
    "api": {"common", "tasks", "config", "rundir", "cli"},
    "ray": {"common", "tasks", "config", "rundir", "tools", "api"},
}
# the top of evalsup/ holds only these files; everything else lives in a package
TOP_FILES = {"__init__.py", "__main__.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path = PKG) -> dict[str, Path]:
    return {module_name(p): p for p in sorted(root.rglob("*.py"))}


def imports_of(path: Path, known: set[str] | None = None) -> set[str]:
    """Every evalsup module `path` imports, wherever the import stands (top, function, TYPE_CHECKING).
    ``from pkg import name`` counts as an import of ``pkg.name`` when that is a module of ``known``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: a relative import (write the module's whole name)"
            if node.module is None:
                continue
            subs = {f"{node.module}.{a.name}" for a in node.names} & (known or set())
            out.update(subs or {node.module})
    return {m for m in out if m == "evalsup" or m.startswith("evalsup.")}


def package_of(mod: str) -> str | None:
    """``evalsup.rundir.journal`` -> ``rundir``; the root package and its top files (__main__) -> None."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 and (PKG / parts[1]).is_dir() else None


def graph() -> dict[str, set[str]]:
    mods = all_modules()
    known = set(mods)

    def resolve(m: str) -> str:
        while m not in known and "." in m:
            m = m.rpartition(".")[0]
        return m

    # `import evalsup` or `from evalsup import __version__` runs evalsup/__init__.py, which every import of an
    # evalsup module has already run: it is no edge (its exports are loaded lazily, on first use)
    return {m: {resolve(i) for i in imports_of(p, known)} - {m, "evalsup"} for m, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_top_level_holds_only_packages() -> None:
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in TOP_FILES)
    assert not loose, f"modules outside a package: {loose}"
    assert {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(ALLOWED)


def test_each_package_imports_only_what_the_table_allows() -> None:
    bad = {}
    for mod, deps in graph().items():
        src = package_of(mod)
        if src is None:  # evalsup/__init__.py (lazy exports of the API) and __main__.py (the CLI)
            continue
        wrong = sorted(d for d in deps if package_of(d) not in ALLOWED[src] | {src})
        if wrong:
            bad[mod] = wrong
    assert not bad


def test_no_import_cycle_lazy_imports_included() -> None:
    assert cycles(graph()) == []


def test_only_the_run_entry_imports_the_arbiter() -> None:
    users = sorted(m for m, deps in graph().items() if "evalsup.supervisor.arbiter" in deps)
    assert users == ["evalsup.supervisor.run"]


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("from evalsup.supervisor.ledger import TaskLedger\nimport evalsup.worker.main\n"
                 "def g():\n    from evalsup.rundir import journal\n")
    assert imports_of(f, {"evalsup.rundir.journal"}) == {"evalsup.supervisor.ledger", "evalsup.worker.main",
                                                         "evalsup.rundir.journal"}
    # a lazy import closing a loop is a cycle; a chain is not
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []
    assert "supervisor" not in ALLOWED["worker"] and "worker" not in ALLOWED["supervisor"]
