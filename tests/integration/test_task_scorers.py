"""Scorers per task (issue 43): one file mixing multiple choice, math and exact answers, each line naming its own
scorers; the run's --scorer for the lines that name none; a bad name refused by the pre-scan, by line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evalsup.mock.server import MockThread
from tests.harness import chat_requests, read_results, run_cli


def _tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_a_mixed_set_reports_no_false_errors(tmp_path: Path, mock: MockThread) -> None:
    rows: list[dict[str, Any]] = []
    for i in range(6):  # multiple choice, 4 of 6 right; one opens with its letter and names others after
        text = "B\n\nExplanation: A and C are wrong." if i == 0 else ("Answer: B" if i < 4 else "Answer: D")
        rows.append({"id": f"mc{i}", "prompt": "q", "expected": "B", "scorer": "choice", "mock": {"text": text}})
    for i in range(10):  # math, 9 of 10 right, LaTeX included
        text = "$1.5 \\times 10^3$" if i == 0 else ("#### 1500" if i < 9 else "#### 15")
        rows.append({"id": f"m{i}", "prompt": "q", "expected": "1500", "scorer": ["math"], "mock": {"text": text}})
    rows.append({"id": "ex", "prompt": "q", "expected": "paris", "mock": {"text": "Paris"},
                 "scorer": [{"name": "exact_match", "ignore_case": True}]})
    rows += [{"id": f"d{i}", "prompt": "q", "expected": "yes", "mock": {"text": "yes"}} for i in range(3)]
    tasks = _tasks(tmp_path / "mixed.jsonl", rows)
    # the run's default: contains, for the lines that name no scorer (the last three)
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks), "--scorer", "contains")
    assert r.returncode == 0, r.stderr
    s = orjson.loads((tmp_path / "mixed.run" / "summary.json").read_bytes())["scores"]
    assert s["choice"]["count"] == 6 and s["choice"]["accuracy"] == round(4 / 6, 6) and s["choice"]["errors"] == 0
    assert s["math"]["count"] == 10 and s["math"]["accuracy"] == 0.9 and s["math"]["errors"] == 0
    assert s["exact_match"]["count"] == 1 and s["exact_match"]["accuracy"] == 1.0
    assert s["contains"]["count"] == 3 and s["contains"]["errors"] == 0  # not run on the 17 that name their own
    recs = {x["custom_id"]: x for x in read_results(tmp_path / "mixed.run")}
    assert recs["mc0"]["scores"] == {"choice": 1.0}
    assert recs["m0"]["scores"] == {"math": 1.0}
    assert recs["d0"]["scores"] == {"contains": 1.0}
    assert not any("score_errors" in x for x in recs.values())

    # evalsup score applies the same rule: each task its own scorers, the flag's for the rest
    r = run_cli("score", str(tmp_path / "mixed.run"), "--scorer", "exact_match")
    assert r.returncode == 0, r.stderr
    scores = orjson.loads((tmp_path / "mixed.run" / "scores.json").read_bytes())
    got = scores.get("scores", scores)
    assert got["choice"]["count"] == 6 and got["math"]["count"] == 10 and got["exact_match"]["count"] == 4


def test_a_task_naming_an_unknown_scorer_is_refused_by_line(tmp_path: Path, mock: MockThread) -> None:
    rows = [{"id": "a", "prompt": "q", "expected": "B", "scorer": "choice"},
            {"id": "b", "prompt": "q", "expected": "B", "scorer": "evil.py:run"},
            {"id": "c", "prompt": "q", "expected": "B", "scorer": "judge"}]
    tasks = _tasks(tmp_path / "bad.jsonl", rows)
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 2
    assert "bad.jsonl:2" in r.stderr and "evil.py:run" in r.stderr and "Traceback" not in r.stderr
    assert chat_requests(mock) == 0  # refused before any request
    tasks = _tasks(tmp_path / "judge.jsonl", rows[2:])
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 2 and "judge.jsonl:1" in r.stderr and "--scorer judge" in r.stderr
