"""The live spend is the read-back's (issue 40): an answer's RESULT meta (worker.records.build) carries what it was
billed for (cached and cache-written prompt tokens, its service tier), the budget settles it through
``rundir.usage.answer_cost``, and ``usage_of_results`` reading the same record back from results.jsonl comes to
the same dollars, below what the plain tokens would cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.config.caps import Caps
from evalsup.config.prices import Price
from evalsup.rundir.usage import usage_of_results
from evalsup.supervisor.budget import Amount, Budget, TaskCosts
from evalsup.tasks.billed import Billed, billed, tier_of
from evalsup.tasks.requests import RequestDefaults
from evalsup.worker.client import Outcome
from evalsup.worker.records import Extras, build

FLEX = Price(input=1.0, output=4.0, cached_input=0.1)
PRIORITY = Price(input=5.0, output=20.0, cached_input=0.5)
PRICE = Price(input=2.0, output=8.0, cached_input=0.2, cache_write=2.5,
              variants=((("service_tier", "flex"), FLEX), (("service_tier", "priority"), PRIORITY)))


def outcome(usage: dict[str, Any], tier: str | None = None) -> Outcome:
    body: dict[str, Any] = {"model": "m", "choices": [{"message": {"content": "x"}}], "usage": usage}
    if tier is not None:
        body["service_tier"] = tier
    return Outcome(status=200, body=body, raw_len=100, request_id="r", error=None, attempts=1, latency_s=0.1,
                   parsed=body)


CASES: list[tuple[str, dict[str, Any], str | None, Extras]] = [
    ("cached", {"prompt_tokens": 10_000, "completion_tokens": 300, "prompt_tokens_details": {"cached_tokens": 6_000}},
     None, Extras()),
    ("anthropic cache", {"input_tokens": 1_000, "output_tokens": 200, "cache_read_input_tokens": 7_000,
                         "cache_creation_input_tokens": 2_000}, None, Extras()),
    ("responses", {"input_tokens": 4_000, "output_tokens": 100, "input_tokens_details": {"cached_tokens": 3_000}},
     None, Extras()),
    ("tier named", {"prompt_tokens": 10_000, "completion_tokens": 300}, "flex", Extras()),
    ("tier asked", {"prompt_tokens": 10_000, "completion_tokens": 300}, None, Extras(tier="flex")),
    ("hedged, reasked", {"prompt_tokens": 10_000, "completion_tokens": 300,
                         "prompt_tokens_details": {"cached_tokens": 2_000}}, "priority",
     Extras(hedge=False, reasks=1, reask_usage=(12_000, 310))),
]


@pytest.mark.parametrize(("usage", "tier", "extras"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_budget_settles_an_answer_at_what_a_resume_reads_back(tmp_path: Path, usage: dict[str, Any],
                                                                   tier: str | None, extras: Extras) -> None:
    parts, meta = build("t1", outcome(usage, tier), 7, 0.0, 1, {"index": 0, "url": "u"}, {}, extras=extras)
    orjson.loads(b"".join(parts))  # one record
    (tmp_path / "results.jsonl").write_bytes(b"".join(parts))
    assert len(orjson.dumps(meta)) < 260  # the meta crosses the pipe with every result: a few small fields
    b = Budget(Caps(cost=1e9))
    b.reserve(7, TaskCosts(RequestDefaults(model="m"), lambda _m: PRICE).worst(
        {"messages": [{"role": "user", "content": "hi"}]})[0], PRICE)
    b.settle_result(7, meta)
    back = usage_of_results(tmp_path / "results.jsonl", lambda m: PRICE if m == "m" else None)
    assert b.spent_cost == pytest.approx(back.cost, rel=1e-12)
    assert (b.spent_prompt, b.spent_completion) == (back.prompt_tokens, back.completion_tokens)
    plain = PRICE.cost(b.spent_prompt, b.spent_completion)
    if tier == "priority":
        assert b.spent_cost > plain  # a dearer tier, even with most of the prompt cached
    else:
        assert b.spent_cost < plain  # the cache's rate or the cheaper tier, not the full input rate


def test_what_an_answer_was_billed_for_in_each_shape() -> None:
    assert billed({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 60}}) \
        == Billed(100, 5, 60, 0)
    # Anthropic's input_tokens are the uncached part: every prompt token counts
    assert billed({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 60,
                   "cache_creation_input_tokens": 30}) == Billed(100, 5, 60, 30)
    # an OpenAI-shaped gateway in front of Anthropic (LiteLLM's proxy) counts them in prompt_tokens already
    assert billed({"prompt_tokens": 100, "completion_tokens": 5, "cache_read_input_tokens": 60,
                   "cache_creation_input_tokens": 30}) == Billed(100, 5, 60, 30)
    assert billed({"input_tokens": 40, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 90}}) \
        == Billed(40, 2, 40, 0)  # never more cached than the prompt
    assert billed({"prompt_tokens": 1.5, "completion_tokens": True}) == Billed()  # not counts: nothing
    assert billed(None) == billed([1]) == Billed()
    assert tier_of({"service_tier": "flex"}) == "flex" and tier_of({"service_tier": 3}) is None


def test_a_request_for_a_dearer_tier_is_reserved_at_its_rates() -> None:
    costs = TaskCosts(RequestDefaults(model="m", max_tokens=100), lambda _m: PRICE)
    body = {"messages": [{"role": "user", "content": "x" * 4000}]}

    def task(**more: str) -> dict[str, Any]:  # the batch form: a simple line's other keys are its metadata
        return {"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": {**body, **more}}

    plain = costs.worst(task())[0]
    dear = costs.worst(task(service_tier="priority"))[0]
    cheap = costs.worst(task(service_tier="flex"))[0]
    assert costs.worst({**body, "service_tier": "priority"})[0] == plain  # metadata, never sent
    assert dear.cost is not None and plain.cost is not None and dear.cost > plain.cost
    assert cheap == plain  # never below the standard rates: the response may name another tier
    b = Budget(Caps(cost=1e9))
    b.reserve(1, dear, PRICE)
    _, meta = build("t", outcome({"prompt_tokens": dear.prompt, "completion_tokens": dear.completion}, "priority"),
                    1, 0.0, 1, None, {})
    b.settle_result(1, meta)
    assert b.spent_cost <= dear.cost + 1e-12  # the worst case held the tier's answer


def test_a_long_prompt_rate_applies_by_request_to_a_hedged_and_reasked_task(tmp_path: Path) -> None:
    """A hedge's two copies and the re-asks are requests of their own: a long-prompt rate (past 200k tokens here)
    applies to none of them when each prompt is below it, though their sums are above, live and read back."""
    long = Price(input=2.0, output=8.0, over=((200_000, Price(input=4.0, output=16.0)),))
    usage = {"prompt_tokens": 150_000, "completion_tokens": 1_000}
    parts, meta = build("t1", outcome(usage), 3, 0.0, 1, None, {},
                        extras=Extras(hedge=True, reasks=2, reask_usage=(300_000, 2_000)))
    (tmp_path / "results.jsonl").write_bytes(b"".join(parts))
    b = Budget(Caps(cost=1e9))
    b.reserve(3, Amount(10**6, 10**4, 100.0), long)  # (what it reserved does not matter: its price does)
    b.settle_result(3, meta)
    back = usage_of_results(tmp_path / "results.jsonl", lambda m: long if m == "m" else None)
    want = 2 * long.cost(150_000, 1_000) + long.cost(300_000, 2_000, requests=2)
    assert b.spent_cost == pytest.approx(want) and back.cost == pytest.approx(want)
    assert want < long.cost(600_000, 4_000)  # (the sums at the long-prompt rates)


def test_a_prompt_written_to_the_providers_cache_never_settles_above_its_reservation() -> None:
    """Anthropic bills a prompt written to its cache at 1.25x the input rate: the reservation takes the dearer
    rate, so a task whose whole prompt is written settles within it (a cap is never passed by cache writes)."""
    costs = TaskCosts(RequestDefaults(model="m", max_tokens=100), lambda _m: PRICE)
    worst = costs.worst({"id": "t", "messages": [{"role": "user", "content": "x" * 4000}]})[0]
    assert worst.cost is not None
    b = Budget(Caps(cost=1e9))
    b.reserve(1, worst, PRICE)
    usage = {"input_tokens": 0, "cache_creation_input_tokens": worst.prompt, "output_tokens": worst.completion}
    _, meta = build("t", outcome(usage), 1, 0.0, 1, None, {})
    b.settle_result(1, meta)
    assert b.spent_cost > PRICE.cost(worst.prompt, worst.completion)  # the writes were dearer than plain input
    assert b.spent_cost <= worst.cost + 1e-12
