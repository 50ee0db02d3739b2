"""scoring.selection: which scorers score a task (its own ``scorer`` field, else the run's) and what a task
may name. No process, no socket."""

from __future__ import annotations

import pytest

from evalsup.scoring.scorers import ScorerOptions
from evalsup.scoring.selection import Loaded, Pick, check, judged, names_for, picks


def _body(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def test_a_task_names_its_scorers_else_the_run_s_apply() -> None:
    assert picks({"expected": "B"}) is None
    assert picks({"scorer": "choice"}) == [Pick("choice")]
    assert picks({"scorer": ["math", {"name": "exact_match", "ignore_case": True}]}) == [
        Pick("math"), Pick("exact_match", (("ignore_case", True),))]
    assert names_for({}, ["contains", "judge"]) == [Pick("contains"), Pick("judge")]
    assert names_for({"scorer": "math"}, ["contains", "judge"]) == [Pick("math")]
    assert judged({}, ["judge"]) and not judged({"scorer": "math"}, ["judge"])
    assert judged({"scorer": ["math", "judge"]}, ["judge"])


@pytest.mark.parametrize(("task", "specs", "says"), [
    ({"scorer": "nope"}, [], "'nope' is not a built-in scorer"),
    ({"scorer": "evil.py:run"}, [], "names code only through the run's --scorer"),
    ({"scorer": "judge"}, ["choice"], "add --scorer judge"),
    ({"scorer": [{"name": "regex", "patern": "x"}]}, [], "option 'patern'"),
    ({"scorer": [{"name": "exact_match", "ignore_case": "yes"}]}, [], "must be a bool"),
    ({"scorer": [{"ignore_case": True}]}, [], 'no "name"'),
    ({"scorer": 3}, [], "must be a scorer's name"),
])
def test_what_a_task_may_not_name(task: dict[str, object], specs: list[str], says: str) -> None:
    with pytest.raises(ValueError) as e:
        check(task, specs)
    assert says in str(e.value)


def test_a_task_may_name_the_run_s_own_code_and_judge() -> None:
    user = "tests/plugins/score_user.py:length_and_hit"
    check({"scorer": [user, "judge"]}, [user, "judge"])


def test_loaded_scores_each_task_with_its_own_and_options_over_the_run_s() -> None:
    loaded = Loaded(["contains", "judge"], ScorerOptions())
    assert [n for n, _ in loaded.for_task({"expected": "x"})] == ["contains"]  # the judge is asked apart
    [(name, fn)] = loaded.for_task({"expected": "PARIS", "scorer": [{"name": "exact_match", "ignore_case": True}]})
    assert name == "exact_match" and fn({"expected": "PARIS"}, _body("paris")) == 1.0
    [(_, strict)] = loaded.for_task({"expected": "PARIS", "scorer": "exact_match"})
    assert strict({"expected": "PARIS"}, _body("paris")) == 0.0
    assert loaded.for_task({"scorer": "nope"}) == []  # refused by the pre-scan; never a wrong score
