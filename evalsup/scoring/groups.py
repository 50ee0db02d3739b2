"""Scores by group (``--group-by metadata.KEY``): the same figures as the whole run's, per group, in memory
that does not grow with the number of tasks.

A group is the string value of one metadata key of a task (``metadata.subject`` of an MMLU question;
``tasks.group_key`` reads it, in the worker or from a record). Each group holds a ``ScoreStats`` (counts and
sums, never a list of tasks) and its task and failure counts. At most ``MAX_GROUPS`` groups are kept: the
tasks of any further group are counted together in ``(other)``, and ``overflowed`` says so (the run warns
once). ``top`` folds all but the largest groups into ``(other)`` for displays that must stay small
(Prometheus labels).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from evalsup.scoring.scorers import ScoreStats

MAX_GROUPS = 10_000  # groups kept in memory; the tasks of the rest go to OTHER
OTHER = "(other)"


def merge_into(dest: ScoreStats, src: ScoreStats) -> None:
    """Add ``src``'s counts to ``dest``'s."""
    for k, n in src.n.items():
        dest.n[k] = dest.n.get(k, 0) + n
        dest.total[k] = dest.total.get(k, 0.0) + src.total.get(k, 0.0)
        dest.binary[k] = dest.binary.get(k, True) and src.binary.get(k, True)
    for k, n in src.errors.items():
        dest.errors[k] = dest.errors.get(k, 0) + n
    for k, n in src.unscored.items():
        dest.unscored[k] = dest.unscored.get(k, 0) + n


class Group:
    """One group's figures: tasks, failed tasks, and its scores."""

    __slots__ = ("failed", "scores", "tasks")

    def __init__(self) -> None:
        self.tasks = 0
        self.failed = 0
        self.scores = ScoreStats()

    def merge(self, other: Group) -> None:
        self.tasks += other.tasks
        self.failed += other.failed
        merge_into(self.scores, other.scores)

    def subtract(self, other: Group) -> None:
        """Take ``other``'s counts out (``other`` was merged into this one); whether every score was 0/1 stays."""
        self.tasks -= other.tasks
        self.failed -= other.failed
        a, b = self.scores, other.scores
        for k, n in b.n.items():
            a.n[k] = a.n.get(k, 0) - n
            a.total[k] = a.total.get(k, 0.0) - b.total.get(k, 0.0)
        for k, n in b.errors.items():
            a.errors[k] = a.errors.get(k, 0) - n
        for k, n in b.unscored.items():
            a.unscored[k] = a.unscored.get(k, 0) - n

    def summary(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "failed": self.failed, "scores": self.scores.summary()}


class GroupedScores:
    """Per group of ``by`` (``metadata.KEY``): a ``Group``; at most ``max_groups`` of them, then OTHER."""

    def __init__(self, by: str, max_groups: int = MAX_GROUPS) -> None:
        self.by = by
        self.max_groups = max_groups
        self.groups: dict[str, Group] = {}
        self.overflowed = 0  # tasks counted in OTHER because the groups were full
        self.whole = Group()  # every group's counts summed (``top``'s rest is the whole less the largest)

    def add(self, group: str, ok: bool, scores: dict[str, float | None] | None = None,
            unscored: Iterable[str] = ()) -> bool:
        """Count one task of ``group``. True the first time a task goes to OTHER because the groups are full
        (the caller warns once)."""
        g = self.groups.get(group)
        first_overflow = False
        if g is None:
            if len(self.groups) >= self.max_groups and group != OTHER:
                first_overflow = self.overflowed == 0
                self.overflowed += 1
                group = OTHER
                g = self.groups.get(OTHER)
            if g is None:
                g = self.groups[group] = Group()
        for x in (g, self.whole):
            x.tasks += 1
            if not ok:
                x.failed += 1
            if scores or unscored:
                x.scores.add(scores or {}, unscored)
        return first_overflow

    def overflow_note(self) -> str:
        return (f"--group-by {self.by}: more than {self.max_groups:,} groups; the tasks of the others are counted "
                f"together as {OTHER!r}")

    def __bool__(self) -> bool:
        return bool(self.groups)

    def top(self, k: int) -> dict[str, Group]:
        """The ``k`` groups with the most tasks, and the rest summed as OTHER (when there is a rest): the whole
        less those ``k``, so the cost is O(groups) to pick them and O(k) to sum, whatever the rest holds."""
        if len(self.groups) <= k:
            return dict(self.groups)
        largest = heapq.nlargest(k + 1, self.groups.items(), key=lambda kv: kv[1].tasks)
        out = dict(kv for kv in largest if kv[0] != OTHER)
        if len(out) > k:
            out.popitem()
        rest = Group()  # a new one: the groups kept are never changed by a view of them
        rest.merge(self.whole)
        for g in out.values():
            rest.subtract(g)
        out[OTHER] = rest
        return out

    def summary(self) -> dict[str, Any]:
        """summary.json's ``groups``: by what, and each group (sorted by name, OTHER last) with its tasks,
        failures and per-scorer figures (as ``ScoreStats.summary``)."""
        names = sorted(g for g in self.groups if g != OTHER) + ([OTHER] if OTHER in self.groups else [])
        out: dict[str, Any] = {"by": self.by, "groups": {g: self.groups[g].summary() for g in names}}
        if self.overflowed:
            out["overflowed"] = {"max_groups": self.max_groups, "tasks": self.overflowed}
        return out
