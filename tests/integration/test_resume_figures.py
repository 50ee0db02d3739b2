"""A resume's figures against what its results say (issue 40): the start line says what the answers so far
spent and how long they were (read back from results.jsonl, after a kill -9 too), and the estimate that follows
is made with those lengths, the same figure `evalsup estimate` gives for the same run (it once said half of
max_tokens and called it "seen")."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from evalsup.config.prices import Price
from evalsup.mock.server import MockThread
from evalsup.tasks.tokens import fmt_tokens, fmt_usd
from tests.harness import Run, complete_lines, finished_run, killed_mid_run, run_cli

PRICE = Price(input=3.0, output=15.0)  # USD per million tokens, given with --prices


def _prices(tmp_path: Path) -> Path:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"mock-model": {"input": PRICE.input, "output": PRICE.output}}))
    return f


def _spent(run_dir: Path) -> tuple[int, int, int, float]:
    """(records, prompt tokens, completion tokens, mean completion tokens an answer) of the complete lines."""
    data = (run_dir / "results.jsonl").read_bytes()
    recs = [orjson.loads(x) for x in data[: data.rfind(b"\n") + 1].splitlines()]
    usage = [r["response"]["body"]["usage"] for r in recs]
    pt, ct = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
    return len(recs), pt, ct, ct / len(recs)


def _line(stderr: str, start: str) -> str:
    got = [x for x in stderr.splitlines() if x.startswith(f"evalsup: {start}")]
    assert len(got) == 1, stderr
    return got[0]


def _says_the_spend(stderr: str, n: int, pt: int, ct: int, mean: float) -> None:
    line = _line(stderr, "resumed:")
    assert line == (f"evalsup: resumed: {n:,} record(s) so far in results.jsonl; spent {pt:,} prompt and {ct:,} "
                    f"completion tokens, {fmt_usd(PRICE.cost(pt, ct))}; their answers were {mean:,.1f} completion "
                    f"tokens on average (shortest {_shortest(line)}), which the estimate below assumes"), line


def _shortest(line: str) -> str:
    m = re.search(r"shortest ([\d,]+)\)", line)
    assert m, line
    return m.group(1)


def test_a_resume_says_what_was_spent_and_estimates_with_it_as_evalsup_estimate_does(
        tmp_path: Path, mock: MockThread) -> None:
    prices = _prices(tmp_path)
    tasks, run_dir, args = finished_run(tmp_path, mock, 100, "--max-tokens", "300", "--prices", str(prices))
    with open(tasks, "ab") as f:  # 100 more lines: the resume sends them
        for i in range(100, 200):
            f.write(orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + b"\n")
    n, pt, ct, mean = _spent(run_dir)
    est = run_cli("estimate", str(tasks), "--prices", str(prices), "--json")
    assert est.returncode == 0, est.stderr
    e: dict[str, Any] = json.loads(est.stdout)
    assert e["done"] == 100 and e["completion_from"] == "seen"
    assert abs(e["completion_tokens"]["expected"] - mean * 100) <= 1
    r = run_cli(*args, "-v")  # -v: the spend and the whole estimate, each on its line
    assert r.returncode == 0, r.stderr
    _says_the_spend(r.stderr, n, pt, ct, mean)
    line = _line(r.stderr, "estimate for the lines not yet read:")
    # the answers' own mean, as `evalsup estimate` says it; never half of max_tokens (300 x 100 / 2 = 15,000)
    assert f"≈ {fmt_tokens(e['completion_tokens']['expected'])} expected (the mean length of the answers seen so " \
           "far)" in line, line
    assert "answers at most 30,000 tokens in all" in line and f"Prices: your prices ({prices})" in line


def test_after_kill_9_the_resume_says_what_the_results_hold(tmp_path: Path, mock: MockThread,
                                                            start: Callable[..., Run]) -> None:
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n=1000, at_least=150)
    n, pt, ct, mean = _spent(run_dir)
    assert n == complete_lines(run_dir / "results.jsonl") and 0 < n < 1000
    r = run_cli(*args, "-v", "--prices", str(_prices(tmp_path)))
    assert r.returncode == 0, r.stderr
    _says_the_spend(r.stderr, n, pt, ct, mean)
