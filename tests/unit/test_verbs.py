"""Rooms decide, only the arbiter acts, and within it only its verbs (docs/architecture.md, "The rooms"): read
from the source (AST). Every call that sends a worker a frame, kills or signals a process, spawns one, holds a
worker's pipe or writes the journal sits inside one of the arbiter's named verbs; no other supervisor module
makes such a call (``workers.py`` is the handle those calls reach: it encodes the frames and sends the signal);
the arbiter never takes from the ledger's queues itself."""

from __future__ import annotations

import ast
from pathlib import Path

SUP = Path(__file__).resolve().parents[2] / "evalsup" / "supervisor"
ARBITER = SUP / "arbiter.py"
ARBITER_CLASS = "Supervisor"
# the handle: the one place a frame is encoded and written, a process started and a signal sent
HANDLE = {"workers.py"}

VERBS = {
    "spawn", "replace", "add_worker", "recycle", "kill", "hand", "send", "broadcast", "release_rings",
    "hold_results", "release_results", "append", "append_invalid", "poison", "flush", "checkpoint", "stop",
    "shutdown_workers", "close",
}

FRAMES = {"send", "send_task", "drain", "close_input", "release_ring"}  # on a worker: a frame, or its input closed
KILLS = {"kill", "killpg", "terminate", "send_signal"}  # os.kill, w.kill, proc.terminate ...
SPAWNS = {"spawn", "create_subprocess_exec", "create_subprocess_shell", "Popen", "fork", "spawnv", "posix_spawn"}
PIPES = {"hold", "release"}  # on a worker's stream: results read or held
JOURNAL = {"append", "append_invalid", "append_ids", "checkpoint", "flush", "close"}  # on the journal


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def act_of(call: ast.Call, *, self_is_verbs: bool) -> str | None:
    """What ``call`` does, if it is an act: "frame", "kill", "spawn", "pipe" or "journal"; else None.
    ``self.X(...)`` in the arbiter calls its own method (a verb or a helper checked on its own): no act."""
    f = call.func
    if isinstance(f, ast.Name):
        return "kill" if f.id in KILLS else "spawn" if f.id in SPAWNS else None
    if not isinstance(f, ast.Attribute):
        return None
    receiver = _dotted(f.value)
    if self_is_verbs and receiver == "self":
        return None
    last = receiver.rpartition(".")[2]
    if f.attr in JOURNAL and last == "journal":
        return "journal"
    if f.attr in PIPES and last == "stream":
        return "pipe"
    if f.attr in FRAMES:
        return "frame"
    if f.attr in KILLS:
        return "kill"
    if f.attr in SPAWNS:
        return "spawn"
    return None


def _is_self_attr(node: ast.AST, *names: str) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr in names)


def arbiter_violations(source: str, verbs: set[str] = VERBS, cls: str = ARBITER_CLASS) -> list[str]:
    """Every act outside a verb of ``cls``; the journal bound to a name (its writes would hide behind it);
    the ledger's queues touched (the ledger's own methods take from them); a verb that is not a method."""
    tree = ast.parse(source)
    out: list[str] = []
    owner: dict[int, str] = {}  # id(node) -> the method of cls it is in
    methods: set[str] = set()
    for top in tree.body:
        if isinstance(top, ast.ClassDef) and top.name == cls:
            for item in top.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    methods.add(item.name)
                    for sub in ast.walk(item):
                        owner[id(sub)] = item.name
    out += [f"verb {v!r} is not a method of {cls}" for v in sorted(verbs - methods)]
    for node in ast.walk(tree):
        where = owner.get(id(node), "<outside the class>")
        if isinstance(node, ast.Call):
            act = act_of(node, self_is_verbs=True)
            if act is not None and where not in verbs:
                out.append(f"line {node.lineno}: {act} ({_dotted(node.func)}) in {where}, not a verb")
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("popleft", "pop", "appendleft") \
                    and "ledger" in _dotted(node.func.value):
                out.append(f"line {node.lineno}: the ledger's queue taken from in {where}")
        elif isinstance(node, ast.Attribute) and node.attr in ("redo", "suspects"):
            out.append(f"line {node.lineno}: the ledger's {node.attr} queue read in {where} (use its methods)")
        elif isinstance(node, (ast.Assign, ast.NamedExpr, ast.AnnAssign)):
            value = node.value
            values = value.elts if isinstance(value, ast.Tuple) else [value]
            if any(_is_self_attr(v, "journal") for v in values if v is not None):
                out.append(f"line {node.lineno}: the journal bound to a name in {where}")
    return out


def room_violations(source: str) -> list[str]:
    """Every act in a module that is not the arbiter (a room decides; it never acts)."""
    return [f"line {n.lineno}: {act} ({_dotted(n.func)})" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and (act := act_of(n, self_is_verbs=False)) is not None]


def test_only_the_verbs_act() -> None:
    assert arbiter_violations(ARBITER.read_text()) == []


def test_each_verb_acts_or_calls_a_verb() -> None:
    """The named set holds no method that has nothing to do with acting."""
    tree = ast.parse(ARBITER.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ARBITER_CLASS)
    idle = []
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in VERBS:
            calls = [c for c in ast.walk(item) if isinstance(c, ast.Call)]
            if not any(act_of(c, self_is_verbs=False) is not None
                       or (_is_self_attr(c.func, *(VERBS - {item.name}))) for c in calls):
                idle.append(item.name)
    assert idle == []


def test_no_room_acts() -> None:
    bad = {}
    for path in sorted(SUP.glob("*.py")):
        if path == ARBITER or path.name in HANDLE:
            continue
        found = room_violations(path.read_text())
        if found:
            bad[path.name] = found
    assert bad == {}


def test_the_rules_see_a_violation() -> None:
    src = '''
import os
from subprocess import Popen

class Supervisor:
    def send(self, w):
        w.send(1)

    def kill(self, w):
        os.kill(w.pid, 9)

    def on_frame(self, w):
        self.send(w)                      # a verb: fine
        self.kill(w)                      # a verb: fine
        w.send(2)                         # a frame outside a verb
        w.send_task(None, b"")
        os.kill(1, 9)
        Popen(["x"])
        self.journal.append(b"x")
        self.journal.flush()
        w.stream.hold("backlog")
        j = self.journal
        self.ledger.redo.popleft()
        cb = lambda: w.drain()             # inside a lambda of a method: still that method's
        return j, cb

    def run(self):
        pass

def outside(w):
    w.kill(0)
'''
    found = arbiter_violations(src, {"send", "kill", "missing"})
    assert found[0] == "verb 'missing' is not a method of Supervisor"
    text = "\n".join(found)
    for what in ("frame (w.send) in on_frame", "frame (w.send_task) in on_frame", "kill (os.kill) in on_frame",
                 "spawn (Popen) in on_frame", "journal (self.journal.append) in on_frame",
                 "journal (self.journal.flush) in on_frame", "pipe (w.stream.hold) in on_frame",
                 "the journal bound to a name in on_frame", "the ledger's redo queue read in on_frame",
                 "the ledger's queue taken from in on_frame", "frame (w.drain) in on_frame",
                 "kill (w.kill) in <outside the class>"):
        assert what in text, what
    assert "in send" not in text and "in kill," not in text  # the verbs' own acts are theirs
    assert arbiter_violations("class Supervisor:\n    def send(self, w):\n        w.send(1)\n", {"send"}) == []
    # a room: any act at all, self's included
    assert len(room_violations("import os\nclass R:\n    def f(self, w):\n        os.kill(1, 9)\n"
                               "        self.send(1)\n        x.journal.checkpoint(c)\n        w.stream.release('b')\n"
                               "        items.append(1)\n        lock.release()\n")) == 4
