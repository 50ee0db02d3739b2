"""Cost control and the cache together (issue 30), over real HTTP against the mock: a second run answered from the
cache says the money it saved (priced from the price table) in summary.json and its hits in `evalsup status`, and
`evalsup estimate --cache` counts those requests as free; the judge's tokens count toward a cap when the judge
has a price."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from evalsup.config.prices import Price
from evalsup.mock.server import MockConfig, MockThread
from tests.harness import chat_requests, lines, read_results, run_args, run_cli, summary, write_tasks

PRICE = Price(input=1.0, output=2.0)  # USD per million tokens


def _prices(tmp_path: Path, **more: dict[str, float]) -> Path:
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"mock-model": {"input": PRICE.input, "output": PRICE.output}, **more}))
    return f


def test_a_cached_run_says_the_money_saved_and_status_its_hits(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40, extra={"max_tokens": 50})
    prices, cache = _prices(tmp_path), tmp_path / "cache"
    r = run_cli(*run_args(mock, tasks, "--cache", str(cache), "--prices", str(prices), "--out", str(tmp_path / "r1")))
    assert r.returncode == 0, r.stderr
    first = summary(tmp_path / "r1")
    assert first["cache"]["misses"] == 40 and first["cache"]["saved_usd"] == 0.0
    mock.reset_stats()
    r = run_cli(*run_args(mock, tasks, "--cache", str(cache), "--prices", str(prices), "--out", str(tmp_path / "r2")))
    assert r.returncode == 0, r.stderr
    assert "40 tasks (all from the cache)" in r.stderr  # the estimate at the start knew
    assert chat_requests(mock) == 0
    c = summary(tmp_path / "r2")["cache"]
    tokens = first["tokens"]
    assert c["hits"] == 40 and c["saved_usd"] == pytest.approx(PRICE.cost(tokens["prompt"], tokens["completion"]),
                                                               abs=1e-6) and c["saved_usd"] > 0
    assert "saved" in r.stdout and "$0.00" in r.stdout  # the final table's cache row
    status = run_cli("status", str(tmp_path / "r2"))
    assert "cache       40 hits, 0 misses this session" in status.stdout, status.stdout
    more = write_tasks(tmp_path / "more.jsonl", 50, extra={"max_tokens": 50})  # 40 of them already answered
    est = run_cli("estimate", str(more), "--model", "mock-model", "--prices", str(prices), "--cache", str(cache),
                  "--out", str(tmp_path / "r3"), "--json")
    assert est.returncode == 0, est.stderr
    e = orjson.loads(est.stdout)
    assert e["cache"]["hits"] == 40 and e["requests"] == 10 and e["total_requests"] == 50


@pytest.fixture
def judge() -> Iterator[MockThread]:
    m = MockThread(MockConfig(latency_ms=2, seed=7, judge=True, models=("judge-model",))).start()
    try:
        yield m
    finally:
        m.stop()


def test_the_judges_tokens_count_toward_a_cap_when_it_has_a_price(tmp_path: Path, mock: MockThread,
                                                                 judge: MockThread) -> None:
    tasks = lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "messages": [{"role": "user", "content": f"Capital {i}?"}],
                                          "expected": "Paris", "max_tokens": 20} for i in range(20)])
    prices = _prices(tmp_path, **{"judge-model": {"input": 3.0, "output": 6.0}})
    r = run_cli("run", "-c", "8", "--model", "mock-model", "--base-url", mock.url, "--scorer", "judge",
                "--judge-base-url", judge.url, "--judge-model", "judge-model", "--prices", str(prices),
                "--max-cost", "100", "--out", str(tmp_path / "r"), str(tasks))
    assert r.returncode == 0, r.stderr
    s = summary(tmp_path / "r")
    ju, tok, spent = s["judge_usage"], s["tokens"], s["budget"]["spent"]
    assert ju["requests"] == 20 and ju["prompt"] > 0
    assert spent["prompt_tokens"] == tok["prompt"] + ju["prompt"]
    assert spent["completion_tokens"] == tok["completion"] + ju["completion"]
    assert spent["cost_usd"] == pytest.approx(PRICE.cost(tok["prompt"], tok["completion"])
                                              + Price(3.0, 6.0).cost(ju["prompt"], ju["completion"]), abs=1e-5)


# ----- where the cache meets the judge, a JSON schema and re-asks -----

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
VALID = '{"answer": "B"}'


def test_a_cache_hit_is_judged_on_its_answer(tmp_path: Path, mock: MockThread, judge: MockThread) -> None:
    tasks = lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "prompt": f"Capital {i}?", "mock": {"text": f"Paris {i}"},
                                          "expected": f"Paris {i}"} for i in range(6)])
    args = ("--scorer", "judge", "--judge-base-url", judge.url, "--judge-model", "judge-model", "--cache",
            str(tmp_path / "cache"))
    for out in ("r1", "r2"):  # the second answered from the cache, and judged on the same answers
        r = run_cli(*run_args(mock, tasks, *args, "--out", str(tmp_path / out)))
        assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "r2")
    assert [x["metrics"].get("cache") for x in recs] == ["hit"] * 6
    assert [x["scores"] for x in recs] == [{"judge": 1.0}] * 6


def test_a_cache_hit_is_validated_and_the_schema_is_in_the_key(tmp_path: Path, mock: MockThread) -> None:
    own = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}
    tasks = lines(tmp_path / "own.jsonl", [
        {"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}], "response_format": own,
                  "mock": {"text": VALID, "invalid_first": 1}}} for i in range(3)])
    cache = ("--cache", str(tmp_path / "cache"))
    # kept without validation: the first (invalid) answers
    r = run_cli(*run_args(mock, tasks, *cache, "--no-validate-schema", "--out", str(tmp_path / "off")))
    assert r.returncode == 0, r.stderr
    # validated: an invalid kept answer is a miss, asked again and re-asked as usual; every request is spent
    mock.reset_stats()
    r = run_cli(*run_args(mock, tasks, *cache, "--max-reasks", "1", "--max-total-tokens", "100000",
                          "--out", str(tmp_path / "on")))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "on")
    assert chat_requests(mock) == 6  # each task: the request, then one re-ask
    for x in recs:
        assert x["error"] is None and x["metrics"].get("cache") != "hit" and x["metrics"]["reasks"] == 1
        assert x["response"]["body"]["choices"][0]["message"]["content"] == VALID
        assert x["metrics"]["reask_usage"]["prompt_tokens"] > 0  # the invalid answer's request, paid too
    s = summary(tmp_path / "on")
    pt = sum(x["response"]["body"]["usage"]["prompt_tokens"] + x["metrics"]["reask_usage"]["prompt_tokens"]
             for x in recs)
    assert s["budget"]["spent"]["prompt_tokens"] == pt == s["tokens"]["prompt"]
    # the valid answer replaced the invalid one: now a hit
    mock.reset_stats()
    r = run_cli(*run_args(mock, tasks, *cache, "--out", str(tmp_path / "again")))
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == 0 and all(x["error"] is None for x in read_results(tmp_path / "again"))

    # an answer that fails --response-schema is never kept: asked again by the next run
    schema = tmp_path / "schema.json"
    schema.write_bytes(orjson.dumps(SCHEMA))
    prose = write_tasks(tmp_path / "prose.jsonl", 3)
    for out in ("p1", "p2"):
        mock.reset_stats()
        r = run_cli(*run_args(mock, prose, *cache, "--response-schema", str(schema), "--max-reasks", "0",
                              "--out", str(tmp_path / out)))
        assert r.returncode == 0, r.stderr
        assert chat_requests(mock) == 3
        assert [x["error"]["code"] for x in read_results(tmp_path / out)] == ["schema_invalid"] * 3
