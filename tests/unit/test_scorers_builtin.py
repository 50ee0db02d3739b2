"""The built-in scorer functions, called directly. (Scorers in real runs: integration/test_scorers.py.)"""

from __future__ import annotations

from typing import Any

from evalsup.scoring.scorers import ScorerOptions, choice, extract_choice, json_valid, regex, wilson


def _body(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


def test_builtin_functions() -> None:
    o = ScorerOptions()
    assert extract_choice("The answer is (C).") == "C"
    assert extract_choice("B) because") == "B"
    assert choice({"expected": "b"}, _body("Answer: B"), o) == 1.0
    assert regex({"expected": "42", "pattern": r"= (\d+)"}, _body("x = 42"), o) == 1.0
    assert json_valid({}, _body('```json\n{"a": 1}\n```'), o) == 1.0
    schema = {"type": "object", "required": ["a"]}
    assert json_valid({"schema": schema}, _body('{"b": 1}'), o) == 0.0
    lo, hi = wilson(60, 100)
    assert 0.5 < lo < 0.6 < hi < 0.7
