"""The built-in scorers on the answers models really write: a table of answer shapes, each with the extraction
(or score) written beside it. The rules follow the harnesses people trust: simple-evals'
ANSWER_PATTERN_MULTICHOICE ("Answer: X"), lm-evaluation-harness's regex and multiple-choice filters (an
explicit pattern first, else a fallback; the last number for math), Inspect AI's choice/match scorers, SQuAD's
normalize_answer. No process, no socket."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from evalsup.scoring.scorers import (
    ScorerOptions,
    builtin_math_match,
    choice,
    contains,
    exact_match,
    extract_choice,
    extract_number,
    math_match,
    options_of,
    regex,
)
from evalsup.scoring.verify import implementation


def _body(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}


# (answer text, the options, the letter extracted)
ABCD = "ABCD"
AZ = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
CHOICE_SHAPES: list[tuple[str, str, str | None]] = [
    ("B", ABCD, "B"),
    ("d", ABCD, "D"),
    ("(d)", ABCD, "D"),
    ("(D)", ABCD, "D"),
    ("D.", ABCD, "D"),
    ("d.", ABCD, "D"),
    ("**B**", ABCD, "B"),
    ("**b**", ABCD, "B"),
    ("[C]", ABCD, "C"),
    ("  C  \n", ABCD, "C"),
    ("Answer: D", ABCD, "D"),
    ("Answer: d", ABCD, "D"),
    ("ANSWER: A", ABCD, "A"),
    ("answer:C", ABCD, "C"),
    ("**Answer:** B", ABCD, "B"),
    ("**Answer: B**", ABCD, "B"),
    ("Answer: **C**", ABCD, "C"),
    ("Answer: $B$", ABCD, "B"),
    ("The answer is (d).", ABCD, "D"),
    ("The answer is (B).", ABCD, "B"),
    ("The answer is B.", ABCD, "B"),
    ("The answer is: C", ABCD, "C"),
    ("The correct answer is option C.", ABCD, "C"),
    ("The correct option is A", ABCD, "A"),
    ("The best choice is (b)", ABCD, "B"),
    ("Final answer: D", ABCD, "D"),
    ("Final Answer: The final answer is $\\boxed{C}$", ABCD, "C"),
    ("\\boxed{B}", ABCD, "B"),
    ("\\boxed{\\text{D}}", ABCD, "D"),
    ("I think B is right", ABCD, "B"),
    ("I think B is right", AZ, "B"),
    ("I believe the answer is C", AZ, "C"),
    ("B, because I checked it", AZ, "B"),
    ("A is wrong, C is too small, so B.", ABCD, "B"),
    ("Options A and C contradict the data; D ignores it. That leaves B", ABCD, "B"),
    ("Let's think. A) is 3, B) is 4, C) is 5. The answer is C.", ABCD, "C"),
    ("Step 1: rule out A. Step 2: rule out D.\nAnswer: B", ABCD, "B"),
    ("Answer: B\n\nExplanation: A and C are wrong because of the sign.", ABCD, "B"),
    ("The answer is not A. The answer is C.", ABCD, "C"),
    ("B) Paris", ABCD, "B"),
    ("**C.** 42 metres", ABCD, "C"),
    ("(A) the first one", ABCD, "A"),
    ("d) none of the above", ABCD, "D"),
    ("C: the mitochondria", ABCD, "C"),
    ("The capital of France is Paris, which is option B.", ABCD, "B"),
    ("It's (c)", ABCD, "C"),
    ("My answer: c", ABCD, "C"),
    ("A good answer would be D", ABCD, "D"),
    ("Answer: E", ABCD, None),  # not an option
    ("E", ABCD, None),
    ("Answer: E", "ABCDE", "E"),
    ("The answer is (J).", "ABCDEFGHIJ", "J"),
    ("The answer is (J).", ABCD, None),
    ("Answer: I", "ABCDEFGHIJ", "I"),
    ("I don't know", ABCD, None),
    ("I don't know", AZ, None),
    ("I am not sure.", AZ, None),
    ("The answer is a bit tricky, but B", ABCD, "B"),
    ("a", ABCD, "A"),
    ("Paris", ABCD, None),
    ("", ABCD, None),
    ("The U.S. is the answer, so D", ABCD, "D"),
    ("X-rays pass through; C", ABCD, "C"),
    ("Answer - B", ABCD, "B"),
    ("answer = C", ABCD, "C"),
    ("Therefore, the correct answer is **(A)**.", ABCD, "A"),
    # issue 43: an answer that opens with its letter, then explains (the last letter alone was read before)
    ("B\n\nExplanation: A and C are wrong because they ignore friction.", ABCD, "B"),
    ("B\nA and C are wrong", ABCD, "B"),
    ("**B** because A and C fail", ABCD, "B"),
    ("**(B)**\nnot C", ABCD, "B"),
    ("(B) as A is wrong, C too", ABCD, "B"),
    ("B. Explanation: not C", ABCD, "B"),
    ("A\nC is wrong", ABCD, "A"),
    ("A good one is C", ABCD, "C"),
]


@pytest.mark.parametrize(("text", "options", "letter"), CHOICE_SHAPES)
def test_choice_extracts(text: str, options: str, letter: str | None) -> None:
    assert extract_choice(text, options) == letter


# (answer text, the final number)
MATH_SHAPES: list[tuple[str, Fraction | None]] = [
    ("42", Fraction(42)),
    ("42.", Fraction(42)),
    ("The answer is 42.", Fraction(42)),
    ("\\boxed{1,234}", Fraction(1234)),
    ("So the total is $\\boxed{1,234}$.", Fraction(1234)),
    ("$12.50", Fraction(25, 2)),
    ("She pays $12.50 in total.", Fraction(25, 2)),
    ("1,234,567", Fraction(1234567)),
    ("-5", Fraction(-5)),
    ("The temperature fell to −7 degrees.", Fraction(-7)),
    ("3/4", Fraction(3, 4)),
    ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
    ("\\boxed{\\dfrac{1}{2}}", Fraction(1, 2)),
    ("\\boxed{0.5}", Fraction(1, 2)),
    (".5", Fraction(1, 2)),
    ("50%", Fraction(50)),
    ("\\boxed{12\\text{ cm}}", Fraction(12)),
    ("#### 72", Fraction(72)),
    ("Natalia sold 48/2 = 24 clips in May.\n48 + 24 = 72\n#### 72", Fraction(72)),
    ("First 3 + 4 = 7, then 7 * 6 = 42. So the answer is 42", Fraction(42)),
    ("The answer is 18 (after 3 steps).", Fraction(18)),
    ("Answer: 1,000", Fraction(1000)),
    ("Final answer: $3.00", Fraction(3)),
    ("x = 5", Fraction(5)),
    ("He has 2 cats and 3 dogs, so 5 pets.", Fraction(5)),
    ("There are 10 apples left", Fraction(10)),
    ("no number here", None),
    ("", None),
    ("\\boxed{-3}", Fraction(-3)),
    ("The result is 7.25 m", Fraction(29, 4)),
    ("from 3 to 5", Fraction(5)),
    ("3-5", Fraction(5)),
    ("Answer: 0", Fraction(0)),
    ("The value is 1,2345", Fraction(2345)),  # not a thousands grouping: the last number written
    # issue 43: LaTeX powers and space-grouped thousands (each read as its last number before)
    ("$1.5 \\times 10^3$", Fraction(1500)),
    ("The mass is $2 \\cdot 10^{-2}$ kg.", Fraction(1, 50)),
    ("3×10^{4}", Fraction(30000)),
    ("1.5e3", Fraction(1500)),
    ("$2^{10}$", Fraction(1024)),
    ("\\boxed{2^{10}}", Fraction(1024)),
    ("(-3)^3", Fraction(-27)),
    ("1 000", Fraction(1000)),
    ("The answer is 1\u2009000 000.", Fraction(1000000)),
    ("\\boxed{1\\,000}", Fraction(1000)),
    ("1{,}000", Fraction(1000)),
    ("12 3456", Fraction(3456)),  # a group of four digits: two numbers
]


@pytest.mark.parametrize(("text", "number"), MATH_SHAPES)
def test_math_extracts(text: str, number: Fraction | None) -> None:
    assert extract_number(text) == number


# (scorer, task, answer text, options, score)
S = ScorerOptions()
CASE = ScorerOptions(ignore_case=True)
SQUAD = ScorerOptions(normalize=True)
SCORE_SHAPES: list[tuple[Any, dict[str, Any], str, ScorerOptions, float | None]] = [
    (exact_match, {"expected": "Paris"}, "Paris", S, 1.0),
    (exact_match, {"expected": "Paris"}, "  Paris\n", S, 1.0),
    (exact_match, {"expected": "Paris"}, "Paris.", S, 0.0),
    (exact_match, {"expected": "Paris"}, "paris", S, 0.0),
    (exact_match, {"expected": "Paris"}, "paris", CASE, 1.0),
    (exact_match, {"expected": "Paris"}, "Paris.", SQUAD, 1.0),
    (exact_match, {"expected": "the Eiffel Tower"}, "Eiffel  tower!", SQUAD, 1.0),
    (exact_match, {"expected": "an apple"}, "Apple", SQUAD, 1.0),
    (exact_match, {"expected": "New York"}, "new-york", SQUAD, 0.0),  # SQuAD drops '-', leaving "newyork"
    (exact_match, {"expected": ["Paris", "Paris, France"]}, "Paris, France", S, 1.0),
    (exact_match, {"expected": 42}, "42", S, 1.0),
    (exact_match, {}, "Paris", S, None),
    (exact_match, {"expected": None}, "Paris", S, None),
    (contains, {"expected": "Paris"}, "The capital is Paris.", S, 1.0),
    (contains, {"expected": "paris"}, "The capital is Paris.", S, 0.0),
    (contains, {"expected": "paris"}, "The capital is Paris.", CASE, 1.0),
    (contains, {"expected": "Eiffel Tower"}, "It's the eiffel-tower", SQUAD, 0.0),
    (contains, {"expected": "Eiffel Tower"}, "It's the Eiffel  Tower.", SQUAD, 1.0),
    (contains, {"expected": ["Rome", "Paris"]}, "Paris", S, 1.0),
    (contains, {}, "Paris", S, None),
    (regex, {"pattern": r"\d+"}, "there are 12", S, 1.0),
    (regex, {"pattern": r"\d+"}, "none", S, 0.0),
    (regex, {"pattern": r"= (\d+)", "expected": "42"}, "x = 42", S, 1.0),
    (regex, {"pattern": r"= (\d+)", "expected": "42"}, "x = 41", S, 0.0),
    (regex, {"pattern": r"answer is (\w+)", "expected": "paris"}, "The answer is Paris", CASE, 1.0),
    (regex, {"expected": "42"}, "x = 42", S, None),  # no pattern in the task nor --regex
    (regex, {"expected": "42"}, "x = 42", ScorerOptions(pattern=r"= (\d+)"), 1.0),
    (choice, {"expected": "D"}, "d", S, 1.0),
    (choice, {"expected": "d"}, "D", S, 1.0),
    (choice, {"expected": "(B)"}, "The answer is (b).", S, 1.0),
    (choice, {"expected": "D"}, "d", CASE, 1.0),
    (choice, {"expected": "B", "choices": ["x", "y", "z", "w"]}, "I think B is right", S, 1.0),
    (choice, {"expected": "y", "choices": ["x", "y", "z", "w"]}, "Answer: B", S, 1.0),  # expected as the text
    (choice, {"expected": "E", "options": ["1", "2", "3", "4", "5"]}, "Answer: E", S, 1.0),
    (choice, {"expected": ["A", "C"]}, "C", S, 1.0),
    (choice, {}, "B", S, None),
    (math_match, {"expected": "1234"}, "\\boxed{1,234}", S, 1.0),
    (math_match, {"expected": 12.5}, "$12.50", S, 1.0),
    (math_match, {"expected": "0.5"}, "\\boxed{\\frac{1}{2}}", S, 1.0),
    (math_match, {"expected": "1,234"}, "1234.", S, 1.0),
    (math_match, {"expected": 72}, "#### 72", S, 1.0),
    (math_match, {"expected": 72}, "72 + 1 = 73", S, 0.0),
    (math_match, {"expected": "-3"}, "The answer is −3.", S, 1.0),
    (math_match, {"expected": 3}, "no idea", S, 0.0),
    (math_match, {}, "42", S, None),
]


@pytest.mark.parametrize(("fn", "task", "text", "opts", "score"), SCORE_SHAPES)
def test_scorers_score(fn: Any, task: dict[str, Any], text: str, opts: ScorerOptions, score: float | None) -> None:
    assert fn(task, _body(text), opts) == score


# the math rows again, read by each implementation: the built-in reader always, math-verify where installed
MATH_SCORES = [(t, x, s) for f, t, x, _, s in SCORE_SHAPES if f is math_match] + [
    ({"expected": "1500"}, "$1.5 \\times 10^3$", 1.0),
    ({"expected": "1024"}, "So $2^{10}$ ways.", 1.0),
    ({"expected": "1000"}, "1 000", 1.0),
    ({"expected": "1500"}, "It is 1500 or $1.5 \\times 10^3$: \\boxed{1500}", 1.0),
    ({"expected": "3"}, "$1.5 \\times 10^3$", 0.0),  # the power's 3 was the last number it read before
]


@pytest.mark.parametrize(("task", "text", "score"), MATH_SCORES)
def test_builtin_math_scores(task: dict[str, Any], text: str, score: float | None) -> None:
    assert builtin_math_match(task, _body(text), S) == score


@pytest.mark.parametrize(("task", "text", "score"), MATH_SCORES)
def test_math_verify_scores(task: dict[str, Any], text: str, score: float | None) -> None:
    pytest.importorskip("math_verify")
    assert math_match(task, _body(text), S) == score
    assert implementation().startswith("math-verify ")


def test_the_table_is_large() -> None:
    assert len(CHOICE_SHAPES) + len(MATH_SHAPES) + len(SCORE_SHAPES) >= 100


def test_options_come_from_the_task() -> None:
    assert options_of({"choices": ["a", "b", "c"]}) == "ABC"
    assert options_of({"options": {"A": 1, "B": 2, "E": 3}}) == "ABE"
    assert options_of({}) == AZ and options_of({"choices": "abc"}) == AZ


def test_a_non_letter_expected_is_an_error_not_a_wrong_answer() -> None:
    with pytest.raises(ValueError, match="not an option letter"):
        choice({"expected": "Paris"}, _body("B"), S)
    with pytest.raises(ValueError, match="not a number"):
        math_match({"expected": "many"}, _body("3"), S)
    with pytest.raises(ValueError, match="not a number"):
        builtin_math_match({"expected": "many"}, _body("3"), S)
