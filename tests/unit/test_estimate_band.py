"""The estimate's maths (issue 30, tasks.tokens): a line's figures, the low / expected / high band, the lengths
seen, the cost, and a model with no price said, never free."""

from __future__ import annotations

import pytest

from evalsup.config.prices import load_prices
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import DEFAULT_MAX_OUTPUT, EXPECTED_FRACTION, Tally, figures, one_line

D = RequestDefaults(model="gpt-4o-mini", max_tokens=100)


def test_figures_of_each_form() -> None:
    f = figures({"id": "a", "messages": [{"role": "user", "content": "x" * 40}]}, D)
    assert (f.model, f.prompt_chars, f.messages, f.max_tokens, f.choices) == ("gpt-4o-mini", 40, 1, 100, 1)
    assert f.approx_prompt == 10 + 4
    b = figures({"custom_id": "b", "url": "/v1/chat/completions", "body": {
        "model": "gpt-4o", "n": 3, "max_completion_tokens": 7,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}]}]}}, D)
    assert (b.model, b.prompt_chars, b.max_tokens, b.choices, b.max_completion(None)) == ("gpt-4o", 4, 7, 3, 21)
    e = figures({"custom_id": "e", "url": "/v1/embeddings", "body": {"input": ["ab", "cd"]}}, D)
    assert (e.prompt_chars, e.choices, e.max_completion(None)) == (4, 0, 0)  # embeddings generate nothing
    p = figures({"id": "p", "prompt": "hello"}, RequestDefaults())
    assert (p.model, p.max_tokens, p.max_completion(None), p.max_completion(500)) == \
        (None, None, DEFAULT_MAX_OUTPUT, 500)  # no max_tokens: the model's largest answer, else the default


def test_band_without_answers_seen() -> None:
    t = Tally()
    prices = load_prices()
    for _ in range(10):
        t.add(figures({"id": "a", "messages": [{"role": "user", "content": "x" * 400}]}, D), None, 120)
    s = t.summary(prices.lookup)
    assert s["requests"] == 10 and s["prompt_tokens"] == {"low": 1200, "expected": 1200, "high": 1200}
    assert s["prompt_tokens_counted"] == "endpoint"
    assert s["completion_tokens"] == {"low": 0, "expected": round(1000 * EXPECTED_FRACTION), "high": 1000}
    p = prices.lookup("gpt-4o-mini")
    assert p is not None
    assert s["cost_usd"]["high"] == pytest.approx(round(p.cost(1200, 1000), 4))
    assert s["cost_usd"]["low"] == pytest.approx(round(p.cost(1200, 0), 4)) and s["cost_complete"]


def test_band_with_answers_seen_and_the_approx_prompt() -> None:
    t = Tally(seen=(5.0, 20.0))
    t.add(figures({"id": "a", "messages": [{"role": "user", "content": "x" * 300}]}, D), None)
    s = t.summary(load_prices().lookup)
    assert s["completion_tokens"] == {"low": 5, "expected": 20, "high": 100}
    p = s["prompt_tokens"]
    assert p["low"] < p["expected"] == 75 + 4 < p["high"] and s["prompt_tokens_counted"] == "approx chars/4"
    assert "prompts ≈ 79 tokens in all (characters / 4)" in one_line(s)
    half = t.scaled(0.5).summary(load_prices().lookup)
    assert half["completion_tokens"]["high"] == 50


def test_a_model_with_no_price_is_said_and_not_counted_free() -> None:
    t = Tally()
    t.add(figures({"id": "a", "prompt": "x" * 40}, RequestDefaults(model="mock-model", max_tokens=10)), None)
    t.add(figures({"id": "b", "prompt": "x" * 40}, D), None)
    s = t.summary(load_prices().lookup)
    assert s["unpriced"] == ["mock-model"] and not s["cost_complete"]
    assert s["models"]["mock-model"]["cost_usd"] is None
    assert "unknown cost of mock-model" in one_line(s)
    only = Tally()
    only.add(figures({"id": "a", "prompt": "x"}, RequestDefaults(model="mock-model")), None)
    assert "cost unknown: no price for mock-model" in one_line(only.summary(load_prices().lookup))
