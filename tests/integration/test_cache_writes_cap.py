"""A Claude model's prompts are reserved at the cache-write rates only when a request marks the cache (issue 40,
"caps hold"); a gateway that marks requests itself bills writes no request asked for, and the run learns it from
the first such answer: every later prompt is reserved at the dearest write rate, in this session and in a rerun
(read back from the checkpoint). Counted at the mock's bill."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from evalsup.config.prices import load_prices
from evalsup.mock.server import MockConfig, MockThread
from evalsup.rundir.checkpoint import load_checkpoint
from tests.harness import lines, run_cli, summary

MODEL = "claude-mock"  # (a name with "claude": Anthropic's cache-write rates, 1.25x and 2x its input's)


def _priced(tmp_path: Path) -> tuple[Path, Callable[[MockThread], float]]:
    """The prices file (MODEL at $1,000 / $100 per million tokens, no write rates of its own: Anthropic's
    multipliers) and what the mock's bill comes to at them, every prompt token billed as written to the cache."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({MODEL: {"input": 1000.0, "output": 100.0}}))
    price = load_prices(prices, maintained=False).lookup(MODEL)
    assert price is not None and price.writes_marked

    def bill(mock: MockThread) -> float:
        b = mock.stats()["billed"][MODEL]
        return price.cost(b["prompt_tokens"], b["completion_tokens"], written_tokens=b["prompt_tokens"])
    return prices, bill


def _args(mock: MockThread, prices: Path, tasks: Path) -> list[str]:
    return ["run", "--model", MODEL, "--base-url", mock.url, "--max-tokens", "20", "-c", "16", "--prices",
            str(prices), str(tasks)]


def test_writes_no_request_asked_for_keep_the_bill_within_the_cap_and_after_a_resume(tmp_path: Path) -> None:
    """No task marks the cache, and the mock bills every prompt token as written to it (1.25x the input rate):
    the first answer says so, the tasks after it are reserved at the 1-hour write rate, and the bill stays within
    --max-cost 5 ($4.57, 11 answers); the rerun at --max-cost 10 reads it back from the checkpoint and stays
    within that ($9.56, 23). (Not learned: $5.82 of 5, 14 answers; not read back: the rerun $11.22 of 10.)"""
    prices, bill = _priced(tmp_path)
    tasks = lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "messages": [
        {"role": "user", "content": f"Question {i}: " + "tell me more " * 100}]} for i in range(100)])
    run_dir = tmp_path / "t.run"

    with MockThread(MockConfig(latency_ms=5, seed=5, models=(MODEL,), written=1.0, bill=True)) as mock:
        args = _args(mock, prices, tasks)
        first = run_cli(*args, "--max-cost", "5")
        assert first.returncode == 75, first.stderr
        assert 4.0 < bill(mock) <= 5.0, bill(mock)
        budget = summary(run_dir)["budget"]
        assert budget["unasked_cache_writes"] is True
        assert abs(budget["spent"]["cost_usd"] - bill(mock)) < 1e-5  # (the live spend priced the writes)
        again = run_cli(*args, "--max-cost", "10")
        assert again.returncode == 75, again.stderr
        assert 9.0 < bill(mock) <= 10.0, bill(mock)
        assert summary(run_dir)["budget"]["unasked_cache_writes"] is True


def test_a_session_with_no_cap_in_between_does_not_forget_the_writes_no_request_asked_for(tmp_path: Path) -> None:
    """The session with --max-cost learns that every prompt is written to the cache unasked; the next one has no
    cap and answers the rest; the input grows, and a third session with a cap reserves its first tasks at the
    1-hour write rate: the bill of its answers stays within the $4 its cap left ($3.74; without the flag carried
    through the no-cap session its first tasks, reserved at the input rate, were billed $4.57)."""
    prices, bill = _priced(tmp_path)
    objs = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"Question {i}: " + "tell me more " * 100}]}
            for i in range(60)]
    tasks = lines(tmp_path / "t.jsonl", objs[:30])
    run_dir = tmp_path / "t.run"

    with MockThread(MockConfig(latency_ms=5, seed=5, models=(MODEL,), written=1.0, bill=True)) as mock:
        args = _args(mock, prices, tasks)
        first = run_cli(*args, "--max-cost", "2")
        assert first.returncode == 75, first.stderr
        assert summary(run_dir)["budget"]["unasked_cache_writes"] is True
        between = run_cli(*args)
        assert between.returncode == 0, between.stderr
        cp = load_checkpoint(run_dir)
        assert cp is not None and "budget" not in cp.counters and cp.counters["unasked_cache_writes"] is True
        lines(tasks, objs)  # the input grows: the same run, extended
        before = bill(mock)
        third = run_cli(*args, "--max-cost", f"{before + 4:.6f}")
        assert third.returncode == 75, third.stderr
        assert 3.0 < bill(mock) - before <= 4.0 + 1e-9, bill(mock) - before
