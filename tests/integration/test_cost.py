"""Cost control against the mock (issue 30): the estimate's band holds the usage the run then meets; a cap stops
a run (exit 75, exit_reason budget) and a resume with a higher cap completes it exactly once, spend never past
the cap (the mock never answers past a reservation), also after a kill -9; --max-cost with a model that has no
price sends nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from evalsup.config.prices import Price
from evalsup.mock.server import MockThread
from tests.harness import (
    Run,
    assert_exactly_once,
    complete_lines,
    ids_of,
    lines,
    read_results,
    run_cli,
    summary,
)

PRICE = Price(input=1000.0, output=2000.0)  # USD per million tokens: a few cents a task, so a cap is met soon


def _tasks(tmp_path: Path, n: int) -> Path:
    return lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "messages": [
        {"role": "user", "content": f"Question {i}: " + "tell me more " * (i % 7)}]} for i in range(n)])


def _prices(tmp_path: Path) -> Path:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"mock-model": {"input": PRICE.input, "output": PRICE.output}}))
    return f


def _usage(run_dir: Path, complete_only: bool = False) -> tuple[int, int, float]:
    data = (run_dir / "results.jsonl").read_bytes()
    recs = [orjson.loads(x) for x in data[: data.rfind(b"\n") + 1].splitlines()] if complete_only else \
        read_results(run_dir)
    pt = sum(r["response"]["body"]["usage"]["prompt_tokens"] for r in recs)
    ct = sum(r["response"]["body"]["usage"]["completion_tokens"] for r in recs)
    return pt, ct, PRICE.cost(pt, ct)


def test_the_estimate_band_holds_the_usage_met(tmp_path: Path, mock: MockThread) -> None:
    tasks = _tasks(tmp_path, 150)
    r = run_cli("estimate", str(tasks), "--base-url", mock.url, "--model", "mock-model", "--max-tokens", "40",
                "--prices", str(_prices(tmp_path)), "--json")
    assert r.returncode == 0, r.stderr
    est: dict[str, Any] = json.loads(r.stdout)
    assert est["requests"] == 150 and est["prompt_tokens_counted"] == "endpoint"  # the mock's /tokenize
    assert int(mock.stats()["by_path"].get("/v1/chat/completions", 0)) == 0  # no generation for an estimate
    run = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--max-tokens", "40", "-c", "16", "-q",
                  str(tasks))
    assert run.returncode == 0, run.stderr
    pt, ct, cost = _usage(tmp_path / "t.run")
    assert est["prompt_tokens"]["low"] == pt == est["prompt_tokens"]["high"]  # counted by the endpoint: exact
    assert est["completion_tokens"]["low"] <= ct <= est["completion_tokens"]["high"]
    assert est["cost_usd"]["low"] <= round(cost, 4) <= est["cost_usd"]["high"]
    # without a tokenizer (an OpenAI-like endpoint: 404), the prompt is an estimate and says so
    mock.configure(tokenize=False)
    r = run_cli("estimate", str(tasks), "--base-url", mock.url, "--model", "mock-model", "--max-tokens", "40")
    assert r.returncode == 0, r.stderr
    assert "prompts ≈" in r.stdout and "cost unknown: no price for mock-model" in r.stdout


def test_a_cap_stops_the_run_and_a_higher_one_resumes_it_exactly_once(tmp_path: Path, mock: MockThread) -> None:
    n, cap = 120, 3.0
    tasks = _tasks(tmp_path, n)
    args = ("run", "--model", "mock-model", "--base-url", mock.url, "--max-tokens", "40", "-c", "16",
            "--prices", str(_prices(tmp_path)), "--json", str(tasks))
    first = run_cli(*args, "--max-cost", str(cap))
    assert first.returncode == 75, first.stderr
    s = orjson.loads(first.stdout)
    assert s["exit_reason"] == "budget" and s["resumable"] and not s["finished"]
    assert "budget: spent $" in first.stderr and "rerun with a higher cap to resume" in first.stderr
    run_dir = tmp_path / "t.run"
    done = len(read_results(run_dir))
    assert 0 < done < n
    pt, ct, cost = _usage(run_dir)
    b = s["budget"]
    assert (b["spent"]["prompt_tokens"], b["spent"]["completion_tokens"]) == (pt, ct)
    assert abs(b["spent"]["cost_usd"] - cost) < 1e-6 and cost <= cap  # no answer passed its reservation
    assert b["reserved"]["requests"] == 0  # what was out finished before the stop
    status = run_cli("status", str(run_dir))
    assert "budget      spent $" in status.stdout and "rerun with a higher cap" in status.stdout
    assert run_cli("report", str(run_dir)).returncode == 0
    assert "<b>budget</b>spent $" in (run_dir / "report.html").read_text()
    second = run_cli(*args, "--max-cost", "1000")
    assert second.returncode == 0, second.stderr
    assert "(spent so far, from results.jsonl)" in second.stderr
    assert_exactly_once(run_dir, ids_of(n))
    s2 = summary(run_dir)
    pt, ct, cost = _usage(run_dir)
    assert (s2["budget"]["spent"]["prompt_tokens"], s2["budget"]["spent"]["completion_tokens"]) == (pt, ct)
    assert abs(s2["budget"]["spent"]["cost_usd"] - cost) < 1e-6


def test_max_cost_without_a_price_is_refused_before_any_request(tmp_path: Path, mock: MockThread) -> None:
    tasks = _tasks(tmp_path, 20)
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--max-cost", "5", str(tasks))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "evalsup: --max-cost: no price for model 'mock-model'; give its price with --prices FILE, or --self-hosted "
        "for your own endpoint (no request was sent)"]
    assert mock.stats()["requests"] == 0 and not (tmp_path / "t.run").exists()
    ok = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--max-cost", "5", "--self-hosted", "-q",
                 str(tasks))
    assert ok.returncode == 0, ok.stderr


def test_after_kill_9_the_spend_is_read_back_from_the_results(tmp_path: Path, mock: MockThread,
                                                              start: Callable[..., Run]) -> None:
    n = 1500
    tasks = _tasks(tmp_path, n)
    run_dir = tmp_path / "t.run"
    args = ("run", "--model", "mock-model", "--base-url", mock.url, "--max-tokens", "40", "-c", "32",
            "--prices", str(_prices(tmp_path)), str(tasks))
    mock.configure(latency_ms=60, jitter_ms=20)
    p = start(*args, "--max-cost", "1000000")
    p.wait_results(run_dir, 150)
    p.kill_group()
    assert p.wait_workers_gone() == []
    assert complete_lines(run_dir / "results.jsonl") < n
    mock.configure(latency_ms=2, jitter_ms=1)
    _, _, before = _usage(run_dir, complete_only=True)
    cap = before + 1.0  # room for a dozen more tasks, if the resume starts from what was spent
    r = run_cli(*args, "--max-cost", f"{cap:.6f}", "--json")
    assert r.returncode == 75, r.stderr
    s = orjson.loads(r.stdout)
    assert s["exit_reason"] == "budget"
    pt, ct, cost = _usage(run_dir)
    assert (s["budget"]["spent"]["prompt_tokens"], s["budget"]["spent"]["completion_tokens"]) == (pt, ct)
    assert before < cost <= cap
    recs = read_results(run_dir)
    assert len({r["custom_id"] for r in recs}) == len(recs) < n
