"""Scores by group: the Wilson interval, the groups kept bounded (then "(other)"), the group of a task."""

from __future__ import annotations

import pytest

from evalsup.scoring.groups import OTHER, GroupedScores
from evalsup.scoring.scorers import ScoreStats, wilson
from evalsup.supervisor.metrics import TOP_GROUPS, Metrics
from evalsup.supervisor.summary import group_rows
from evalsup.tasks.group_key import MAX_GROUP_CHARS, MISSING, GroupByError, group_of, parse_group_by


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [
    (0, 10, 0.0, 0.2775),  # no success: the interval still has width (a normal interval would be [0, 0])
    (10, 10, 0.7225, 1.0),
    (5, 10, 0.2366, 0.7634),
    (60, 100, 0.5020, 0.6906),
    (1, 1, 0.2065, 1.0),
])  # published Wilson score intervals (z = 1.96), to 4 places
def test_wilson_interval_matches_the_textbook_values(k: int, n: int, lo: float, hi: float) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)
    assert got[0] <= k / n <= got[1]


def test_wilson_of_no_task_is_empty() -> None:
    assert wilson(0, 0) == (0.0, 0.0)


def test_each_group_has_the_figures_of_the_whole() -> None:
    g = GroupedScores("metadata.subject")
    for i in range(30):
        subject = ("law", "math", "art")[i % 3]
        right = subject == "law" or (subject == "math" and i % 2 == 0)
        g.add(subject, True, {"choice": float(right), "judge": None if i == 5 else 0.5}, ["regex"] if i < 3 else [])
    g.add("art", False)  # a failed task: counted in the group, scored by nobody
    s = g.summary()
    assert s["by"] == "metadata.subject" and list(s["groups"]) == ["art", "law", "math"]
    law, math, art = s["groups"]["law"], s["groups"]["math"], s["groups"]["art"]
    assert law["tasks"] == 10 and law["failed"] == 0 and art["tasks"] == 11 and art["failed"] == 1
    assert law["scores"]["choice"]["accuracy"] == 1.0
    assert law["scores"]["choice"]["ci95"][0] == pytest.approx(0.7225, abs=1e-4)
    assert math["scores"]["choice"]["accuracy"] == 0.5 and math["scores"]["choice"]["count"] == 10
    assert "accuracy" not in law["scores"]["judge"] and law["scores"]["judge"]["mean"] == 0.5  # not 0/1: a mean
    assert art["scores"]["judge"]["errors"] == 1 and art["scores"]["judge"]["count"] == 9  # task 5 is art's
    assert law["scores"]["regex"]["unscored"] == 1 and law["scores"]["regex"]["count"] == 0


def test_groups_are_bounded_then_other_with_one_warning() -> None:
    g = GroupedScores("metadata.id", max_groups=3)
    firsts = [g.add(f"g{i}", True, {"s": 1.0}) for i in range(10)]
    assert firsts == [False, False, False, True] + [False] * 6  # warned once, at the first task turned away
    assert len(g.groups) == 4 and g.groups[OTHER].tasks == 7  # 3 kept + other: memory does not grow
    assert g.add("g0", True) is False and g.groups["g0"].tasks == 2  # a group kept still counts
    s = g.summary()
    assert list(s["groups"])[-1] == OTHER and s["overflowed"] == {"max_groups": 3, "tasks": 7}
    assert "more than 3 groups" in g.overflow_note()


def test_top_folds_the_rest_into_other_without_changing_the_groups() -> None:
    g = GroupedScores("metadata.k")
    for i, n in enumerate((5, 4, 3, 2, 1)):
        for _ in range(n):
            g.add(f"g{i}", True, {"s": float(i % 2)})
    top = g.top(2)
    assert list(top) == ["g0", "g1", OTHER]
    assert top[OTHER].tasks == 6 and top[OTHER].scores.n["s"] == 6 and top[OTHER].scores.total["s"] == 2.0
    assert g.groups["g2"].tasks == 3 and OTHER not in g.groups  # a view: the groups are as they were
    assert list(g.top(10)) == ["g0", "g1", "g2", "g3", "g4"]


def test_prometheus_labels_are_bounded() -> None:
    g = GroupedScores("metadata.k")
    for i in range(TOP_GROUPS + 30):
        g.add(f"g{i}", True, {"choice": 1.0})
    overall = ScoreStats()
    overall.add({"choice": 1.0})
    m = Metrics()
    m.scores(overall, g)
    labels = {s.labels["group"] for metric in m.score_count.collect() for s in metric.samples}
    assert len(labels) == TOP_GROUPS + 2 and {"(all)", OTHER} <= labels


def test_group_of_a_task() -> None:
    path = parse_group_by("metadata.subject")
    assert group_of({"subject": "law"}, path) == "law"
    assert group_of({"subject": 3}, path) == "3" and group_of({"subject": ["a"]}, path) == '["a"]'
    assert group_of({}, path) == MISSING and group_of(None, path) == MISSING
    assert group_of({"a": {"b": "x"}}, parse_group_by("metadata.a.b")) == "x"
    assert len(group_of({"subject": "x" * 1000}, path)) == MAX_GROUP_CHARS


@pytest.mark.parametrize("bad", ["subject", "metadata.", "metadata..x", "meta.subject", ""])
def test_a_group_by_that_names_no_metadata_key_is_refused(bad: str) -> None:
    with pytest.raises(GroupByError, match=r"give metadata\.KEY"):
        parse_group_by(bad)


def test_the_summary_table_shows_the_largest_groups() -> None:
    g = GroupedScores("metadata.k")
    for i in range(60):
        for _ in range(i + 1):
            g.add(f"g{i:02d}", True, {"s": 1.0})
    rows, hidden = group_rows(g.summary(), show=50)
    assert hidden == 10 and len(rows) == 50 and rows[0][0] == "g10"  # the 50 largest, in name order
    assert rows[0][1:5] == ["s", "11", "11", "1.000"]
