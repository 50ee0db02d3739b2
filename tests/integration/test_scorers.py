"""Scorers inside the workers, scores in the summary, and `evalsup score` on a finished run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import ROOT, read_results, run_cli

PLUGIN = ROOT / "tests" / "plugins" / "score_user.py"


def _tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def _run(tasks: Path, url: str, *args: str) -> dict[str, Any]:
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", url, str(tasks), *args)
    assert r.returncode == 0, r.stderr
    return orjson.loads((tasks.with_suffix(".run") / "summary.json").read_bytes())  # type: ignore[no-any-return]


def test_each_builtin_on_mock_responses(tmp_path: Path, mock: MockThread) -> None:
    rows = []
    for i in range(100):
        exp = "ABCD"[i % 4]
        right = i < 60  # the mock answers correctly for 60 of 100: accuracy known in advance
        text = f"The answer is ({exp})." if right else "The answer is (E)."
        rows.append({"id": f"t{i}", "prompt": f"q{i}", "expected": exp, "mock": {"text": text},
                     "pattern": r"answer is \((\w)\)"})
    tasks = _tasks(tmp_path / "mc.jsonl", rows)
    s = _run(tasks, mock.url, "--scorer", "choice", "--scorer", "contains", "--scorer", "regex",
             "--scorer", "exact_match")
    sc = s["scores"]
    assert sc["choice"]["accuracy"] == 0.6 and sc["choice"]["count"] == 100
    assert sc["contains"]["accuracy"] == 0.6
    assert sc["regex"]["accuracy"] == 0.6
    assert sc["exact_match"]["accuracy"] == 0.0
    lo, hi = sc["choice"]["ci95"]
    assert lo < 0.6 < hi
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "mc.run")}
    assert recs["t0"]["scores"]["choice"] == 1.0 and recs["t99"]["scores"]["choice"] == 0.0

    rows = [{"id": f"j{i}", "prompt": "x", "expected": "yes", "schema": {"type": "object", "required": ["ok"]},
             "mock": {"text": '{"ok": true}' if i % 2 else ("not json" if i % 4 else '{"other": 1}')}}
            for i in range(40)]
    rows += [{"id": f"e{i}", "prompt": "x", "expected": " Yes ", "mock": {"text": "yes"}} for i in range(10)]
    tasks = _tasks(tmp_path / "js.jsonl", rows)
    s = _run(tasks, mock.url, "--scorer", "json_valid", "--scorer", "exact_match", "--ignore-case")
    assert s["scores"]["json_valid"]["accuracy"] == pytest.approx(20 / 50)  # the 10 "yes" answers are not JSON
    assert s["scores"]["exact_match"]["count"] == 50
    assert s["scores"]["exact_match"]["accuracy"] == pytest.approx(10 / 50)


def test_user_scorers_raise_and_timeout(tmp_path: Path, mock: MockThread) -> None:
    rows = [{"id": f"t{i}", "prompt": f"q{i}", "expected": "hello", "mock": {"text": "hello world"}}
            for i in range(20)]
    tasks = _tasks(tmp_path / "u.jsonl", rows)
    s = _run(tasks, mock.url, "--scorer", f"{PLUGIN}:length_and_hit", "--scorer", f"{PLUGIN}:boom",
             "--scorer", f"{PLUGIN}:slow", "--scorer-timeout", "1")
    sc = s["scores"]
    # a custom scorer's dict keys are SCORER.KEY: two scorers' keys never clash
    assert sc["length_and_hit.length"]["mean"] == len("hello world") and sc["length_and_hit.hit"]["accuracy"] == 1.0
    assert sc["boom"]["errors"] == 2 and sc["boom"]["count"] == 18  # t3 and t13 raise
    assert sc["slow"]["errors"] == 1 and sc["slow"]["count"] == 19
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "u.run")}
    assert len(recs) == 20
    assert recs["t3"]["scores"]["boom"] is None
    assert recs["t3"]["score_errors"]["boom"] == "ValueError: cannot score this one"
    assert "TimeoutError" in recs["t0"]["score_errors"]["slow"]
    assert recs["t3"]["error"] is None  # the result itself is kept


def test_evalsup_score_reproduces_without_requests(tmp_path: Path, mock: MockThread) -> None:
    rows = [{"id": f"t{i}", "prompt": f"q{i}", "expected": "B", "mock": {"text": "B" if i % 3 else "C"}}
            for i in range(300)]
    tasks = _tasks(tmp_path / "r.jsonl", rows)
    s = _run(tasks, mock.url, "--scorer", "choice", "--scorer", "exact_match")
    before = mock.stats()["requests"]
    r = run_cli("score", str(tmp_path / "r.run"), "--scorer", "choice", "--scorer", "exact_match", "-w", "2")
    assert r.returncode == 0, r.stderr
    assert mock.stats()["requests"] == before
    again = orjson.loads((tmp_path / "r.run" / "scores.json").read_bytes())
    assert again == s["scores"]
    orig = {x["custom_id"]: x["scores"] for x in read_results(tmp_path / "r.run")}
    with open(tmp_path / "r.run" / "results.scored.jsonl", "rb") as f:
        rescored = [orjson.loads(line) for line in f]
    assert [x["custom_id"] for x in rescored] == [x["custom_id"] for x in read_results(tmp_path / "r.run")]
    assert all(orig[x["custom_id"]] == x["scores"] for x in rescored)


def test_a_mixed_eval_counts_tasks_without_expected_as_unscored(tmp_path: Path, mock: MockThread) -> None:
    rows: list[dict[str, Any]] = []
    for i in range(40):  # 24 multiple-choice tasks with an answer key, 16 open questions without one
        row: dict[str, Any] = {"id": f"t{i}", "prompt": f"q{i}", "metadata": {"subject": "law" if i % 2 else "art"},
                               "mock": {"text": "The answer is (d)." if i % 3 else "I think B is right"}}
        if i < 24:
            row["expected"] = "D"
            row["choices"] = ["w", "x", "y", "z"]
        rows.append(row)
    tasks = _tasks(tmp_path / "mixed.jsonl", rows)
    wide = {"COLUMNS": "200"}  # the summary table's rows on one line each
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks), "--scorer", "choice",
                "--scorer", "exact_match", "--ignore-case", "--scorer", f"{PLUGIN}:length_and_hit", env=wide)
    assert r.returncode == 0, r.stderr
    s = orjson.loads((tmp_path / "mixed.run" / "summary.json").read_bytes())
    sc = s["scores"]
    # 16 of the 24 answer (d): right, case aside; the other 8 say B
    assert sc["choice"]["count"] == 24 and sc["choice"]["unscored"] == 16 and sc["choice"]["errors"] == 0
    assert sc["choice"]["accuracy"] == pytest.approx(16 / 24)
    assert sc["exact_match"] == {**sc["exact_match"], "count": 24, "unscored": 16, "errors": 0, "accuracy": 0.0}
    assert sc["length_and_hit.length"]["count"] == 40 and sc["length_and_hit.hit"]["unscored"] == 0
    line = next(x for x in r.stdout.splitlines() if "score choice" in x)
    assert "n=24, 16 unscored" in line and "errors" not in line, r.stdout
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "mixed.run")}
    assert recs["t1"]["metadata"] == {"subject": "law", "expected": "D", "choices": ["w", "x", "y", "z"]}
    assert recs["t30"]["metadata"] == {"subject": "art"}  # as given, not metadata.metadata
    assert recs["t1"]["scores"] == {"choice": 1.0, "exact_match": 0.0, "length_and_hit.length": 18.0,
                                    "length_and_hit.hit": 0.0}
    assert "choice" not in recs["t30"]["scores"] and "score_errors" not in recs["t30"]  # unscored: absent
    # evalsup score counts the same
    r = run_cli("score", str(tmp_path / "mixed.run"), "--scorer", "choice", "--scorer", "exact_match",
                "--ignore-case", "--scorer", f"{PLUGIN}:length_and_hit", "-w", "2", env=wide)
    assert r.returncode == 0, r.stderr
    assert orjson.loads((tmp_path / "mixed.run" / "scores.json").read_bytes()) == sc
    assert "n=24, 16 unscored" in next(x for x in r.stdout.splitlines() if "score choice" in x)


def test_unknown_scorer_is_a_clear_error(tmp_path: Path, mock: MockThread) -> None:
    tasks = _tasks(tmp_path / "x.jsonl", [{"id": "a", "prompt": "q"}])
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--scorer", "nope", str(tasks))
    assert r.returncode == 2 and "unknown scorer 'nope'" in r.stderr
