"""A run's live spend is priced as the provider billed it (issue 40): the mock reports part of each prompt as
read from its cache (``prompt_tokens_details.cached_tokens``) or echoes the service tier the task asked, the
price knows a cached-input or a tier's rate, and the spend summary.json says at the end of the run is the one a
resume reads back from results.jsonl (``rundir.usage``), below what the plain tokens would cost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evalsup.config.prices import Price, load_prices
from evalsup.mock.server import MockConfig, MockThread
from evalsup.rundir.usage import usage_of_results
from tests.harness import assert_exactly_once, ids_of, lines, run_cli, summary

PRICE = Price(input=1000.0, output=2000.0, cached_input=100.0)  # USD per million tokens


def _tasks(tmp_path: Path, n: int) -> Path:
    return lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "messages": [
        {"role": "user", "content": f"Question {i}: " + "tell me more " * (10 + i % 7)}]} for i in range(n)])


def _spent(run_dir: Path) -> dict[str, Any]:
    spent: dict[str, Any] = summary(run_dir)["budget"]["spent"]
    return spent


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_cached_prompt_tokens_are_spent_at_their_rate_as_the_read_back_prices_them(tmp_path: Path,
                                                                                   stream: bool) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"mock-model": {"input": PRICE.input, "output": PRICE.output,
                                                 "cached_input": PRICE.cached_input}}))
    n = 60
    tasks = _tasks(tmp_path, n)
    run_dir = tmp_path / "t.run"
    with MockThread(MockConfig(latency_ms=5, cached=0.75, seed=3)) as mock:
        args = ["run", "--model", "mock-model", "--base-url", mock.url, "--max-tokens", "40", "-c", "8", "--prices",
                str(prices), "--max-cost", "1000", *(["--stream"] if stream else []), str(tasks)]
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        recs = assert_exactly_once(run_dir, ids_of(n))
        live = _spent(run_dir)
        back = usage_of_results(run_dir / "results.jsonl", load_prices(prices).lookup, "mock-model")
        assert live["cost_usd"] == pytest.approx(back.cost, abs=1e-6)  # summary.json rounds to 6 digits
        assert (live["prompt_tokens"], live["completion_tokens"]) == (back.prompt_tokens, back.completion_tokens)
        cached = sum(x["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"] for x in recs)
        assert cached > back.prompt_tokens // 2  # the mock's share, so the test can tell
        plain = PRICE.cost(back.prompt_tokens, back.completion_tokens)
        assert back.cost < plain and live["cost_usd"] < plain  # the cached part at its rate, not the input's
        st = run_cli("status", str(run_dir), "--json")
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["budget"]["spent"] == live  # evalsup status says the same
        # a resume (all done: nothing sent) starts its budget from the read-back: the same figure
        again = run_cli(*args)
        assert again.returncode == 0, again.stderr
        assert _spent(run_dir)["cost_usd"] == live["cost_usd"]


def test_a_flex_task_is_spent_at_the_flex_rates(tmp_path: Path) -> None:
    """genai-prices prices o3's flex tier below its standard rates: the mock echoes the tier the task asks, as
    OpenAI does, and the live spend is at the tier's rates, as the read-back's."""
    pytest.importorskip("genai_prices")
    p = load_prices().lookup("o3")
    if p is None or p.variant("flex") is p:
        pytest.skip("the installed genai-prices has no flex rate for o3")
    n = 30
    tasks = lines(tmp_path / "t.jsonl", [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
                                          "body": {"messages": [{"role": "user", "content": f"Question {i}"}],
                                                   "service_tier": "flex"}} for i in range(n)])
    run_dir = tmp_path / "t.run"
    with MockThread(MockConfig(latency_ms=5, seed=4, models=("o3",))) as mock:
        r = run_cli("run", "--model", "o3", "--base-url", mock.url, "--max-tokens", "40", "-c", "8", "--max-cost",
                    "100", str(tasks))
        assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["response"]["body"]["service_tier"] == "flex" for x in recs)
    live = _spent(run_dir)
    back = usage_of_results(run_dir / "results.jsonl", load_prices().lookup, "o3")
    assert live["cost_usd"] == pytest.approx(back.cost, abs=1e-6)
    flex = p.variant("flex").cost(back.prompt_tokens, back.completion_tokens)
    standard = p.cost(back.prompt_tokens, back.completion_tokens)
    assert back.cost == pytest.approx(flex) and flex < standard


def test_an_answer_is_spent_at_the_snapshot_its_response_names_live_after_a_resume_and_in_summary(
        tmp_path: Path) -> None:
    """A provider answers a request for ``gpt-4o`` as ``gpt-4o-2024-05-13`` and bills it at that snapshot's
    rates: the live spend, a resume's read-back of results.jsonl and summary.json all price it so (before, the
    live budget priced the request's model and the read-back the response's: two figures for one run)."""
    prices = tmp_path / "prices.json"
    alias, snapshot = Price(input=500.0, output=1500.0), Price(input=1000.0, output=3000.0)
    prices.write_text(json.dumps({"gpt-4o": {"input": alias.input, "output": alias.output},
                                  "gpt-4o-2024-05-13": {"input": snapshot.input, "output": snapshot.output}}))
    n = 40
    tasks = _tasks(tmp_path, n)
    run_dir = tmp_path / "t.run"
    with MockThread(MockConfig(latency_ms=5, seed=5, models=("gpt-4o",), snapshot="-2024-05-13")) as mock:
        args = ["run", "--model", "gpt-4o", "--base-url", mock.url, "--max-tokens", "40", "-c", "8", "--prices",
                str(prices), "--max-cost", "1000", str(tasks)]
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        recs = assert_exactly_once(run_dir, ids_of(n))
        assert {x["response"]["body"]["model"] for x in recs} == {"gpt-4o-2024-05-13"}
        live = _spent(run_dir)
        back = usage_of_results(run_dir / "results.jsonl", load_prices(prices).lookup, "gpt-4o")
        assert live["cost_usd"] == pytest.approx(back.cost, abs=1e-6)
        assert back.cost == pytest.approx(snapshot.cost(back.prompt_tokens, back.completion_tokens))
        assert back.cost > 1.9 * alias.cost(back.prompt_tokens, back.completion_tokens)  # not the alias's rates
        assert summary(run_dir)["prices"]["by_model"]["gpt-4o-2024-05-13"] == str(prices)
        again = run_cli(*args)  # all done: nothing sent; its budget starts from the read-back
        assert again.returncode == 0, again.stderr
        assert _spent(run_dir)["cost_usd"] == live["cost_usd"]


def test_a_cost_cap_holds_at_the_server_when_answers_are_billed_as_a_dearer_snapshot_and_after_a_resume(
        tmp_path: Path) -> None:
    """Every request for ``gpt-4o`` answered, and billed, as ``gpt-4o-2024-05-13`` at twice the alias's rates: the
    first task goes alone, its answer names the snapshot, and the tasks after it reserve at the snapshot's
    rates, so the bill at the mock stays within --max-cost; the rerun with a higher cap reads the snapshot back
    from results.jsonl and stays within that too (before: the first wave reserved at the alias's rates and the
    bill passed the cap, and a resume started over at them)."""
    prices = tmp_path / "prices.json"
    alias, snapshot = Price(input=500.0, output=1500.0), Price(input=1000.0, output=3000.0)
    prices.write_text(json.dumps({"gpt-4o": {"input": alias.input, "output": alias.output},
                                  "gpt-4o-2024-05-13": {"input": snapshot.input, "output": snapshot.output}}))
    tasks = _tasks(tmp_path, 200)
    run_dir = tmp_path / "t.run"

    def bill(mock: MockThread) -> float:
        b = mock.stats()["billed"]["gpt-4o-2024-05-13"]
        return snapshot.cost(b["prompt_tokens"], b["completion_tokens"])

    with MockThread(MockConfig(latency_ms=5, seed=5, models=("gpt-4o",), snapshot="-2024-05-13", bill=True)) as mock:
        args = ["run", "--model", "gpt-4o", "--base-url", mock.url, "--max-tokens", "40", "-c", "16", "--prices",
                str(prices), str(tasks)]
        first = run_cli(*args, "--max-cost", "2")
        assert first.returncode == 75, first.stderr
        assert summary(run_dir)["exit_reason"] == "budget"
        assert 1.5 < bill(mock) <= 2.0
        again = run_cli(*args, "--max-cost", "5")
        assert again.returncode == 75, again.stderr
        assert 4.5 < bill(mock) <= 5.0
        assert _spent(run_dir)["cost_usd"] == pytest.approx(bill(mock), abs=1e-5)
