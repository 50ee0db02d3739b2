"""What a record keeps of its task and its scores: the line's own metadata as given, a custom scorer's keys as
SCORER.KEY, unscored tasks counted apart from errors, the text of every route in the Python API. No process, no
socket."""

from __future__ import annotations

from typing import Any

import pytest

from evalsup.api.results import Record, _flat
from evalsup.scoring.scorers import Scored, ScoreStats, load_scorer, score_sync, to_scores
from evalsup.scoring.verify import implementation
from evalsup.supervisor.summary import score_rows
from evalsup.tasks.reader import validate
from evalsup.tasks.requests import RequestDefaults, to_request

D = RequestDefaults()


@pytest.mark.parametrize(("line", "metadata"), [
    ({"id": "a", "prompt": "q", "expected": "B", "metadata": {"subject": "law"}},
     {"subject": "law", "expected": "B"}),
    ({"id": "a", "prompt": "q", "metadata": {"subject": "law", "level": {"n": 2}}},
     {"subject": "law", "level": {"n": 2}}),
    ({"id": "a", "prompt": "q", "expected": "B"}, {"expected": "B"}),
    ({"id": "a", "prompt": "q", "metadata": {}}, {}),
    ({"custom_id": "a", "body": {"messages": [{"role": "user", "content": "q"}]}, "metadata": {"k": 1},
      "expected": 2}, {"k": 1, "expected": 2}),
])
def test_a_lines_metadata_is_kept_as_given_its_other_keys_beside_it(line: dict[str, Any],
                                                                   metadata: dict[str, Any]) -> None:
    assert validate(line) == "a"
    assert to_request(line, D)[2] == metadata


@pytest.mark.parametrize(("line", "reason"), [
    ({"id": "a", "prompt": "q", "expected": "B", "metadata": {"expected": "C"}},
     "'expected' is both a key of 'metadata' and a top-level key"),
    ({"id": "a", "prompt": "q", "metadata": "law"}, "'metadata' must be an object, not str"),
    ({"custom_id": "a", "body": {}, "k": 1, "metadata": {"k": 2}}, "'k' is both"),
])
def test_a_clash_or_a_metadata_that_is_no_object_is_refused_in_one_line(line: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as e:
        validate(line)
    assert "\n" not in str(e.value)


def test_the_body_keeps_metadata_out_of_the_request() -> None:
    _, body, _ = to_request({"id": "a", "prompt": "q", "metadata": {"s": 1}}, D)
    assert "metadata" not in body and "s" not in body


def test_a_custom_scorers_dict_keys_are_scorer_dot_key() -> None:
    assert to_scores("rubric", {"len": 3, "short": True}) == ({"rubric.len": 3.0, "rubric.short": 1.0}, [])
    assert to_scores("rubric", {"a": {"b": 1}}) == ({"rubric.a.b": 1.0}, [])
    assert to_scores("rubric", {"len": 3, "judge": None}) == ({"rubric.len": 3.0}, ["rubric.judge"])
    assert to_scores("rubric", None) == ({}, ["rubric"])

    def two(task: dict[str, Any], body: Any) -> dict[str, float]:
        return {"len": 1.0}

    got = score_sync([("one", two), ("other", two)], {}, {})
    assert got.scores == {"one.len": 1.0, "other.len": 1.0}  # no clash


def _body(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


def test_a_task_without_expected_is_unscored_not_an_error() -> None:
    from evalsup.scoring.scorers import ScorerOptions

    scorers = [load_scorer(n, ScorerOptions()) for n in ("choice", "exact_match", "contains", "math", "regex")]
    # math: the expected "2" of the first six, with the answer "B": wrong, not an error
    stats = ScoreStats()
    for i in range(10):
        task = {"id": str(i), "expected": "B"} if i < 6 else {"id": str(i)}
        got = score_sync(scorers[:3] + scorers[4:], task, _body("B"))
        got_math = score_sync(scorers[3:4], {**task, "expected": "2"} if i < 6 else task, _body("B"))
        assert got.errors == {} == got_math.errors
        got.scores.update(got_math.scores)
        got.unscored.extend(got_math.unscored)
        stats.add(got.scores, got.unscored)
    s = stats.summary()
    assert s["choice"] == {"count": 6, "mean": 1.0, "errors": 0, "unscored": 4, "accuracy": 1.0,
                           "ci95": s["choice"]["ci95"]}
    assert s["math"] == {"count": 6, "mean": 0.0, "errors": 0, "unscored": 4, "accuracy": 0.0,
                         "ci95": s["math"]["ci95"], "implementation": implementation()}
    assert s["regex"] == {"count": 0, "mean": None, "errors": 0, "unscored": 10}
    rows = dict(score_rows(s))
    assert rows["score choice"].startswith("accuracy 1.000") and rows["score choice"].endswith("n=6, 4 unscored")
    assert rows["score regex"] == "no score (n=0), 10 unscored"


def test_errors_and_unscored_are_apart_in_the_summary_line() -> None:
    stats = ScoreStats()
    for v in (1.0, 0.0, None):
        stats.add({"choice": v})
    stats.add({}, ["choice"])
    (_name, line), = score_rows(stats.summary())
    assert line.endswith("n=2, 1 unscored, 1 errors")
    assert not ScoreStats() and stats


def test_scored_records_an_error_for_a_bad_return_value() -> None:
    s = Scored({}, {}, [])
    s.take("x", "nope")
    assert s.scores == {"x": None} and s.errors["x"].startswith("TypeError")


@pytest.mark.parametrize(("body", "text"), [
    ({"choices": [{"message": {"content": "hi"}}]}, "hi"),
    ({"choices": [{"text": "hi"}]}, "hi"),
    ({"object": "response", "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]},
     "hi"),
    ({"object": "list", "data": [{"embedding": [0.0]}]}, None),
])
def test_record_text_and_the_pandas_text_column_on_every_route(body: Any, text: str | None) -> None:
    rec = {"custom_id": "a", "response": {"status_code": 200, "body": body}, "error": None,
           "metadata": {"subject": "law"}, "scores": {"rubric.len": 2.0}}
    assert Record.from_dict(rec).text == text
    row = _flat(rec)
    assert row["text"] == text and row["metadata.subject"] == "law" and row["score.rubric.len"] == 2.0
