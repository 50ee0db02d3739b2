"""Cost control and the answer cache as one feature (issue 30): the money the cache saved priced from the price
table (a model with no price said, never $0), the cache in the progress line, status, Prometheus and the report,
the estimate counting what the cache holds as free, the shards' budget column, the judge's tokens under the caps."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from evalsup.cache.key import KeyMaker
from evalsup.cache.known import CachedTally, KnownAnswers, Pending, request_key
from evalsup.cache.store import Entry, Store
from evalsup.cache.text import cache_text, saved_text
from evalsup.config.caps import Caps
from evalsup.config.prices import Price, load_prices
from evalsup.rundir.usage import usage_of_results
from evalsup.supervisor.budget import Budget, priced
from evalsup.supervisor.metrics import Metrics
from evalsup.supervisor.progress import fmt_snapshot_plain
from evalsup.supervisor.stats import RunStats
from evalsup.supervisor.summary import cache_summary, money_saved
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import Tally, figures
from evalsup.tools.estimate import estimate
from evalsup.tools.report.data import RunData
from evalsup.tools.report.page import _figures
from evalsup.tools.status import RunState, RunStatus, format_run, format_shards

P = Price(input=1.0, output=2.0)  # USD per million tokens
D = RequestDefaults(model="m", max_tokens=100)


def lookup(model: str) -> Price | None:
    return P if model == "m" else None


# ----- 1. the money saved -----

def test_money_saved_is_priced_and_a_model_without_a_price_is_named() -> None:
    assert money_saved({"m": [1_000_000, 500_000]}, lookup) == (2.0, [])
    usd, unpriced = money_saved({"m": [1_000_000, 0], "x": [10, 10]}, lookup)
    assert usd == 1.0 and unpriced == ["x"]  # the priced part, and the model left out said
    assert money_saved({"x": [10, 10]}, lookup) == (None, ["x"])  # never $0 for an unknown price
    assert money_saved({"m": [10, 10]}, None) == (None, ["m"])  # no price table at all
    assert money_saved({}, lookup) == (0.0, [])  # no hits: nothing saved, truly


def test_cache_summary_and_its_line() -> None:
    st = RunStats()
    for model in ("m", "m", "x"):
        st.on_result({"k": 1, "ok": True, "lat": 0.0, "rt": 0, "ca": "h", "cm": model, "pt": 1000, "ct": 2000})
    st.on_result({"k": 2, "ok": True, "lat": 0.1, "rt": 0, "ca": "m", "pt": 5, "ct": 5})
    run: Any = SimpleNamespace(stats=st, cache={"written": 1, "pruned": 0})
    c = cache_summary(run, lookup)
    assert (c["hits"], c["misses"], c["written"]) == (3, 1, 1)
    assert c["saved_usd"] == pytest.approx(P.cost(2000, 4000)) and c["saved_usd_no_price"] == ["x"]
    line = cache_text(c)
    assert "3 answered from it, 1 sent" in line and "$0.0100 saved" in line and "unknown price of x" in line
    assert saved_text({"saved_usd": None, "saved_usd_no_price": ["x"]}) == "money saved unknown (no price for x)"
    assert saved_text({"saved_usd": 12.345}) == "$12.35 saved"


# ----- 2. the cache where a person looks -----

def test_progress_line_status_prometheus_and_report_show_the_hits() -> None:
    s = {"state": "running", "done": 10, "total": 20, "rate": 5.0, "eta_s": 2.0, "inflight": 1, "queued": 0,
         "failed": 0, "retries": 0, "workers_mb": [40.0], "cache": {"hits": 7, "misses": 3}}
    assert "cache 7 hits" in fmt_snapshot_plain(s)
    assert "cache" not in fmt_snapshot_plain({**s, "cache": None})
    st = RunStatus("/r", RunState.RUNNING, done=10, ok=10, checkpoint_age_s=1.0, cache={"hits": 7, "misses": 3})
    assert "cache       7 hits, 3 misses this session" in format_run(st)
    m = Metrics()
    for ca in ("h", "h", "m", None):
        m.on_cache(ca)
    assert m.registry.get_sample_value("evalsup_cache_hits_total") == 2
    assert m.registry.get_sample_value("evalsup_cache_misses_total") == 1
    page = _figures(RunData(summary={"cache": {"hits": 3, "misses": 1, "saved_usd": 0.5,
                                               "tokens_saved": {"prompt": 1, "completion": 2}}}))
    assert "<b>cache</b>3 answered from it, 1 sent" in page and "$0.50 saved" in page  # the report's figures


# ----- 3. the estimate with the cache -----

ANSWER = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'


def _store(tmp_path: Path, objs: list[dict[str, Any]], completion: int) -> Path:
    d = tmp_path / "cache"
    s = Store(d)
    keys = KeyMaker()
    now = time.time()
    s.put([Entry(request_key(keys, o, D)[0], ANSWER, 200, None, "m", "/v1/chat/completions", 3, completion, now, now)
           for o in objs])
    s.close()
    return d


def _task(i: int, n: int = 1) -> dict[str, Any]:
    # the batch form: n and temperature are the request's (a simple line's other keys are its metadata)
    return {"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"q{i}"}], "temperature": 0, "n": n}}


def test_cached_tally_counts_hits_free_and_bands_the_rest_with_their_lengths(tmp_path: Path) -> None:
    cache = _store(tmp_path, [_task(i) for i in range(30)], completion=20)
    tally = Tally()
    look = CachedTally(KnownAnswers(cache), tally)
    keys = KeyMaker()
    for i in range(1200):  # hits among misses, over several batches
        o = _task(i, n=2 if i >= 1100 else 1)
        look.offer(Pending(figures(o, D), None, request_key(keys, o, D)[0]))
    assert look.finish() == "cache"
    assert look.hits == 30 and tally.requests == 1170 and look.by_model == {"m": 30}
    t = tally.models["m"]  # low and expected are the hits' 20 tokens a choice; high stays max_tokens a choice
    assert (round(t.completion.low), round(t.completion.expected)) == (1070 * 20 + 100 * 40,) * 2
    assert round(t.completion.high) == 1070 * 100 + 100 * 200
    look.known.close()


def test_estimate_with_a_cache_and_a_cache_that_is_not_there(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(_task(i)) + b"\n" for i in range(10)))
    cache = _store(tmp_path, [_task(i) for i in range(4)], completion=10)
    prices = load_prices(self_hosted=True)
    s = estimate(tasks, prices, D, cache_dir=cache)
    assert s["requests"] == 6 and s["total_requests"] == 10 and s["cache"]["hits"] == 4
    assert s["completion_tokens"] == {"low": 60, "expected": 60, "high": 600}
    assert s["completion_from"] == "seen (cache)"
    plain = estimate(tasks, prices, D)
    assert plain["requests"] == 10 and "cache" not in plain


def test_an_entry_the_run_would_not_serve_is_a_request_in_the_estimate(tmp_path: Path) -> None:
    """The run's check (cache.keep.entry_unfit) decides a hit: an entry that is no answer for its route, or an
    answer cut at its token limit without --cache-length, is a request (priced), counted apart."""
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(_task(i)) + b"\n" for i in range(10)))
    cache = _store(tmp_path, [_task(i) for i in range(6)], completion=10)
    keys = KeyMaker()
    cut = ANSWER.replace(b'"stop"', b'"length"')
    s = Store(cache)
    for i, body in ((0, b"{}"), (1, cut)):
        s.put([Entry(request_key(keys, _task(i), D)[0], body, 200, None, "m", "/v1/chat/completions", 3, 10)])
    s.close()
    prices = load_prices(self_hosted=True)
    e = estimate(tasks, prices, D, cache_dir=cache)
    assert (e["requests"], e["cache"]["hits"], e["cache"]["unusable"]) == (6, 4, 2)
    assert e["cache"]["unusable_why"] == {"no 'choices', not an answer for its route": 1, "cut (length)": 1}
    e = estimate(tasks, prices, D, cache_dir=cache, cache_length=True)  # as `run --cache-length` serves it
    assert (e["requests"], e["cache"]["hits"], e["cache"]["unusable"]) == (5, 5, 1)
    missing = estimate(tasks, prices, D, cache_dir=tmp_path / "none")
    assert missing["requests"] == 10 and missing["cache"]["hits"] == 0 and "no cache" in missing["cache"]["note"]
    assert not (tmp_path / "none").exists()  # read only: nothing created


# ----- 4. the shards' budget column -----

def _budget(spent: float, cap: float) -> dict[str, Any]:
    return {"caps": {"cost": cap, "completion_tokens": None, "total_tokens": None},
            "spent": {"prompt_tokens": 1, "completion_tokens": 1, "cost_usd": spent},
            "reserved": {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0},
            "unpriced_results": 0, "projected": None}


def test_status_of_shards_gets_a_budget_column_with_caps() -> None:
    def row(k: int, budget: dict[str, Any] | None) -> dict[str, Any]:
        return {**RunStatus(f"/p/shard-{k}-of-2", RunState.RUNNING, done=5, checkpoint_age_s=1.0,
                            budget=budget).as_dict(), "shard": f"shard-{k}-of-2"}
    total = {"done": 10, "ok": 10, "failed": 0, "invalid": 0, "outstanding": 0, "rate": None, "finished": 0,
             "running": 2}
    text = format_shards({"parent": "/p", "groups": [{"shards": 2, "rows": [row(0, _budget(1.2, 2.5)),
                                                                             row(1, _budget(0.5, 2.5))],
                                                       "total": total, "missing": []}]})
    assert "budget" in text and "$1.20/$2.50" in text and "$0.50/$2.50" in text and "$1.70/$5.00" in text
    plain = format_shards({"parent": "/p", "groups": [{"shards": 2, "rows": [row(0, None), row(1, None)],
                                                        "total": total, "missing": []}]})
    assert "budget" not in plain


# ----- 5. the judge's tokens under the caps -----

def test_the_judges_tokens_are_spent_without_a_reservation() -> None:
    b = Budget(Caps(cost=1.0, completion_tokens=None, total_tokens=1000))
    b.reserve(1, priced(10, 100, P), P)
    b.settle(1, 10, 50)
    b.spend(200, 300, P)  # the judge's, with the task's result
    assert (b.spent_prompt, b.spent_completion, b.settled) == (210, 350, 1)
    assert b.spent_cost == pytest.approx(P.cost(210, 350))
    assert b.would_exceed(priced(0, 500, P)) == "total_tokens"  # the judge's tokens count toward the cap


def test_a_resume_reads_the_judges_tokens_back_when_the_judge_has_a_price(tmp_path: Path) -> None:
    rec = {"id": "b1", "custom_id": "t1", "response": {"status_code": 200, "request_id": "r", "body": {
        "model": "m", "choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 10,
                                                                             "completion_tokens": 20}}},
        "error": None, "metrics": {}, "score_detail": {"judge": {"usage": {"prompt_tokens": 100,
                                                                           "completion_tokens": 5}}}}
    results = tmp_path / "results.jsonl"
    results.write_bytes(orjson.dumps(rec) + b"\n")
    plain = usage_of_results(results, lookup)
    assert (plain.prompt_tokens, plain.completion_tokens) == (10, 20)
    judged = usage_of_results(results, lookup, judge_price=P)
    assert (judged.prompt_tokens, judged.completion_tokens, judged.judge_prompt_tokens) == (110, 25, 100)
    assert judged.cost == pytest.approx(P.cost(110, 25))


def test_the_keys_fast_path_gives_the_bytes_of_the_normalised_form() -> None:
    import random

    from evalsup.cache.key import VERSION, normalised

    rng = random.Random(3)
    keys = KeyMaker()
    for _ in range(300):
        body: dict[str, Any] = {"model": rng.choice(["m", "llama-3.0"]), "temperature": rng.choice([0, 0.0, 0.5, 1.0]),
                                "max_tokens": rng.choice([10, 10.0, 1e15]), "top_p": rng.random(),
                                "messages": [{"role": "user", "content": rng.choice(["a", "v1.0 b", "2.05"])}]}
        want = orjson.dumps({"v": VERSION, "path": "/v1/chat/completions", "model": body["model"],
                             "body": normalised({k: v for k, v in body.items() if k != "model"}),
                             **({"sample": "t"} if body["temperature"] else {})}, option=orjson.OPT_SORT_KEYS)
        assert keys.canonical("/v1/chat/completions", body, "t") == want


# ----- 6. where the cache meets a JSON schema, re-asks and Prometheus -----

def test_prometheus_skips_a_hits_latency_as_the_summary_does() -> None:
    m = Metrics()
    m.on_result({"k": 1, "ok": True, "lat": 0.0, "rt": 0, "ttft": None, "ca": "h"})
    m.on_result({"k": 2, "ok": True, "lat": 0.25, "rt": 0, "ttft": None, "ca": "m"})
    assert m.registry.get_sample_value("evalsup_tasks_total", {"outcome": "succeeded"}) == 2
    assert m.registry.get_sample_value("evalsup_request_latency_seconds_count") == 1
    assert m.registry.get_sample_value("evalsup_request_latency_seconds_sum") == 0.25


def test_the_runs_schema_is_in_the_cache_key_when_it_is_validated() -> None:
    from evalsup.cache.key import schema_in_key

    body = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": "q"}]}
    plain = KeyMaker().key("/v1/chat/completions", body, "t")
    schema = {"type": "object", "required": ["answer"]}
    keyed = KeyMaker(schema=schema_in_key(schema, True)).key("/v1/chat/completions", body, "t")
    other = KeyMaker(schema={"type": "object", "required": ["other"]}).key("/v1/chat/completions", body, "t")
    assert len({plain, keyed, other}) == 3
    assert KeyMaker(schema=schema_in_key(schema, False)).key("/v1/chat/completions", body, "t") == plain


def test_a_reasked_answers_earlier_requests_are_in_the_meta_the_summary_and_the_resumes_spend(
        tmp_path: Path) -> None:
    from evalsup.worker.client import Outcome
    from evalsup.worker.records import Extras, build

    body = {"model": "m", "choices": [{"message": {"content": "{}"}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 5}}
    oc = Outcome(200, body, 10, "r", None, 1, 0.1, parsed=body, sent=3)
    out, meta = build("t1", oc, 1, 0.0, 1, None, {}, extras=Extras(reasks=2, reask_usage=(60, 9)))
    assert (meta["pt"], meta["ct"], meta["rpt"], meta["rct"], meta["rk"]) == (40, 5, 60, 9, 2)
    rec = orjson.loads(b"".join(out))
    assert rec["metrics"]["reask_usage"] == {"prompt_tokens": 60, "completion_tokens": 9}
    st = RunStats()
    st.on_result(meta)  # type: ignore[arg-type]
    assert (st.prompt_tokens, st.completion_tokens) == (100, 14)  # every request the task made
    results = tmp_path / "results.jsonl"
    results.write_bytes(b"".join(out))
    u = usage_of_results(results, lookup)
    assert (u.prompt_tokens, u.completion_tokens) == (100, 14) and u.cost == pytest.approx(P.cost(100, 14))


def test_a_resume_reads_a_hedged_answers_other_copy_as_paid(tmp_path: Path) -> None:
    """issue 40: the budget settles a hedged task's two copies; a resume reads the same spend back."""
    rec = {"id": "b1", "custom_id": "t1", "response": {"status_code": 200, "request_id": "r", "body": {
        "model": "m", "choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 10,
                                                                             "completion_tokens": 20}}},
        "error": None, "metrics": {"hedged": True, "hedge_won": False}}
    results = tmp_path / "results.jsonl"
    results.write_bytes(orjson.dumps(rec) + b"\n")
    u = usage_of_results(results, lookup)
    assert (u.prompt_tokens, u.completion_tokens) == (20, 40) and u.cost == pytest.approx(P.cost(20, 40))
    assert u.seen == (20.0, 20.0)  # the answer's length, once
