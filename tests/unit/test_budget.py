"""The budget room (issue 30, supervisor.budget) without processes: its invariants under any order of events.

The randomized test drives a model of a run's dispatch (requests reserve their worst case when handed out, and
either answer, settling to their usage, or come back unanswered) against the caps, and checks at every step
that the reservations add up, that spent only grows by what answered, that ``would_exceed`` says what the plain
sums say, and that spent never passes a cap by more than what answers used beyond their reservations."""

from __future__ import annotations

import random

import pytest

from evalsup.config.caps import Caps
from evalsup.config.prices import Price
from evalsup.supervisor.budget import REASK_TURN, Amount, Budget, TaskCosts, Verdict, priced
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import PER_MESSAGE, approx_prompt_tokens

PRICE = Price(input=2.0, output=8.0)  # USD per million tokens


def test_reserve_settle_release() -> None:
    b = Budget(Caps(cost=1.0, completion_tokens=1000))
    worst = priced(100, 500, PRICE)
    assert b.would_exceed(worst) is None
    b.reserve(1, worst, PRICE)
    assert b.reservations == 1 and b.reserved == worst
    assert b.would_exceed(priced(100, 501, PRICE)) == "completion_tokens"  # 500 reserved + 501 > 1000
    got = b.settle(1, 90, 200)
    assert got == priced(90, 200, PRICE) and b.reservations == 0 and b.reserved.total == 0
    assert b.spent == priced(90, 200, PRICE)
    b.reserve(2, worst, PRICE)
    b.release(2)  # handed back unanswered: nothing spent
    assert b.spent == priced(90, 200, PRICE) and b.reserved == Amount(0, 0, 0.0)
    assert b.projection(10) == Amount(90 * 11, 200 * 11, pytest.approx(priced(90, 200, PRICE).cost * 11))


def test_unknown_cost_never_passes_as_free() -> None:
    b = Budget(Caps(cost=100.0))
    assert b.would_exceed(priced(1, 1, None)) == "cost"
    tokens_only = Budget(Caps(total_tokens=10))
    assert tokens_only.would_exceed(priced(1, 1, None)) is None
    tokens_only.reserve(1, priced(1, 1, None), None)
    tokens_only.settle(1, 1, 1)
    assert tokens_only.unpriced == 1 and tokens_only.spent_cost == 0.0


def test_a_resume_starts_from_what_was_spent() -> None:
    b = Budget(Caps(cost=1.0), spent=Amount(10, 10, 0.9995))
    assert b.would_exceed(priced(100, 100, PRICE)) == "cost"
    assert Budget(Caps(cost=2.0), spent=Amount(10, 10, 0.9995)).would_exceed(priced(100, 100, PRICE)) is None


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_keep_the_invariants(seed: int) -> None:
    rnd = random.Random(seed)
    caps = Caps(cost=rnd.choice([None, rnd.uniform(0.01, 0.2)]),
                completion_tokens=rnd.choice([None, rnd.randint(500, 20_000)]),
                total_tokens=rnd.choice([None, rnd.randint(1000, 40_000)]))
    b = Budget(caps)
    out: dict[int, Amount] = {}  # the model: reservations open
    spent = Amount(0, 0, 0.0)
    beyond = Amount(0, 0, 0.0)  # what answers used beyond their reservations (the allowed overshoot)
    key = 0
    stopped = False
    for _ in range(400):
        op = rnd.random()
        if op < 0.5 and not stopped:
            key += 1
            worst = priced(rnd.randint(1, 400), rnd.randint(0, 800), PRICE)
            over = b.would_exceed(worst)
            plain = spent + sum(out.values(), Amount(0, 0, 0.0)) + worst
            fits = ((caps.cost is None or (plain.cost or 0) <= caps.cost + 1e-12)
                    and (caps.completion_tokens is None or plain.completion <= caps.completion_tokens)
                    and (caps.total_tokens is None or plain.total <= caps.total_tokens))
            assert (over is None) == fits
            if over is None:
                b.reserve(key, worst, PRICE)
                out[key] = worst
            elif not out:
                stopped = True  # nothing out and the next would pass: the run stops
        elif op < 0.85 and out:
            k = rnd.choice(sorted(out))
            w = out.pop(k)
            if rnd.random() < 0.1:  # the prompt estimate was short: this answer used more than reserved
                pt, ct = w.prompt + rnd.randint(1, 50), w.completion
            else:
                pt, ct = rnd.randint(0, w.prompt), rnd.randint(0, w.completion)
            before = b.spent
            got = b.settle(k, pt, ct)
            assert got == priced(pt, ct, PRICE)
            spent = spent + got
            extra = priced(max(0, pt - w.prompt), max(0, ct - w.completion), PRICE)
            beyond = beyond + extra
            after = b.spent
            assert after.prompt >= before.prompt and after.completion >= before.completion
            assert (after.cost or 0) >= (before.cost or 0)
        elif out:
            k = rnd.choice(sorted(out))
            out.pop(k)
            before = b.spent
            b.release(k)
            assert b.spent == before  # handed back unanswered: nothing spent
        res = sum(out.values(), Amount(0, 0, 0.0))
        assert b.reservations == len(out)
        assert (b.reserved.prompt, b.reserved.completion) == (res.prompt, res.completion)
        assert b.reserved.cost == pytest.approx(res.cost or 0.0, abs=1e-9)
        assert (b.spent.prompt, b.spent.completion) == (spent.prompt, spent.completion)
        assert b.spent.cost == pytest.approx(spent.cost or 0.0, abs=1e-9)
        if caps.cost is not None:
            assert (b.spent.cost or 0) <= caps.cost + (beyond.cost or 0) + 1e-9
        if caps.completion_tokens is not None:
            assert b.spent.completion <= caps.completion_tokens + beyond.completion
        if caps.total_tokens is not None:
            assert b.spent.total <= caps.total_tokens + beyond.total


def test_what_a_person_sees_of_the_budget() -> None:
    from prometheus_client import generate_latest

    from evalsup.config.caps import budget_text
    from evalsup.supervisor.metrics import Metrics
    from evalsup.supervisor.progress import fmt_budget

    b = Budget(Caps(cost=5.0, total_tokens=10_000))
    b.reserve(1, priced(100, 400, PRICE), PRICE)
    b.reserve(2, priced(100, 400, PRICE), PRICE)
    b.settle(1, 50, 100)
    fig = b.to_json(left=9)
    assert fig["reserved"]["requests"] == 1 and fig["projected"]["prompt_tokens"] == 50 * 10
    assert fmt_budget(fig) == "spent $0.00/$5.00 (reserved $0.00, projected $0.01)"
    assert budget_text(fig).startswith("spent $0.0009 of $5.0000, 150 of 10,000 tokens; reserved $0.0034")
    m = Metrics()
    m.update_budget(fig)
    text = generate_latest(m.registry).decode()
    assert 'evalsup_budget_usd{what="cap"} 5.0' in text
    assert 'evalsup_budget_tokens{kind="completion",what="spent"} 100.0' in text


# ----- issue 40: the budget decides (afford), settles a result's meta, and reserves all a task may cost -----

JUDGE = Price(input=1.0, output=4.0)


def _defaults() -> RequestDefaults:
    return RequestDefaults(model="m", max_tokens=100)


def test_afford_goes_waits_and_stops_in_a_persons_words() -> None:
    b = Budget(Caps(cost=1.0))
    big = priced(50_000, 100_000, PRICE)  # $0.90
    assert b.afford(1, big, PRICE, "m").verdict is Verdict.GO and b.reservations == 1
    d = b.afford(2, big, PRICE, "m")
    assert d.verdict is Verdict.WAIT and d.cap == "cost" and b.waiting  # task 1 may settle below its worst case
    assert b.settle_result(1, {"k": 1, "pt": 10_000, "ct": 20_000}) is True and not b.waiting  # look again
    d = b.afford(2, big, PRICE, "m")
    assert d.verdict is Verdict.STOP and b.reservations == 0
    assert d.say == "budget: spent $0.1800 of --max-cost $1.0000; the next task could use up to $0.9000"
    u = b.afford(3, priced(1, 1, None), None, "nameless")
    assert u.verdict is Verdict.UNPRICED and u.say == "--max-cost: no price for model 'nameless'"
    assert Budget(Caps(total_tokens=10)).afford(1, priced(1, 1, None), None, "x").verdict is Verdict.GO


def test_a_results_meta_settles_all_it_paid_for() -> None:
    b = Budget(Caps(total_tokens=1_000_000), judge_price=JUDGE)
    for k in range(1, 5):
        b.afford(k, priced(1000, 1000, PRICE), PRICE, "m")
    b.settle_result(1, {"pt": 10, "ct": 20})
    assert (b.spent_prompt, b.spent_completion) == (10, 20)
    b.settle_result(2, {"pt": 10, "ct": 20, "hg": 2, "rpt": 5, "rct": 6})  # hedged: the other copy paid too
    assert (b.spent_prompt, b.spent_completion) == (10 + 25, 20 + 46)
    b.settle_result(3, {"pt": 10, "ct": 20, "ca": "h", "jpt": 7, "jct": 8})  # from the cache: only the judge paid
    assert (b.spent_prompt, b.spent_completion) == (35 + 7, 66 + 8)
    assert b.spent_cost == pytest.approx(PRICE.cost(35, 66) + JUDGE.cost(7, 8))
    b.release(4)
    assert b.reservations == 0 and b.settled == 3


def test_a_tasks_worst_case_covers_its_hedge_reasks_and_judge() -> None:
    task = {"id": "a", "messages": [{"role": "user", "content": "x" * 400}], "expected": "y" * 40}
    p = approx_prompt_tokens(400, 1)
    plain, price, model = TaskCosts(_defaults(), lambda m: PRICE).worst(task)
    assert (plain.prompt, plain.completion, price, model) == (p, 100, PRICE, "m")
    hedged = TaskCosts(_defaults(), lambda m: PRICE, hedge=True).worst(task)[0]
    assert (hedged.prompt, hedged.completion) == (2 * p, 200)  # the second copy, before it is sent
    # re-asks: only where a schema applies (--response-schema, or the task's own), each with the conversation
    asked = TaskCosts(_defaults(), lambda m: PRICE, max_reasks=2, run_schema=True).worst(task)[0]
    grow = 4 * 100 + REASK_TURN + 2 * PER_MESSAGE
    assert (asked.prompt, asked.completion) == (p + (p + grow) + (p + 2 * grow), 300)
    assert TaskCosts(_defaults(), lambda m: PRICE, max_reasks=2).worst(task)[0] == plain  # no schema: none
    rf = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    own = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"messages": task["messages"], "response_format": rf}}
    assert TaskCosts(_defaults(), lambda m: PRICE, max_reasks=1).worst(own)[0].completion == 200
    # a simple line's response_format is its metadata, never sent: no schema, no re-ask to reserve
    assert TaskCosts(_defaults(), lambda m: PRICE, max_reasks=1).worst({**task, "response_format": rf})[0] == plain
    off = TaskCosts(_defaults(), lambda m: PRICE, max_reasks=2, run_schema=True, validate_schema=False)
    assert off.worst(task)[0] == plain  # --no-validate-schema: never asked again
    judged = TaskCosts(_defaults(), lambda m: PRICE, judge=True, judge_price=JUDGE, judge_template="T" * 400,
                       judge_max_tokens=30).worst(task)[0]
    jp = 100 + PER_MESSAGE + 2 * p + 2 * 100 + 11
    assert (judged.prompt, judged.completion) == (p + jp, 130)
    assert judged.cost == pytest.approx(PRICE.cost(p, 100) + JUDGE.cost(jp, 30))  # at the judge's own price
    assert TaskCosts(_defaults(), lambda m: PRICE, judge=True, judge_price=None).worst(task)[0].cost is None


@pytest.mark.parametrize("seed", range(30))
def test_random_dispatch_through_afford_keeps_the_invariants(seed: int) -> None:
    """Invariant 5 and the bound: WAIT only with tasks out (and ``waiting`` until one settles or comes back),
    STOP only with none, GO reserves; with usage within reservations, spent never passes the cap."""
    rnd = random.Random(seed)
    cap = rnd.uniform(0.05, 0.5)
    b = Budget(Caps(cost=cap), judge_price=JUDGE)
    costs = TaskCosts(_defaults(), lambda m: PRICE, hedge=rnd.random() < 0.5, max_reasks=rnd.randint(0, 2),
                      run_schema=True, judge=rnd.random() < 0.5, judge_price=JUDGE, judge_max_tokens=50)
    out: dict[int, Amount] = {}
    key = 0
    for _ in range(300):
        if rnd.random() < 0.55:
            key += 1
            task = {"id": str(key), "messages": [{"role": "user", "content": "x" * rnd.randint(1, 4000)}]}
            worst, price, model = costs.worst(task)
            d = b.afford(key, worst, price, model)
            if d.verdict is Verdict.GO:
                out[key] = worst
            elif d.verdict is Verdict.WAIT:
                assert out and b.waiting
            else:
                assert d.verdict is Verdict.STOP and not out and d.say.startswith("budget: spent $")
                break
        elif out:
            k = rnd.choice(sorted(out))
            w = out.pop(k)
            waited = b.waiting
            if rnd.random() < 0.8:  # an answer within its reservation, split as a worker reports it
                pt, ct = rnd.randint(0, w.prompt // 2), rnd.randint(0, w.completion // 2)
                assert b.settle_result(k, {"pt": pt, "ct": ct}) is waited
            else:
                assert b.release(k) is waited
            assert not b.waiting
        assert b.reservations == len(out)
        assert b.spent_cost + b.res_cost <= cap + 1e-9
