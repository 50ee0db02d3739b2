"""Which scorers score a task (issue 43): its own ``scorer`` field, else the run's ``--scorer`` list.

A task line may name its scorers, with options for each, so one file can mix multiple choice, math and judged
questions without a scorer erring on a task it does not apply to::

    {"id": "q1", "messages": [...], "expected": "B", "scorer": "choice"}
    {"id": "q2", "messages": [...], "expected": "42", "scorer": ["math", "judge"]}
    {"id": "q3", "messages": [...], "expected": "paris", "scorer": [{"name": "exact_match", "ignore_case": true}]}

A task that names none is scored by the run's ``--scorer`` list (the default); a task that names some is scored
by those only. A task may name a built-in scorer, ``judge`` (the run must be set up to judge: ``--scorer judge``)
or one of the run's own ``--scorer`` specs; never code of its own (a task file is data: a line that could load a
module would run whatever it names). Checked for every line in the pre-scan (``check``), so a bad name is
``file:LINE`` and exit 2 before any request. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from evalsup.scoring.judge import JUDGE
from evalsup.scoring.scorers import BUILTINS, ScoreFn, ScorerOptions, load_scorer

FIELD = "scorer"  # the task line's (metadata's) key
_OPTION_KEYS = frozenset(f.name for f in fields(ScorerOptions))


@dataclass(frozen=True, slots=True)
class Pick:
    """One scorer a task names: its name (a built-in, ``judge`` or one of the run's specs) and the options it
    sets over the run's (``None``: the run's own)."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    def over(self, base: ScorerOptions) -> ScorerOptions:
        return replace(base, **dict(self.options)) if self.options else base


def picks(task: dict[str, Any]) -> list[Pick] | None:
    """The scorers a task names (None: it names none, the run's list applies). A ValueError says what is wrong
    with the field's shape."""
    value = task.get(FIELD)
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out: list[Pick] = []
    for item in items:
        if isinstance(item, str):
            out.append(Pick(item))
        elif isinstance(item, dict):
            name = item.get("name")
            if not isinstance(name, str):
                raise ValueError(f'"{FIELD}": an entry {item!r} has no "name"')
            bad = sorted(set(item) - _OPTION_KEYS - {"name"})
            if bad:
                raise ValueError(f'"{FIELD}": {name}\'s option {bad[0]!r} is not one of '
                                 f"{', '.join(sorted(_OPTION_KEYS))}")
            opts = tuple(sorted((k, v) for k, v in item.items() if k != "name"))
            for k, v in opts:
                want = str if k == "pattern" else bool
                if not isinstance(v, want):
                    raise ValueError(f'"{FIELD}": {name}\'s option {k!r} must be a {want.__name__}')
            out.append(Pick(name, opts))
        else:
            raise ValueError(f'"{FIELD}" must be a scorer\'s name, a list of them, or objects with a "name"')
    return out


def check(task: dict[str, Any], run_specs: Iterable[str]) -> None:
    """The pre-scan's check of a task's ``scorer`` field: each name a built-in, or one of the run's ``--scorer``
    specs (``judge`` only when the run judges). A ValueError names what to change."""
    named = picks(task)
    if named is None:
        return
    specs = set(run_specs)
    for p in named:
        if p.name == JUDGE and JUDGE not in specs:
            raise ValueError(f'"{FIELD}" names judge, but the run does not judge: add --scorer judge (and its '
                             "--judge-model) to the run")
        if p.name not in BUILTINS and p.name not in specs and p.name != JUDGE:
            raise ValueError(f'"{FIELD}": {p.name!r} is not a built-in scorer ({", ".join(BUILTINS)}) nor one of '
                             "the run's --scorer (a task names code only through the run's --scorer)")
        if p.options and p.name not in BUILTINS:
            raise ValueError(f'"{FIELD}": options are for the built-in scorers; {p.name!r} takes none')


def names_for(task: dict[str, Any], run_specs: list[str]) -> list[Pick]:
    """The scorers that score this task: the ones it names, else the run's (in their order)."""
    named = picks(task)
    return [Pick(s) for s in run_specs] if named is None else named


def judged(task: dict[str, Any], run_specs: list[str]) -> bool:
    """Whether the judge grades this task: it names judge, or names nothing and the run judges."""
    return any(p.name == JUDGE for p in names_for(task, run_specs))


class Loaded:
    """The run's scorers loaded once (a bad one fails here, at start), and each combination of a built-in and
    options a task names, loaded on its first use and kept (a handful per run)."""

    def __init__(self, specs: list[str], options: ScorerOptions) -> None:
        self.specs = list(specs)
        self.options = options
        self._fns: dict[Pick, tuple[str, ScoreFn]] = {}
        for s in self.specs:
            if s != JUDGE:
                self._load(Pick(s))

    def _load(self, p: Pick) -> tuple[str, ScoreFn]:
        fn = self._fns.get(p)
        if fn is None:
            fn = self._fns[p] = load_scorer(p.name, p.over(self.options))
        return fn

    def for_task(self, task: dict[str, Any]) -> list[tuple[str, ScoreFn]]:
        """The (name, fn) pairs that score this task, the judge aside (asked apart, after them). A task whose
        field the pre-scan would refuse (a run resumed on an edited file) is scored by none: its scores stay
        out rather than wrong."""
        try:
            named = names_for(task, self.specs)
            check(task, self.specs)
        except ValueError:
            return []
        return [self._load(p) for p in named if p.name != JUDGE]
