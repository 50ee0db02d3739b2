"""A cap holds for everything a task causes (issue 40 item 2), counted where the money goes: the mocks bill each
answer they generate (the task's model at one mock, the judge's at another), and the bill is priced here from
their counts, not from evalsup's figures. Without a kill the bill stays within the cap; across kills -9 it ends
within one task's worst case per request on the wire at each kill. With --hedge both copies of a hedged request
are billed (the mock bills an answer it generated whether or not the client stayed to read it), and the bill
stays within the cap plus one request's worst case per request on the wire."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.config.prices import Price
from evalsup.mock.server import MockConfig, MockThread
from evalsup.supervisor.budget import TaskCosts
from evalsup.tasks.requests import RequestDefaults
from tests.harness import Run, assert_exactly_once, ids_of, lines, quiesce, read_results, run_cli, summary

PRICES = {"mock-model": Price(input=1000.0, output=2000.0), "judge-model": Price(input=500.0, output=4000.0)}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
VALID = '{"answer": "B"}'
C, JC = 8, 8  # -c and --judge-concurrency: the most requests on the wire at once, each side


@pytest.fixture
def mocks() -> Iterator[tuple[MockThread, MockThread]]:
    with MockThread(MockConfig(latency_ms=40, jitter_ms=10, seed=5, bill=True)) as answers, \
            MockThread(MockConfig(latency_ms=20, jitter_ms=5, seed=6, bill=True, judge=True,
                                  models=("judge-model",))) as judge:
        yield answers, judge


def _bill(*mocks: MockThread) -> float:
    """The dollars the mocks billed, priced from their own counts."""
    total = 0.0
    for m in mocks:
        for model, b in m.stats()["billed"].items():
            total += PRICES[model].cost(b["prompt_tokens"], b["completion_tokens"])
    return total


def _setup(tmp_path: Path, n: int, reasks: bool) -> tuple[Path, Path]:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({m: {"input": p.input, "output": p.output} for m, p in PRICES.items()}))
    mock: dict[str, Any] = {"text": VALID, "invalid_first": 1} if reasks else {}
    rows = [{"id": f"t{i}", "messages": [{"role": "user", "content": f"Question {i}: " + "tell me " * (i % 5)}],
             "expected": "B", **({"mock": mock} if mock else {})} for i in range(n)]
    return lines(tmp_path / "t.jsonl", rows), prices


def _args(tasks: Path, prices: Path, answers: MockThread, judge: MockThread, schema: Path | None) -> list[str]:
    out = ["run", "--model", "mock-model", "--base-url", answers.url, "--max-tokens", "40", "-w", "2", "-c", str(C),
           "--prices", str(prices), "--scorer", "judge", "--judge-base-url", judge.url, "--judge-model",
           "judge-model", "--judge-max-tokens", "20", "--judge-concurrency", str(JC)]
    if schema is not None:
        out += ["--response-schema", str(schema), "--max-reasks", "2"]
    return [*out, str(tasks)]


def _worst(tasks: Path, reasks: bool) -> float:
    """The most one task of ``tasks`` may cost with these settings (what the bound allows per request out)."""
    costs = TaskCosts(RequestDefaults(model="mock-model", max_tokens=40), PRICES.get, max_reasks=2 if reasks else 0,
                      run_schema=reasks, judge=True, judge_price=PRICES["judge-model"], judge_max_tokens=20)
    return max(costs.worst(orjson.loads(x))[0].cost or 0.0 for x in tasks.read_bytes().splitlines())


def _schema(tmp_path: Path) -> Path:
    f = tmp_path / "schema.json"
    f.write_bytes(orjson.dumps(SCHEMA))
    return f


@pytest.mark.parametrize("reasks", [False, True], ids=["judge", "judge+reasks"])
def test_a_cost_cap_holds_at_the_server_with_a_judge_and_reasks(tmp_path: Path, mocks: tuple[MockThread, MockThread],
                                                                reasks: bool) -> None:
    answers, judge = mocks
    tasks, prices = _setup(tmp_path, 300, reasks)
    cap = 10.0
    r = run_cli(*_args(tasks, prices, answers, judge, _schema(tmp_path) if reasks else None), "--max-cost",
                str(cap), "--json")
    assert r.returncode == 75, r.stderr
    assert orjson.loads(r.stdout)["exit_reason"] == "budget"
    quiesce(answers)
    quiesce(judge)
    billed = _bill(answers, judge)
    done = len(read_results(tmp_path / "t.run"))
    assert judge.stats()["billed"]["judge-model"]["answers"] == done  # each task's judge call, paid
    if reasks:  # every task's first answer was invalid: asked again, and paid again
        assert answers.stats()["billed"]["mock-model"]["answers"] == 2 * done
    assert billed <= cap, f"billed ${billed:.4f} at the server under --max-cost {cap}"
    assert billed + _worst(tasks, reasks) > cap  # it stopped only when the next task might not have fitted


def test_across_kills_the_bill_ends_within_the_worst_case_on_the_wire(
        tmp_path: Path, mocks: tuple[MockThread, MockThread], start: Callable[..., Run]) -> None:
    answers, judge = mocks
    n = 400
    tasks, prices = _setup(tmp_path, n, reasks=True)
    args = _args(tasks, prices, answers, judge, _schema(tmp_path))
    cap = 40.0
    run_dir = tmp_path / "t.run"
    kills = 0
    for at_least in (20, 50):
        p = start(*args, "--max-cost", str(cap))
        p.wait_results(run_dir, at_least)
        p.kill_group()
        assert p.wait_workers_gone() == []
        kills += 1
    quiesce(answers)
    quiesce(judge)
    r = run_cli(*args, "--max-cost", str(cap))
    assert r.returncode in (0, 75), r.stderr
    quiesce(answers)
    quiesce(judge)
    worst = _worst(tasks, reasks=True)
    billed = _bill(answers, judge)
    bound = cap + kills * (C + JC) * worst
    assert billed <= bound, f"billed ${billed:.4f}; cap {cap} + {kills} kills x {C + JC} on the wire x ${worst:.4f}"
    if r.returncode == 0:
        assert_exactly_once(run_dir, ids_of(n))


def test_an_unpriced_judge_under_a_cost_cap_is_refused_before_any_request(
        tmp_path: Path, mocks: tuple[MockThread, MockThread]) -> None:
    answers, judge = mocks
    tasks, _ = _setup(tmp_path, 10, reasks=False)
    prices = tmp_path / "only-answers.json"
    prices.write_text(json.dumps({"mock-model": {"input": 1.0, "output": 2.0}}))
    r = run_cli(*_args(tasks, prices, answers, judge, None), "--max-cost", "5")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "evalsup: --max-cost: no price for the judge's model 'judge-model'; give its price with --prices FILE, or "
        "--self-hosted for your own endpoint (no request was sent)"]
    assert answers.stats()["billed"] == {} and judge.stats()["billed"] == {}


def test_shards_share_the_cap_at_the_server(tmp_path: Path, mocks: tuple[MockThread, MockThread]) -> None:
    """--shard K/N (what each Ray shard runs with): each shard keeps its part of the cap, the two together the
    whole, judge and re-asks included."""
    answers, judge = mocks
    tasks, prices = _setup(tmp_path, 300, reasks=True)
    cap = 10.0
    for k in range(2):
        r = run_cli(*_args(tasks, prices, answers, judge, _schema(tmp_path)), "--max-cost", str(cap), "--shard",
                    f"{k}/2", "--out", str(tmp_path / f"shard{k}.run"))
        assert r.returncode == 75, r.stderr
        assert "of --max-cost $5.0000" in r.stderr  # its part
    quiesce(answers)
    quiesce(judge)
    billed = _bill(answers, judge)
    assert billed <= cap, f"billed ${billed:.4f} at the server by two shards under --max-cost {cap}"


@pytest.mark.parametrize("cap", ["cost", "total_tokens"])
def test_a_cap_holds_at_the_server_with_hedging(tmp_path: Path, cap: str) -> None:
    """--hedge sends a second copy of a request stuck in the run's tail; the copy that loses is cancelled, and a
    provider bills it all the same (the mock bills an answer once generated, read or not). Counted at the two
    mocks, priced here: both copies of every hedged task billed (more answers billed than tasks done), and the
    bill within the cap plus one request's worst case for each request the mocks ever held at once."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"mock-model": {"input": 1000.0, "output": 2000.0}}))
    price = PRICES["mock-model"]
    n = 300
    tasks = lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "messages": [
        {"role": "user", "content": f"Question {i}: " + "tell me " * (i % 5)}]} for i in range(n)])
    limit = {"cost": ("--max-cost", "5"), "total_tokens": ("--max-total-tokens", "3000")}[cap]
    # a quarter of the first replica's requests held a minute (a stuck slot): the tail the hedges go to
    with MockThread(MockConfig(latency_ms=20, jitter_ms=5, slow=0.25, slow_ms=60_000, seed=0, bill=True)) as stuck, \
            MockThread(MockConfig(latency_ms=20, jitter_ms=5, seed=1, bill=True)) as fine:
        r = run_cli("run", "-w", "1", "-c", "8", "--hedge", "--model", "mock-model", "--base-url", stuck.url,
                    "--base-url", fine.url, "--max-tokens", "40", "--prices", str(prices), *limit, str(tasks),
                    timeout=120)
        assert r.returncode == 75, r.stderr  # the cap stopped it, not the minute a stuck request takes
        quiesce(stuck)
        quiesce(fine)
        billed = [b for m in (stuck, fine) for b in m.stats()["billed"].values()]
        on_wire = int(stuck.stats()["max_in_flight"]) + int(fine.stats()["max_in_flight"])
        held = stuck.stats()["faults"].get("slow", 0)
    run_dir = tmp_path / "t.run"
    done = len(read_results(run_dir))
    s = summary(run_dir)
    answers = sum(b["answers"] for b in billed)
    pt, ct = sum(b["prompt_tokens"] for b in billed), sum(b["completion_tokens"] for b in billed)
    assert s["hedges"]["sent"] >= 1 and held >= 1, (s["hedges"], held)
    # the losing copies paid too (a copy cancelled before it reached a mock is not: at most one a hedge)
    assert done < answers <= done + s["hedges"]["sent"], (answers, done, s["hedges"])
    one = TaskCosts(RequestDefaults(model="mock-model", max_tokens=40), PRICES.get)  # one request, no copy
    worst = [one.worst(orjson.loads(x))[0] for x in tasks.read_bytes().splitlines()]
    if cap == "cost":
        bound = 5 + on_wire * max(w.cost or 0.0 for w in worst)
        assert price.cost(pt, ct) <= bound, f"billed ${price.cost(pt, ct):.4f}, bound ${bound:.4f}"
    else:
        bound = 3000 + on_wire * max(w.total for w in worst)
        assert pt + ct <= bound, f"billed {pt + ct:,} tokens, bound {bound:,}"
