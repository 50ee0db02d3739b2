"""The live spend is the read-back's (issue 40): an answer's RESULT meta (worker.records.build) carries what it was
billed for (cached and cache-written prompt tokens, its service tier), the budget settles it through
``rundir.usage.answer_cost``, and ``usage_of_results`` reading the same record back from results.jsonl comes to
the same dollars, below what the plain tokens would cost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.batch.records import Answer
from evalsup.batch.records import build as batch_build
from evalsup.config.caps import Caps
from evalsup.config.prices import Price, load_prices
from evalsup.rundir.usage import billed_price, usage_of_results
from evalsup.supervisor.budget import Amount, Budget, TaskCosts, Verdict
from evalsup.tasks.billed import Billed, billed, tier_of
from evalsup.tasks.requests import RequestDefaults, to_request
from evalsup.tasks.tokens import figures
from evalsup.worker.client import Outcome
from evalsup.worker.records import Extras, build

FLEX = Price(input=1.0, output=4.0, cached_input=0.1)
PRIORITY = Price(input=5.0, output=20.0, cached_input=0.5)
PRICE = Price(input=2.0, output=8.0, cached_input=0.2, cache_write=2.5, cache_write_1h=4.0,
              variants=((("service_tier", "flex"), FLEX), (("service_tier", "priority"), PRIORITY)))


def outcome(usage: dict[str, Any], tier: str | None = None, model: str | None = "m") -> Outcome:
    body: dict[str, Any] = {"choices": [{"message": {"content": "x"}}], "usage": usage}
    if model is not None:
        body["model"] = model
    if tier is not None:
        body["service_tier"] = tier
    return Outcome(status=200, body=body, raw_len=100, request_id="r", error=None, attempts=1, latency_s=0.1,
                   parsed=body)


CASES: list[tuple[str, dict[str, Any], str | None, Extras]] = [
    ("cached", {"prompt_tokens": 10_000, "completion_tokens": 300, "prompt_tokens_details": {"cached_tokens": 6_000}},
     None, Extras()),
    ("anthropic cache", {"input_tokens": 1_000, "output_tokens": 200, "cache_read_input_tokens": 7_000,
                         "cache_creation_input_tokens": 2_000}, None, Extras()),
    # Anthropic's writes by how long they are kept (its Messages API's usage as it comes)
    ("anthropic 1h writes", {"input_tokens": 21, "cache_creation_input_tokens": 3_051, "cache_read_input_tokens": 0,
                             "cache_creation": {"ephemeral_5m_input_tokens": 1_000, "ephemeral_1h_input_tokens": 2_051},
                             "output_tokens": 393, "service_tier": "standard"}, None, Extras()),
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
    elif "cache_creation" in usage:
        assert b.spent_cost > plain  # the prompt written to the cache, 2,051 tokens of it for an hour: dearer
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


def test_anthropic_1h_cache_writes_are_read_apart_in_each_shape() -> None:
    """Anthropic's usage says how long each written prompt token is kept (``cache_creation``): the 1-hour ones are
    a part of the writes, priced at their own rate."""
    native = {"input_tokens": 21, "cache_creation_input_tokens": 2_051, "cache_read_input_tokens": 0,
              "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 2_051},
              "output_tokens": 393}
    assert billed(native) == Billed(2_072, 393, 0, 2_051, 2_051)
    mixed = {"input_tokens": 50, "cache_read_input_tokens": 4_000, "cache_creation_input_tokens": 1_500,
             "cache_creation": {"ephemeral_5m_input_tokens": 1_000, "ephemeral_1h_input_tokens": 500},
             "output_tokens": 20}
    assert billed(mixed) == Billed(5_550, 20, 4_000, 1_500, 500)
    # the split without its total (or a total below its parts): the parts are the writes
    assert billed({"input_tokens": 10, "output_tokens": 1, "cache_creation": {
        "ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 60}}) == Billed(100, 1, 0, 90, 60)
    # an OpenAI-shaped gateway passing Anthropic's keys on: its prompt_tokens has them already
    assert billed({"prompt_tokens": 5_550, "completion_tokens": 20, "cache_read_input_tokens": 4_000,
                   "cache_creation_input_tokens": 1_500, "cache_creation": mixed["cache_creation"]}) \
        == Billed(5_550, 20, 4_000, 1_500, 500)
    # without the split (an older API version): every write is the 5-minute kind, as before
    assert billed({"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 30}) \
        == Billed(40, 1, 0, 30, 0)
    assert PRICE.cost(5_550, 20, 4_000, 1_500, written_1h_tokens=500) == pytest.approx(
        (50 * 2.0 + 4_000 * 0.2 + 1_000 * 2.5 + 500 * 4.0 + 20 * 8.0) / 1e6)
    # a price with no 1-hour rate prices them as the other writes
    plain = Price(input=2.0, output=8.0, cache_write=2.5)
    assert plain.cost(1_000, 0, 0, 1_000, written_1h_tokens=600) == plain.cost(1_000, 0, 0, 1_000)


def test_a_prompt_written_for_an_hour_never_settles_above_its_reservation() -> None:
    """A 1-hour write is the dearest rate a prompt token may be billed at (2x input at Anthropic): the reservation
    takes it, so a task whose whole prompt is written for an hour settles within it."""
    costs = TaskCosts(RequestDefaults(model="m", max_tokens=100), lambda _m: PRICE)
    worst = costs.worst({"id": "t", "messages": [{"role": "user", "content": "x" * 4000}]})[0]
    assert worst.cost is not None
    b = Budget(Caps(cost=1e9))
    b.reserve(1, worst, PRICE)
    usage = {"input_tokens": 0, "cache_creation_input_tokens": worst.prompt, "output_tokens": worst.completion,
             "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": worst.prompt}}
    _, meta = build("t", outcome(usage), 1, 0.0, 1, None, {})
    assert meta["w1"] == worst.prompt
    b.settle_result(1, meta)
    five = PRICE.cost(worst.prompt, worst.completion, written_tokens=worst.prompt)
    assert b.spent_cost > five  # dearer than the same prompt written for 5 minutes
    assert b.spent_cost == pytest.approx(worst.cost)  # the reservation is exactly this worst case


ALIAS = Price(input=2.5, output=10.0)
SNAPSHOT = Price(input=5.0, output=15.0)  # a dated snapshot dearer than its alias (gpt-4o-2024-05-13's rates)
CHEAPER = Price(input=3.0, output=12.0)  # another snapshot, dearer than the alias, cheaper than the first
PRICES = {"gpt-4o": ALIAS, "gpt-4o-2024-05-13": SNAPSHOT, "gpt-4o-2024-08-06": CHEAPER, "other": FLEX}


def price_of(model: str | None) -> Price | None:
    return PRICES.get(model or "")


@pytest.mark.parametrize(("answered", "want"), [("gpt-4o-2024-05-13", SNAPSHOT), ("gpt-4o-unpriced-snapshot", ALIAS),
                                                ("gpt-4o", ALIAS), (None, ALIAS)])
def test_an_answer_is_priced_by_the_model_its_response_names_live_and_read_back(
        tmp_path: Path, answered: str | None, want: Price) -> None:
    """A provider bills the snapshot that answered (request gpt-4o, response gpt-4o-2024-05-13): the live budget
    and a resume's read-back both price by the response's model when it has a price, else by the request's."""
    usage = {"prompt_tokens": 1_000, "completion_tokens": 200}
    parts, meta = build("t1", outcome(usage, model=answered), 7, 0.0, 1, None, {}, extras=Extras(model="gpt-4o"))
    assert ("md" in meta) == (answered not in ("gpt-4o", None))  # sent only when it differs from the request's
    (tmp_path / "results.jsonl").write_bytes(b"".join(parts))
    costs = TaskCosts(RequestDefaults(model="gpt-4o", max_tokens=300), price_of)
    b = Budget(Caps(cost=1e9), price_of=price_of)
    assert b.afford(7, *costs.worst({"id": "t1", "messages": [{"role": "user", "content": "hi"}]})).verdict.value \
        == "go"
    b.settle_result(7, meta)
    back = usage_of_results(tmp_path / "results.jsonl", price_of, "gpt-4o")
    assert b.spent_cost == pytest.approx(back.cost, rel=1e-12) == pytest.approx(want.cost(1_000, 200))


def test_once_a_model_answered_as_a_dearer_snapshot_its_tasks_reserve_at_the_snapshots_rates() -> None:
    """The reservation holds what a task may settle at: after one answer names the dearer snapshot, the next
    tasks asking the alias reserve at the snapshot's price, and settle within it."""
    costs = TaskCosts(RequestDefaults(model="gpt-4o", max_tokens=300), price_of)
    b = Budget(Caps(cost=1e9), price_of=price_of)
    costs.learned = b.learned
    task = {"id": "t", "messages": [{"role": "user", "content": "x" * 400}]}
    before, _, _ = costs.worst(task)
    assert b.afford(1, before, ALIAS, "gpt-4o").verdict.value == "go"
    _, meta = build("t", outcome({"prompt_tokens": 100, "completion_tokens": 300}, model="gpt-4o-2024-05-13"), 1,
                    0.0, 1, None, {}, extras=Extras(model="gpt-4o"))
    b.settle_result(1, meta)
    assert b.answered_as == {"gpt-4o": "gpt-4o-2024-05-13"}
    after, price, _ = costs.worst(task)
    assert before.cost is not None and after.cost is not None
    assert after.cost == pytest.approx(SNAPSHOT.cost(after.prompt, after.completion))
    assert after.cost > before.cost
    assert price is ALIAS  # (the request's price stays the reservation's: an unpriced answer settles at it)


def test_a_tasks_own_model_prices_its_answer_when_the_response_names_none_with_a_price(tmp_path: Path) -> None:
    """A task that names its own model (not the run's --model): its record keeps it (metrics.model), so a resume
    prices an answer whose response names no priced model by it, as the live budget did."""
    usage = {"prompt_tokens": 1_000, "completion_tokens": 200}
    parts, meta = build("t1", outcome(usage, model="served-as-something"), 7, 0.0, 1, None, {},
                        extras=Extras(model="other", own_model=True))
    rec = orjson.loads(b"".join(parts))
    assert rec["metrics"]["model"] == "other"
    (tmp_path / "results.jsonl").write_bytes(b"".join(parts))
    b = Budget(Caps(cost=1e9), price_of=price_of)
    b.reserve(7, Amount(10**4, 10**4, 1.0), FLEX, "other")
    b.settle_result(7, meta)
    back = usage_of_results(tmp_path / "results.jsonl", price_of, "gpt-4o")  # the run's --model: not this task's
    assert b.spent_cost == pytest.approx(back.cost) == pytest.approx(FLEX.cost(1_000, 200))
    _, same = build("t2", outcome(usage, model="gpt-4o"), 8, 0.0, 1, None, {}, extras=Extras(model="gpt-4o"))
    assert "md" not in same  # the usual answer, naming the model asked, adds nothing to the meta


def test_a_price_the_user_gave_for_the_model_asked_wins_over_a_tables_for_the_snapshot(tmp_path: Path) -> None:
    """--prices FILE says what the user pays for the model they ask (a gateway's alias, a negotiated rate): an
    answer naming a snapshot that only another source prices is spent at the user's price; a price they gave
    for the snapshot itself is the snapshot's."""
    f = tmp_path / "p.json"
    f.write_text('{"my-sonnet": {"input": 1, "output": 2}, "gpt-4o-2024-05-13": {"input": 7, "output": 9}}')
    table = load_prices(f, maintained=False)
    theirs = table.lookup("claude-sonnet-4-20250514")  # the shipped table's
    mine = table.lookup("my-sonnet")
    assert theirs is not None and mine is not None and mine.given and not theirs.given
    assert billed_price(table.lookup, "claude-sonnet-4-20250514", "my-sonnet") is mine
    assert billed_price(table.lookup, "gpt-4o-2024-05-13", "gpt-4o") == Price(7.0, 9.0, source=str(f))
    assert billed_price(table.lookup, "claude-sonnet-4-20250514", "unpriced-alias") is theirs
    assert billed_price(table.lookup, "unpriced-snapshot", "my-sonnet") is mine
    assert billed_price(table.lookup, None, None) is None


def test_a_simple_lines_model_and_max_tokens_are_metadata_and_the_budget_prices_what_is_sent(tmp_path: Path) -> None:
    """A simple line's other keys are its record's metadata (README, docs/cli.md), ``model`` and ``max_tokens``
    too: the request asks the run's --model with --max-tokens, so its reservation and the estimate are of that
    request, and the answer settles within it at what a resume reads back (not at the metadata's cheap model)."""
    defaults = RequestDefaults(model="gpt-4o", max_tokens=2_000)
    line = {"id": "t1", "prompt": "Write an essay.", "model": "other", "max_tokens": 5, "n": 3}
    _, body, metadata = to_request(line, defaults)
    assert (body["model"], body["max_tokens"], "n" in body) == ("gpt-4o", 2_000, False)
    assert metadata == {"model": "other", "max_tokens": 5, "n": 3}
    f = figures(line, defaults)
    assert (f.model, f.max_tokens, f.choices) == ("gpt-4o", 2_000, 1)
    assert f == figures({"id": "t1", "messages": body["messages"]}, defaults)  # the same request, the same figures
    worst, price, model = TaskCosts(defaults, price_of).worst(line)
    assert (model, price, worst.completion) == ("gpt-4o", ALIAS, 2_000)
    b = Budget(Caps(cost=1e9), price_of=price_of)
    assert b.afford(1, worst, price, model).verdict.value == "go"
    usage = {"prompt_tokens": worst.prompt, "completion_tokens": 2_000}  # the whole --max-tokens used
    parts, meta = build("t1", outcome(usage, model="gpt-4o"), 1, 0.0, 1, None, metadata,
                        extras=Extras(model=body["model"]))
    b.settle_result(1, meta)
    (tmp_path / "results.jsonl").write_bytes(b"".join(parts))
    back = usage_of_results(tmp_path / "results.jsonl", price_of, "gpt-4o")
    assert b.spent_cost == pytest.approx(back.cost) == pytest.approx(ALIAS.cost(worst.prompt, 2_000))
    assert worst.cost is not None and b.spent_cost <= worst.cost


def _answer(key: int, pt: int, ct: int, snapshot: str) -> tuple[bytes, dict[str, Any]]:
    parts, meta = build("t", outcome({"prompt_tokens": pt, "completion_tokens": ct}, model=snapshot), key, 0.0, 1,
                        None, {}, extras=Extras(model="gpt-4o"))
    return b"".join(parts), meta


def _capped_session(b: Budget, results: Path, snapshot: str = "gpt-4o-2024-05-13") -> int:
    """The arbiter's dispatch against the budget: tasks go while it says GO (at most 64 out), then the tasks out
    answer (each using its whole reservation, answered as ``snapshot``) and dispatch looks again, until it says
    STOP. Returns the tasks that went."""
    costs = TaskCosts(RequestDefaults(model="gpt-4o", max_tokens=16), price_of, learned=b.learned)
    task = {"id": "t", "messages": [{"role": "user", "content": "x" * 4000}]}
    went = 0
    while True:
        out = []
        while len(out) < 64:
            worst, price, model = costs.worst(task)
            d = b.afford(1000 + went + len(out), worst, price, model)
            if d.verdict is not Verdict.GO:
                assert d.verdict is (Verdict.WAIT if out else Verdict.STOP)
                break
            out.append((1000 + went + len(out), worst))
        if not out:
            return went
        for key, worst in out:
            line, meta = _answer(key, worst.prompt, worst.completion, snapshot)
            with open(results, "ab") as f:
                f.write(line)
            b.settle_result(key, meta)
        went += len(out)


def test_a_capped_run_answered_as_a_dearer_snapshot_stays_under_its_cap_and_so_does_its_resume(tmp_path: Path) -> None:
    """gpt-4o asked, every answer the dearer gpt-4o-2024-05-13: the first task goes alone under --max-cost (its
    answer names the snapshot, the tasks after it reserve at its price), so the run stops within its cap; the
    resume with a higher cap reads the snapshot back from results.jsonl and reserves at its price from its first
    task. (Before: the first wave of 18 tasks reserved at the alias and spent $0.0947 of a $0.05 cap, the resume
    $0.2998 of $0.20.)"""
    results = tmp_path / "results.jsonl"
    b = Budget(Caps(cost=0.05), price_of=price_of)
    assert _capped_session(b, results) > 1
    assert 0.04 < b.spent_cost <= 0.05
    u = usage_of_results(results, price_of, "gpt-4o")
    assert u.cost == pytest.approx(b.spent_cost)
    assert (u.answered_as, u.answered) == ({"gpt-4o": "gpt-4o-2024-05-13"}, {"gpt-4o"})
    again = Budget(Caps(cost=0.20), Amount(u.prompt_tokens, u.completion_tokens, u.cost), price_of=price_of)
    again.learn(u.answered_as, u.answered)
    assert _capped_session(again, results) > 1
    assert 0.19 < again.spent_cost <= 0.20
    assert usage_of_results(results, price_of, "gpt-4o").cost == pytest.approx(again.spent_cost)


def test_one_task_of_a_model_goes_until_its_first_answer_under_a_cost_cap_only() -> None:
    """Under --max-cost a model's second task waits for its first result (whatever it was: a failure or a task
    handed back lets the next go alone); without a cost cap, under --batch-api (``first_answer=False``: a first
    answer takes hours), for a free model or a model already answered, tasks go at once."""
    costs = TaskCosts(RequestDefaults(model="gpt-4o", max_tokens=16), price_of)
    worst, price, model = costs.worst({"id": "t", "messages": [{"role": "user", "content": "hi"}]})
    b = Budget(Caps(cost=1.0), price_of=price_of)
    assert [b.afford(k, worst, price, model).verdict for k in (1, 2)] == [Verdict.GO, Verdict.WAIT]
    assert b.waiting and b.afford(3, *costs.worst({"id": "o", "prompt": "x"})).verdict is Verdict.WAIT
    assert b.first_pending  # status says "waiting for a first answer's price", not that the budget is short
    other = TaskCosts(RequestDefaults(model="other", max_tokens=16), price_of)
    assert b.afford(4, *other.worst({"id": "o", "prompt": "x"})).verdict is Verdict.GO  # another model's first
    assert b.release(1)  # handed back unanswered: the next goes alone in its place
    assert [b.afford(k, worst, price, model).verdict for k in (5, 6)] == [Verdict.GO, Verdict.WAIT]
    b.settle_result(5, {"k": 5, "ok": False, "pt": 0, "ct": 0})  # a failure settles it too
    assert all(b.afford(k, worst, price, model).verdict is Verdict.GO for k in range(7, 20))
    for budget in (Budget(Caps(total_tokens=10**6), price_of=price_of),
                   Budget(Caps(cost=1.0), price_of=price_of, first_answer=False)):
        assert all(budget.afford(k, worst, price, model).verdict is Verdict.GO for k in range(5))
    free = Budget(Caps(cost=1.0))
    assert all(free.afford(k, worst, Price(0.0, 0.0), model).verdict is Verdict.GO for k in range(5))
    known = Budget(Caps(cost=1.0), price_of=price_of)
    known.learn({}, {"gpt-4o"})  # a resume whose results.jsonl has its answers
    assert all(known.afford(k, worst, price, model).verdict is Verdict.GO for k in range(5))


def test_an_alias_answered_as_several_snapshots_reserves_at_the_dearest_live_and_after_a_resume(tmp_path: Path) -> None:
    """gpt-4o answered as the dear gpt-4o-2024-05-13, then as the cheaper gpt-4o-2024-08-06: its tasks still
    reserve at the dearest (before: the last one seen), live and as a resume reads it back."""
    b = Budget(Caps(cost=1e9), price_of=price_of)
    results = tmp_path / "results.jsonl"
    for key, snapshot in enumerate(["gpt-4o-2024-08-06", "gpt-4o-2024-05-13", "gpt-4o-2024-08-06"]):
        b.reserve(key, Amount(1_000, 300, 1.0), ALIAS, "gpt-4o")
        line, meta = _answer(key, 1_000, 300, snapshot)
        with results.open("ab") as f:
            f.write(line)
        b.settle_result(key, meta)
        assert b.answered_as == {"gpt-4o": "gpt-4o-2024-08-06" if key == 0 else "gpt-4o-2024-05-13"}
    assert usage_of_results(results, price_of, "gpt-4o").answered_as == b.answered_as
    costs = TaskCosts(RequestDefaults(model="gpt-4o", max_tokens=300), price_of, learned=b.learned)
    worst = costs.worst({"id": "t", "messages": [{"role": "user", "content": "x" * 400}]})[0]
    assert worst.cost == pytest.approx(SNAPSHOT.cost(worst.prompt, worst.completion))


def test_a_batch_answer_is_spent_at_the_batch_rates_live_as_a_resume_reads_it_back(tmp_path: Path) -> None:
    """--batch-api: the provider bills a batch's answers at its batch rates (half). The RESULT says it came from a
    batch (meta bt), so the live budget (summary.json's spend, the cap) spends what a resume reads back from its
    record's metrics.batch; an online answer of the same usage at the standard rates, the online fallback's too
    (before: read back at the batch's). (Before: live $0.0035, read back $0.00175.)"""
    half = Price(input=1.0, output=4.0)
    price = Price(input=2.0, output=8.0, variants=((("processing", "batch"), half),))
    body = {"model": "m", "choices": [{"message": {"content": "x"}}],
            "usage": {"prompt_tokens": 1_000, "completion_tokens": 100}}
    lines, meta = batch_build(Answer("t1", 200, body, "r", "batch_req_1", None, ""), 7, 1, 1,
                              {"index": 0, "url": "u"}, {"id": "batch_1", "chunk": 0}, {}, None, 1.0, model="m")
    (tmp_path / "results.jsonl").write_bytes(b"".join(lines))
    b = Budget(Caps(cost=100.0), price_of=lambda _m: price)
    costs = TaskCosts(RequestDefaults(model="m", max_tokens=300), lambda _m: price)
    assert b.afford(7, *costs.worst({"id": "t1", "messages": [{"role": "user", "content": "hi"}]})).verdict \
        is Verdict.GO
    b.settle_result(7, meta)
    back = usage_of_results(tmp_path / "results.jsonl", lambda _m: price, "m")
    assert b.spent_cost == pytest.approx(back.cost) == pytest.approx(half.cost(1_000, 100))
    _, online = build("t2", outcome(body["usage"]), 8, 0.0, 1, None, {}, extras=Extras(model="m"))
    b.reserve(8, Amount(2_000, 300, 1.0), price, "m")
    b.settle_result(8, online)
    assert b.spent_cost == pytest.approx(half.cost(1_000, 100) + price.cost(1_000, 100))
    # --batch-fallback online: the answer of the online request sent after the batch, at the standard rates
    # (its record keeps the batch that did not answer, with "fallback": "online"), live and read back alike
    fell, meta = batch_build(Answer("t3", 200, body, "r", None, None, ""), 9, 2, 1, {"index": 0, "url": "u"},
                             {"id": "batch_1", "chunk": 0, "fallback": "online"}, {}, None, 1.0, model="m")
    with (tmp_path / "results.jsonl").open("ab") as f:
        f.write(b"".join(fell))
    b.reserve(9, Amount(2_000, 300, 1.0), price, "m")
    b.settle_result(9, meta)
    back = usage_of_results(tmp_path / "results.jsonl", lambda _m: price, "m")
    assert back.cost == pytest.approx(half.cost(1_000, 100) + price.cost(1_000, 100))
    assert b.spent_cost == pytest.approx(back.cost + price.cost(1_000, 100))  # (t2 was not written)
