"""Scorers: a score per task from the task (with its metadata) and the parsed response.

Built-ins: ``exact_match``, ``contains``, ``regex``, ``json_valid``, ``choice``. A user scorer is
``module:function`` or ``path/to/file.py:function``; it is called as ``fn(task, response)`` with the task's
fields (``id`` plus every extra key of its line, e.g. ``expected``) and the parsed response body, and returns a
number, a bool, or a dict of named numbers. A pure library: the workers and ``evalsup score`` both use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

ScoreFn = Callable[[dict[str, Any], Any], Any]


@dataclass(frozen=True)
class ScorerOptions:
    strip: bool = True
    ignore_case: bool = False
    pattern: str | None = None  # for regex, when the task has no "pattern"


def response_text(body: Any) -> str:
    """The answer's text: chat message content, completion text, or a Responses API output text."""
    if not isinstance(body, dict):
        return ""
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        c = choices[0]
        if isinstance(c, dict):
            msg = c.get("message")
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                return str(msg["content"])
            if isinstance(c.get("text"), str):
                return str(c["text"])
    if isinstance(body.get("output_text"), str):
        return str(body["output_text"])
    for item in body.get("output") or ():
        for part in (item.get("content") or ()) if isinstance(item, dict) else ():
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                return str(part["text"])
    return ""


def _norm(s: str, o: ScorerOptions) -> str:
    if o.strip:
        s = s.strip()
    return s.casefold() if o.ignore_case else s


def _expected(task: dict[str, Any]) -> str:
    if "expected" not in task:
        raise KeyError("the task has no 'expected' field")
    e = task["expected"]
    return e if isinstance(e, str) else orjson.dumps(e).decode()


def exact_match(task: dict[str, Any], body: Any, o: ScorerOptions) -> float:
    return float(_norm(response_text(body), o) == _norm(_expected(task), o))


def contains(task: dict[str, Any], body: Any, o: ScorerOptions) -> float:
    return float(_norm(_expected(task), o) in _norm(response_text(body), o))


def regex(task: dict[str, Any], body: Any, o: ScorerOptions) -> float:
    pattern = task.get("pattern") or o.pattern
    if not pattern:
        raise KeyError("regex needs a 'pattern' in the task or --regex")
    m = re.search(pattern, response_text(body), re.IGNORECASE if o.ignore_case else 0)
    if m is None:
        return 0.0
    if "expected" not in task:
        return 1.0
    got = m.group(1) if m.groups() else m.group(0)
    return float(_norm(got or "", o) == _norm(_expected(task), o))


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def json_valid(task: dict[str, Any], body: Any, o: ScorerOptions) -> float:
    text = response_text(body).strip()
    m = _FENCE.match(text)
    if m:
        text = m.group(1)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return 0.0
    schema = task.get("schema")
    if schema is None:
        return 1.0
    import jsonschema

    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return 0.0
    return 1.0


_CHOICE_PATTERNS = [
    re.compile(r"answer\s*(?:is|:)?\s*[\(\[]?\s*([A-J])\b", re.IGNORECASE),
    re.compile(r"^\s*[\(\[]?([A-J])[\)\]\.:]?(?:\s|$)"),
    re.compile(r"[\(\[]([A-J])[\)\]]"),
    re.compile(r"\b([A-J])\b"),
]


def extract_choice(text: str) -> str | None:
    for p in _CHOICE_PATTERNS:
        m = p.search(text)
        if m:
            return m.group(1).upper()
    return None


def choice(task: dict[str, Any], body: Any, o: ScorerOptions) -> float:
    got = extract_choice(response_text(body))
    return float(got is not None and got == _expected(task).strip().upper())


BUILTINS: dict[str, Callable[[dict[str, Any], Any, ScorerOptions], float]] = {
    "exact_match": exact_match, "contains": contains, "regex": regex, "json_valid": json_valid, "choice": choice,
}


def load_scorer(spec: str, options: ScorerOptions) -> tuple[str, ScoreFn]:
    """(name, fn(task, body)) for a built-in name or a module:function / file.py:function."""
    if spec in BUILTINS:
        fn = BUILTINS[spec]
        return spec, lambda task, body: fn(task, body, options)
    if ":" not in spec:
        raise ValueError(f"unknown scorer {spec!r}: use one of {', '.join(BUILTINS)}, module:function "
                         "or path/to/file.py:function")
    from evalsup.scoring.plugin import load_callable

    user = load_callable(spec)
    return spec.rpartition(":")[2], user


def to_scores(name: str, value: Any) -> dict[str, float]:
    """A scorer's return value as named numbers."""
    if isinstance(value, bool):
        return {name: float(value)}
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"score {value} is not finite")
        return {name: float(value)}
    if isinstance(value, dict):
        out: dict[str, float] = {}
        for k, v in value.items():
            out.update(to_scores(str(k), v))
        return out
    raise TypeError(f"a scorer must return a number, a bool or a dict of them, not {type(value).__name__}")


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval for a proportion."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


class ScoreStats:
    """Per score name: count, sum, whether every value was 0/1, and errors: constant memory."""

    def __init__(self) -> None:
        self.n: dict[str, int] = {}
        self.total: dict[str, float] = {}
        self.binary: dict[str, bool] = {}
        self.errors: dict[str, int] = {}

    def add(self, scores: dict[str, float | None]) -> None:
        for k, v in scores.items():
            if v is None:
                self.errors[k] = self.errors.get(k, 0) + 1
                continue
            self.n[k] = self.n.get(k, 0) + 1
            self.total[k] = self.total.get(k, 0.0) + v
            self.binary[k] = self.binary.get(k, True) and v in (0.0, 1.0)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in sorted(set(self.n) | set(self.errors)):
            n = self.n.get(k, 0)
            d: dict[str, Any] = {"count": n, "mean": round(self.total.get(k, 0.0) / n, 6) if n else None,
                                 "errors": self.errors.get(k, 0)}
            if n and self.binary.get(k):
                lo, hi = wilson(self.total[k], n)
                d["accuracy"] = d["mean"]
                d["ci95"] = [round(lo, 6), round(hi, 6)]
            out[k] = d
        return out


def score_sync(scorers: list[tuple[str, ScoreFn]], task: dict[str, Any], body: Any
               ) -> tuple[dict[str, float | None], dict[str, str]]:
    """Every scorer on one task, in the calling thread (`evalsup score`, which runs in processes of its own; a
    worker runs them in a thread pool with a timeout, worker/scoring.py)."""
    scores: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    for name, fn in scorers:
        try:
            scores.update(to_scores(name, fn(task, body)))
        except Exception as e:
            scores[name] = None
            errors[name] = f"{type(e).__name__}: {e}"[:500]
    return scores, errors
