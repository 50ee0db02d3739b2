"""What bounds an estimate (issue 40): a request without max_tokens is bounded by the model's largest answer or
its context window, or said to be unbounded ("set --max-tokens") with no made-up figure; lengths learnt after
the pass (a resume's answers read back) band every request and are labelled as seen; the line reads as a
sentence."""

from __future__ import annotations

from pathlib import Path

import orjson

from evalsup.config.prices import Price, PriceTable, load_prices
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import Tally, figures, one_line, start_line
from evalsup.tools.estimate import estimate, estimate_text

PRICES = PriceTable({"known-max": Price(1.0, 2.0, None, 1000, "t"), "known-context": Price(1.0, 2.0, None, None,
                                                                                             "t", None, 8000),
                     "no-bound": Price(1.0, 2.0, None, None, "t")}, "2025-06-15", maintained=False)


def tally(model: str, n: int = 10, seen: tuple[float, float] | None = None, max_tokens: int | None = None) -> Tally:
    t = Tally(seen=seen)
    for i in range(n):
        f = figures({"id": str(i), "messages": [{"role": "user", "content": "x" * 40}]},
                    RequestDefaults(model=model, max_tokens=max_tokens))
        p = PRICES.lookup(f.model)
        t.add(f, p.completion_bound if p is not None else None)
    return t


def test_the_models_largest_answer_then_its_context_bound_a_request_without_max_tokens() -> None:
    s = tally("known-max").summary(PRICES.lookup)
    assert s["completion_tokens"]["high"] == 10 * 1000 and s["unbounded"] == []
    s = tally("known-context").summary(PRICES.lookup)
    assert s["completion_tokens"]["high"] == 10 * 8000 and s["cost_usd"]["high"] is not None
    # half of a model's largest answer is no estimate of an answer: no expected figure until answers are seen
    assert s["completion_tokens"]["expected"] is None and s["cost_usd"]["expected"] is None
    line = one_line(s)
    assert "answers at most 80,000 tokens in all, their length unknown until some are seen (10 request(s) " \
           "without max_tokens, bounded only by the model's largest answer or context" in line
    assert "expected" not in line.split("; cost")[1]
    seen = tally("known-context", seen=(4.0, 9.0)).summary(PRICES.lookup)
    assert seen["completion_tokens"] == {"low": 40, "expected": 90, "high": 80_000}


def test_nothing_bounds_it_no_figure_is_made_up() -> None:
    s = tally("no-bound").summary(PRICES.lookup)
    assert s["completion_tokens"]["high"] is None and s["completion_tokens"]["expected"] is None
    assert s["cost_usd"]["high"] is None and s["cost_usd"]["low"] > 0  # the prompt is still paid for
    assert s["unbounded"] == ["no-bound"] and s["models"]["no-bound"]["unbounded"] == 10
    line = one_line(s)
    assert "answers of unknown length: 10 request(s) of no-bound have no max_tokens" in line
    assert "unbounded: set --max-tokens" in line and "cost at least $" in line and "no upper bound" in line
    # a max_tokens given bounds it again
    s = tally("no-bound", max_tokens=50).summary(PRICES.lookup)
    assert s["completion_tokens"] == {"low": 0, "expected": 250, "high": 500} and s["unbounded"] == []


def test_with_answers_seen_an_unbounded_request_has_an_expected_length_and_still_no_high_end() -> None:
    s = tally("no-bound", seen=(2.0, 6.0)).summary(PRICES.lookup)
    assert s["completion_tokens"] == {"low": 20, "expected": 60, "high": None}
    assert "≈ 60 tokens in all (the mean length of the answers seen so far), with no upper bound" in one_line(s)


def test_lengths_learnt_after_the_pass_band_every_request_and_are_called_seen() -> None:
    """A resume reads its answers back after the pre-scan has counted the lines: the band must be made with them
    (the start line once called half of max_tokens 'seen': 50,560 tokens where the answers were 4,916)."""
    before = tally("known-max", n=4, max_tokens=100)
    assert before.summary(PRICES.lookup)["completion_tokens"] == {"low": 0, "expected": 200, "high": 400}
    before.seen = (3.0, 5.0)  # what results.jsonl says, learnt after the pass
    s = before.summary(PRICES.lookup)
    assert s["completion_tokens"] == {"low": 12, "expected": 20, "high": 400}
    assert s["completion_from"] == "seen" and "(the mean length of the answers seen so far)" in one_line(s)
    # the same as a tally that knew the lengths from the start (evalsup estimate of the same run)
    assert tally("known-max", n=4, max_tokens=100, seen=(3.0, 5.0)).summary(PRICES.lookup) == s
    half = before.scaled(0.5).summary(PRICES.lookup)
    assert half["completion_tokens"] == {"low": 6, "expected": 10, "high": 200}


def test_the_start_line_names_the_prices_and_is_quiet_about_them_when_nothing_is_paid() -> None:
    s = tally("known-max", max_tokens=10).summary(PRICES.lookup)
    line = start_line(s, "this run", "genai-prices 9.9 (latest price change 2026-12-01)")
    assert line.startswith("estimate for this run: 10 requests; prompts ≈ ")
    assert "answers at most 100 tokens in all, ≈ 50 expected (half of max_tokens: no answer seen yet)" in line
    assert ". Prices: genai-prices 9.9 (latest price change 2026-12-01). `evalsup estimate --base-url URL`" in line
    free = PriceTable({}, "x", self_hosted=True)
    t = Tally()
    t.add(figures({"id": "a", "prompt": "hi"}, RequestDefaults(model="m", max_tokens=8)), None)
    line = start_line(t.summary(free.lookup), "this run", free.describe())
    assert line.endswith("; no cost.") and "Prices" not in line


def test_evalsup_estimate_of_a_file_without_max_tokens(tmp_path: Path) -> None:
    """`evalsup estimate` of tasks with no max_tokens: a known model's requests bounded by its largest answer,
    an unknown one's said unbounded, by model, and the prices' sources named."""
    tasks = tmp_path / "t.jsonl"
    hello = [{"role": "user", "content": "Say hello."}]  # each task names its model: the batch form's body
    tasks.write_bytes(b"".join(orjson.dumps({"custom_id": f"{m}-{i}", "method": "POST", "url": "/v1/chat/completions",
                                             "body": {"model": m, "messages": hello}}) + b"\n"
                               for m in ("gpt-4o-mini", "my-model") for i in range(5)))
    table = load_prices(maintained=False)
    s = estimate(tasks, table, RequestDefaults())
    known, mine = s["models"]["gpt-4o-mini"], s["models"]["my-model"]
    assert known["completion_tokens"]["high"] == 5 * 16384 and "unbounded" not in known  # its largest answer
    assert mine["unbounded"] == 5 and mine["completion_tokens"]["high"] is None
    assert s["completion_tokens"]["high"] is None and s["unbounded"] == ["my-model"]
    assert s["price_sources"]["by_model"] == {"gpt-4o-mini": f"evalsup table {table.as_of}", "my-model": "no price"}
    text = estimate_text(s)
    assert "5 request(s) of my-model have no max_tokens and no known limit (unbounded: set --max-tokens)" in text
    assert "my-model: 5 requests;" in text and "completion 0/?/?" in text and "unbounded, set --max-tokens" in text
    assert "plus the unknown cost of my-model (no price)" in text
