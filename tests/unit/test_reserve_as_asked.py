"""A task reserves what its request may be billed (issue 40, "caps hold"), no more: a Claude model's prompt at the
cache-write rates only when the request marks the cache (``cache_control``; the 1-hour rate only for a ``"ttl":
"1h"``), with the dearest rates back for the rest of the run once an answer was billed writes its request did not
ask for; and before a model's first answer, at the dearest of its snapshots' prices (``PriceTable.snapshots``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.config.caps import Caps
from evalsup.config.prices import load_prices
from evalsup.rundir.checkpoint import Checkpoint
from evalsup.supervisor.budget import (
    UNASKED,
    WRITES_1H,
    WRITES_5M,
    Amount,
    Budget,
    Learned,
    TaskCosts,
    Verdict,
    cache_marks,
    carried,
    unasked_in,
)
from evalsup.tasks.requests import RequestDefaults
from evalsup.worker.client import Outcome
from evalsup.worker.records import Extras, build

CLAUDE = "claude-test"  # (a name with "claude": Anthropic's cache-write rates, 1.25x and 2x its input's)


def _prices(tmp_path: Path, **more: dict[str, float]) -> Any:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({CLAUDE: {"input": 3.0, "output": 15.0}, "plain": {"input": 3.0, "output": 15.0},
                             **more}))
    return load_prices(f, maintained=False)


def _task(mark: dict[str, Any] | None = None, model: str = CLAUDE, size: int = 8_000) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "text", "text": "x" * size}
    if mark is not None:
        part["cache_control"] = mark
    return {"custom_id": "t", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": 50, "messages": [{"role": "user", "content": [part]}]}}


def _outcome(usage: dict[str, Any], model: str = CLAUDE) -> Outcome:
    body = {"model": model, "choices": [{"message": {"content": "x"}}], "usage": usage}
    return Outcome(status=200, body=body, raw_len=100, request_id="r", error=None, attempts=1, latency_s=0.1,
                   parsed=body)


def test_a_claude_prompt_is_reserved_at_the_write_rate_its_request_asks() -> None:
    price = load_prices(maintained=False).lookup("claude-sonnet-4-20250514")  # (the shipped table's)
    assert price is not None and price.writes_marked
    costs = TaskCosts(RequestDefaults(), lambda _m: price)
    plain, five, hour = (costs.worst(_task(m, "claude-sonnet-4-20250514"))[0] for m in
                         (None, {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}))
    p, c = plain.prompt, plain.completion
    assert plain.cost == pytest.approx(price.cost(p, c))  # the input rate: nothing asks a write
    assert five.cost == pytest.approx(price.cost(p, c, written_tokens=p))
    assert hour.cost == pytest.approx(price.cost(p, c, written_tokens=p, written_1h_tokens=p))
    assert plain.cost is not None and five.cost is not None and hour.cost is not None
    assert plain.cost < five.cost < hour.cost
    # a line written another way (indented) gives the same
    spaced = json.dumps(_task({"type": "ephemeral", "ttl": "1h"}, "claude-sonnet-4-20250514"), indent=1).encode()
    assert costs.worst(json.loads(spaced))[0] == hour
    # a mark spelled with \u escapes is one to the provider, and to the reservation
    escaped = spaced.replace(b'"cache_control"', b'"cache\\u005fcontrol"').replace(b'"1h"', b'"1\\u0068"')
    assert b"cache_control" not in escaped and json.loads(escaped) == json.loads(spaced)
    assert costs.worst(json.loads(escaped))[0] == hour
    # a model whose provider may write without a mark (a cache-write rate, not a Claude model's): the dearest
    other = load_prices(maintained=False).lookup("gpt-4o")
    assert other is not None and not other.writes_marked


def test_where_a_mark_may_sit_and_what_is_not_one() -> None:
    def marks(o: Any) -> int:
        return cache_marks(orjson.dumps(o))

    assert marks({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]}) == WRITES_5M
    assert marks({"tools": [{"name": "f", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}) == WRITES_5M
    assert marks({"messages": [{"role": "user", "content": "q", "cache_control": {"ttl": "1h",
                                                                                   "type": "ephemeral"}}]}) == 2
    # the words in a prompt are not a mark (a quote inside a JSON string is escaped)
    assert marks({"messages": [{"role": "user", "content": 'what does "cache_control" do? "ttl": "1h"'}]}) == 0
    # Bedrock Converse's cache mark: a cachePoint block in system, tools (toolConfig) or a message's content, its
    # ttl "5m" (its default) or "1h"
    point = {"cachePoint": {"type": "default"}}
    assert marks({"system": [{"text": "s"}, point]}) == WRITES_5M
    assert marks({"toolConfig": {"tools": [{"toolSpec": {"name": "f"}}, {"cachePoint": {"type": "default",
                                                                                       "ttl": "5m"}}]}}) == 1
    assert marks({"messages": [{"role": "user", "content": [{"text": "q"}, {"cachePoint": {
        "type": "default", "ttl": "1h"}}]}]}) == WRITES_1H
    assert marks({"messages": [{"role": "user", "content": 'a "cachePoint" block, "ttl": "1h"'}]}) == 0
    assert marks({"messages": [{"role": "user", "content": [{"text": "q"}, {"cachepoint": {}}]}]}) == 0


def test_a_claude_task_with_a_bedrock_cache_point_is_reserved_at_its_write_rate(tmp_path: Path) -> None:
    """A Claude task whose request holds a Bedrock ``cachePoint`` block is reserved at the 5-minute write rate, at
    the 1-hour one when the block asks ``"ttl": "1h"``, however its line spells the key (\\u escapes); with none,
    at the input rate."""
    prices = _prices(tmp_path)
    price = prices.lookup(CLAUDE)
    assert price is not None and price.writes_marked
    costs = TaskCosts(RequestDefaults(), prices.lookup)

    def task(point: dict[str, Any] | None) -> dict[str, Any]:
        t = _task()
        if point is not None:
            t["body"]["messages"][0]["content"].append({"cachePoint": point})
        return t

    plain, five, hour = (costs.worst(task(p))[0] for p in (None, {"type": "default"}, {"type": "default",
                                                                                       "ttl": "1h"}))
    p, c = plain.prompt, plain.completion
    assert (five.prompt, hour.prompt) == (p, p) and plain.writes == 0
    assert plain.cost == pytest.approx(price.cost(p, c))
    assert five.cost == pytest.approx(price.cost(p, c, written_tokens=p)) and five.writes == WRITES_5M
    assert hour.cost == pytest.approx(price.cost(p, c, written_tokens=p, written_1h_tokens=p))
    assert hour.writes == WRITES_1H
    escaped = orjson.dumps(task({"type": "default", "ttl": "1h"})).replace(b'"cachePoint"', b'"cache\\u0050oint"')
    assert b"cachePoint" not in escaped
    assert costs.worst(json.loads(escaped))[0] == hour


def _session(b: Budget, costs: TaskCosts, task: dict[str, Any], usage: dict[str, Any] | None = None,
             wave: int = 64) -> tuple[int, int]:
    """Dispatch against the budget (``wave`` tasks out at most), the tasks out answered with ``usage`` (default:
    their whole reservation's tokens, billed at the input rate) through the worker's own RESULT meta, then
    dispatch looks again, until it says STOP. Returns (the tasks that went, the most that were out at once)."""
    went = widest = 0
    while True:
        out: list[tuple[int, Amount]] = []
        while len(out) < wave:
            worst, price, model = costs.worst(task)
            if b.afford(went + len(out), worst, price, model).verdict is not Verdict.GO:
                break
            out.append((went + len(out), worst))
        if not out:
            return went, widest
        for key, worst in out:
            u = usage or {"prompt_tokens": worst.prompt, "completion_tokens": worst.completion}
            _, meta = build("t", _outcome(u), key, 0.0, 1, None, {}, extras=Extras(model=CLAUDE))
            b.settle_result(key, meta)
        went += len(out)
        widest = max(widest, len(out))


def test_more_tasks_fit_under_a_cap_without_cache_marks(tmp_path: Path) -> None:
    """A cap of $0.05, prompts of ~2,000 tokens, every answer billed at the input rate: after the first answer,
    the tasks with no mark go 6 at once (reserved at the input rate), 5 with a 5-minute mark, 3 with a 1-hour one,
    as every Claude task was reserved before (at 2x its input rate): a batch near a cap holds half as many."""
    prices = _prices(tmp_path)
    price = prices.lookup(CLAUDE)
    p = TaskCosts(RequestDefaults(), prices.lookup).worst(_task())[0]
    each = price.cost(p.prompt, p.completion)  # what an answer costs
    for w, mark in ((0, None), (1, {"type": "ephemeral"}), (2, {"type": "ephemeral", "ttl": "1h"})):
        b = Budget(Caps(cost=0.05), price_of=prices.lookup)
        went, widest = _session(b, TaskCosts(RequestDefaults(), prices.lookup, learned=b.learned), _task(mark))
        assert b.spent_cost <= 0.05
        worst = price.cost(p.prompt, p.completion, written_tokens=p.prompt * (w > 0),
                           written_1h_tokens=p.prompt * (w > 1))
        # the first task goes alone (its answer's model prices the rest), then as many as the rest of the cap holds
        assert widest == int((0.05 - each) // worst), (mark, widest)
        assert went == int((0.05 - worst) // each) + 1  # (the last goes while what was spent and it fit the cap)
        if w == 0:
            plain = widest
    assert plain == 2 * widest  # (6 and 3)


def test_writes_no_request_asked_for_make_every_later_reservation_dear(tmp_path: Path) -> None:
    """A gateway that marks requests itself: the first answer of a task with no mark reports its prompt written to
    the cache; the budget learns it, and every later task is reserved at the 1-hour write rate (its checkpoint
    figures say so, and a resume reads it back); the run stays within its cap where, reserved at the input rate
    to the end, it would pass it."""
    prices = _prices(tmp_path)
    task = _task()
    b = Budget(Caps(cost=1e9), price_of=prices.lookup)
    costs = TaskCosts(RequestDefaults(), prices.lookup, learned=b.learned)
    cheap, price, model = costs.worst(task)
    assert price is not None and cheap.writes == 0 and UNASKED not in b.to_json()
    b.afford(1, cheap, price, model)
    written = {"prompt_tokens": cheap.prompt, "completion_tokens": 10, "prompt_tokens_details": {
        "cached_tokens": 0}, "cache_creation_input_tokens": cheap.prompt}  # (LiteLLM's shape for Anthropic's)
    _, meta = build("t", _outcome(written), 1, 0.0, 1, None, {}, extras=Extras(model=CLAUDE))
    assert meta["cw"] == cheap.prompt
    b.settle_result(1, meta)
    assert b.spent_cost > price.cost(cheap.prompt, 10)  # billed at the write rate: more than reserved for
    dear = costs.worst(task)[0]
    assert dear.writes == WRITES_1H
    assert dear.cost == pytest.approx(price.cost(dear.prompt, dear.completion, written_tokens=dear.prompt,
                                                 written_1h_tokens=dear.prompt))
    assert b.to_json()[UNASKED] is True
    again = Budget(Caps(cost=1e9), price_of=prices.lookup)
    again.learn(unasked_writes=b.to_json().get(UNASKED) is True)  # (the arbiter: from the checkpoint's figures)
    assert TaskCosts(RequestDefaults(), prices.lookup, learned=again.learned).worst(task)[0] == dear
    # a 5-minute mark allows 5-minute writes, not 1-hour ones
    five = _task({"type": "ephemeral"})
    for usage, learns in ((written, False), ({**written, "cache_creation": {"ephemeral_1h_input_tokens": 100}},
                                             True)):
        b = Budget(Caps(cost=1e9), price_of=prices.lookup)
        costs = TaskCosts(RequestDefaults(), prices.lookup, learned=b.learned)
        b.afford(1, *costs.worst(five))
        b.settle_result(1, build("t", _outcome(usage), 1, 0.0, 1, None, {}, extras=Extras(model=CLAUDE))[1])
        assert b.learned.unasked_writes is learns
    # the bill: answers that write their whole prompt, under a cap; learned after the first answer, within it
    cap = 0.20
    b = Budget(Caps(cost=cap), price_of=prices.lookup)
    costs = TaskCosts(RequestDefaults(), prices.lookup, learned=b.learned)
    all_written = {"prompt_tokens": cheap.prompt, "completion_tokens": cheap.completion,
                   "cache_creation_input_tokens": cheap.prompt}
    went, _ = _session(b, costs, task, all_written)
    assert went > 8 and b.spent_cost <= cap
    # reserved at the input rate to the end (what the budget learns never reaches its reservations): past the cap
    blind = Budget(Caps(cost=cap), price_of=prices.lookup)
    _session(blind, TaskCosts(RequestDefaults(), prices.lookup, learned=Learned()), task, all_written)
    assert blind.spent_cost > cap


def test_a_session_with_no_cap_in_between_keeps_what_the_run_learned(tmp_path: Path) -> None:
    """A session with a cap learns that a gateway writes what no request marks; the next session has no cap (no
    budget, nothing reserved): its checkpoint still carries what was learned, so the third, with a cap again,
    reserves its very first task at the 1-hour write rate. Each checkpoint goes through its file's form, with
    the counters the arbiter writes (``carried``) and reads back (``unasked_in``)."""
    prices = _prices(tmp_path)
    task = _task()

    def checkpoint(counters: dict[str, Any]) -> dict[str, Any]:
        return Checkpoint.from_json(Checkpoint(fingerprint={}, counters=counters).to_json()).counters

    first = Budget(Caps(cost=1e9), price_of=prices.lookup)
    costs = TaskCosts(RequestDefaults(), prices.lookup, learned=first.learned)
    cheap, price, model = costs.worst(task)
    assert price is not None and cheap.writes == 0
    assert not unasked_in(checkpoint({"restarts": {}} | carried(first.learned)))
    first.afford(1, cheap, price, model)
    written = {"prompt_tokens": cheap.prompt, "completion_tokens": 10, "cache_creation_input_tokens": cheap.prompt}
    first.settle_result(1, build("t", _outcome(written), 1, 0.0, 1, None, {}, extras=Extras(model=CLAUDE))[1])
    after_first = checkpoint({"budget": first.to_json()} | carried(first.learned))
    # the session with no cap: no budget, the arbiter's own Learned restored from the checkpoint and written again
    between = Learned(unasked_writes=unasked_in(after_first))
    after_between = checkpoint({"restarts": {}} | carried(between))
    assert "budget" not in after_between
    third = Budget(Caps(cost=1e9), price_of=prices.lookup,
                   learned=Learned(unasked_writes=unasked_in(after_between)))
    dear = TaskCosts(RequestDefaults(), prices.lookup, learned=third.learned).worst(task)[0]
    assert dear.writes == WRITES_1H
    assert dear.cost == pytest.approx(price.cost(dear.prompt, dear.completion, written_tokens=dear.prompt,
                                                 written_1h_tokens=dear.prompt))
    # a checkpoint written before the counters had their own key kept it in the budget's figures only
    assert unasked_in({"budget": {UNASKED: True}}) and not unasked_in({"budget": None}) and not unasked_in({})


def test_a_claude_judge_is_reserved_at_its_input_rate_until_unasked_writes_are_seen(tmp_path: Path) -> None:
    """--scorer judge with a Claude judge: evalsup's own judge request marks no cache, so its call is reserved at
    the judge's input rate whatever the task's request marks; once the run learned that a gateway writes what no
    one marked, at the judge's 1-hour write rate. A judge of another provider stays at its dearest."""
    prices = _prices(tmp_path, **{"other-judge": {"input": 3.0, "output": 15.0, "cache_write": 6.0}})
    judge = prices.lookup(CLAUDE)
    assert judge is not None and judge.writes_marked
    for mark in (None, {"type": "ephemeral", "ttl": "1h"}):
        for task in (_task(mark, "plain"), _task(mark)):
            learned = Learned()
            alone = TaskCosts(RequestDefaults(), prices.lookup, learned=learned)
            judged = TaskCosts(RequestDefaults(), prices.lookup, learned=learned, judge=True, judge_price=judge,
                               judge_max_tokens=200)
            for unasked in (False, True):
                learned.unasked_writes = unasked
                a, j = alone.worst(task)[0], judged.worst(task)[0]
                assert a.cost is not None and j.cost is not None and j.writes == a.writes
                jp, jc = j.prompt - a.prompt, j.completion - a.completion
                assert jp > 0 and jc == 200
                want = judge.cost(jp, jc, written_tokens=jp, written_1h_tokens=jp) if unasked else judge.cost(jp, jc)
                assert j.cost - a.cost == pytest.approx(want), (mark, task["body"]["model"], unasked)
    other = prices.lookup("other-judge")
    assert other is not None and not other.writes_marked
    task = _task(None, "plain")
    a = TaskCosts(RequestDefaults(), prices.lookup).worst(task)[0]
    j = TaskCosts(RequestDefaults(), prices.lookup, judge=True, judge_price=other, judge_max_tokens=200).worst(task)[0]
    assert a.cost is not None and j.cost is not None
    jp = j.prompt - a.prompt
    assert j.cost - a.cost == pytest.approx(other.cost(jp, 200, written_tokens=jp))  # (its writes: no mark needed)
    assert j.cost - a.cost > other.cost(jp, 200)


def test_before_a_first_answer_a_model_is_reserved_at_its_dearest_snapshot(tmp_path: Path) -> None:
    """``m`` and its dated snapshot ``m-2025-01-01`` at twice its rates: until an answer of ``m`` comes back, its
    tasks reserve at the snapshot's price (not another model's: ``m-mini`` is not a snapshot); after, at the
    price of what it answered as."""
    prices = _prices(tmp_path, **{"m": {"input": 1.0, "output": 4.0}, "m-2025-01-01": {"input": 2.0, "output": 8.0},
                                  "m-mini": {"input": 50.0, "output": 200.0}})
    assert prices.snapshots("m") == ("m-2025-01-01",)
    assert prices.snapshots("prov/m") == ("prov/m-2025-01-01",)
    alias, snapshot = prices.lookup("m"), prices.lookup("m-2025-01-01")
    task = {"id": "t", "prompt": "x" * 4000}
    for answered, after in (("m-2025-01-01", snapshot), ("m", alias)):
        b = Budget(Caps(cost=1e9), price_of=prices.lookup, first_answer=False)  # (as under --batch-api)
        costs = TaskCosts(RequestDefaults(model="m", max_tokens=100), prices.lookup, learned=b.learned,
                          snapshots=prices.snapshots)
        first, price, model = costs.worst(task)
        assert first.cost == pytest.approx(snapshot.cost(first.prompt, first.completion)) and price is alias
        b.afford(1, first, price, model)
        b.settle_result(1, build("t", _outcome({"prompt_tokens": 10, "completion_tokens": 5}, answered), 1, 0.0,
                                 1, None, {}, extras=Extras(model="m"))[1])
        later = costs.worst(task)[0]
        assert later.cost == pytest.approx(after.cost(later.prompt, later.completion))
    # a failure names no snapshot: the next tasks are still reserved at the dearest
    b = Budget(Caps(cost=1e9), price_of=prices.lookup, first_answer=False)
    costs = TaskCosts(RequestDefaults(model="m", max_tokens=100), prices.lookup, learned=b.learned,
                      snapshots=prices.snapshots)
    b.afford(1, *costs.worst(task))
    b.settle_result(1, {"k": 1, "ok": False, "pt": 0, "ct": 0})
    assert costs.worst(task)[0] == first
    # a resume whose results.jsonl holds answers of m: its own price
    b.learn({}, {"m"})
    assert costs.worst(task)[0].cost == pytest.approx(alias.cost(first.prompt, first.completion))


@pytest.mark.parametrize("seed", range(20))
def test_answers_written_only_where_asked_settle_within_their_reservations(tmp_path: Path, seed: int) -> None:
    """Random tasks, each with no mark, a 5-minute one or a 1-hour one, answered as Anthropic bills them (a part of
    the prompt written only where marked, for an hour only where asked), in random order: spent + reserved never
    passes the cap, and nothing is learned."""
    rnd = random.Random(seed)
    prices = _prices(tmp_path)
    cap = rnd.uniform(0.02, 0.2)
    b = Budget(Caps(cost=cap), price_of=prices.lookup)
    costs = TaskCosts(RequestDefaults(), prices.lookup, learned=b.learned)
    marks = [None, {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}]
    out: dict[int, tuple[int, Amount]] = {}
    for key in range(300):
        if rnd.random() < 0.55:
            level = rnd.randrange(3)
            worst, price, model = costs.worst(_task(marks[level], size=rnd.randint(100, 20_000)))
            d = b.afford(key, worst, price, model)
            if d.verdict is Verdict.GO:
                out[key] = (level, worst)
            elif d.verdict is Verdict.STOP:
                break
        elif out:
            k = rnd.choice(sorted(out))
            level, worst = out.pop(k)
            pt, ct = rnd.randint(1, worst.prompt), rnd.randint(0, worst.completion)
            written = rnd.randint(0, pt) if level else 0
            usage: dict[str, Any] = {"input_tokens": pt - written, "output_tokens": ct,
                                     "cache_creation_input_tokens": written}
            if level == 2:
                usage["cache_creation"] = {"ephemeral_1h_input_tokens": rnd.randint(0, written)}
            b.settle_result(k, build("t", _outcome(usage), k, 0.0, 1, None, {}, extras=Extras(model=CLAUDE))[1])
        assert b.spent_cost + b.res_cost <= cap + 1e-9
    assert not b.learned.unasked_writes
