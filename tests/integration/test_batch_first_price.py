"""A capped --batch-api run's first batch holds what its requests may be billed (issue 40, "caps hold"): it cannot
wait for a first answer to learn the snapshot that bills its model (a batch takes hours), so it is reserved at
the dearest price among the alias and its snapshots the price sources name, and a provider answering as a dearer
snapshot keeps the bill within the cap (counted at the mock's own bill); a Claude model's prompts are reserved at
the cache-write rates only when its requests mark the cache (counted in the batches the mock received)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from evalsup.config.prices import Price, load_prices
from evalsup.mock.server import MockConfig, MockThread
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import figures
from tests.harness import BATCH_FAST, BATCH_KEY, batches_of, lines, read_results, run_cli, summary

ALIAS, SNAPSHOT = Price(input=500.0, output=1500.0), Price(input=1000.0, output=3000.0)


def test_a_batch_run_answered_as_a_dearer_snapshot_stays_within_its_cap(tmp_path: Path) -> None:
    """``m`` answered and billed as ``m-2025-01-01`` at twice its rates, --max-cost 2: the first batch holds what
    the cap has room for at the snapshot's price, and the bill at the mock stays within $2 ($1.84, 11 answers;
    reserved at the alias's price, the batch held 20 tasks and $3.16 was billed)."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"m": {"input": ALIAS.input, "output": ALIAS.output},
                                  "m-2025-01-01": {"input": SNAPSHOT.input, "output": SNAPSHOT.output}}))
    tasks = lines(tmp_path / "t.jsonl", [{"id": f"t{i}", "messages": [
        {"role": "user", "content": f"Question {i}: " + "tell me more " * 20}]} for i in range(60)])
    with MockThread(MockConfig(seed=5, batch_step_ms=20, models=("m",), snapshot="-2025-01-01", bill=True)) as mock:
        r = run_cli("run", "--model", "m", "--base-url", mock.url, *BATCH_FAST, "--batch-max-requests", "1000",
                    "--max-tokens", "40", "--prices", str(prices), "--max-cost", "2", str(tasks), env=BATCH_KEY)
        assert r.returncode == 75, r.stderr  # the cap stopped it, resumably
        billed = mock.stats()["billed"]
    run_dir = tmp_path / "t.run"
    assert summary(run_dir)["exit_reason"] == "budget"
    assert set(billed) == {"m-2025-01-01"}
    b = billed["m-2025-01-01"]
    bill = SNAPSHOT.cost(b["prompt_tokens"], b["completion_tokens"])
    assert 1.0 < bill <= 2.0, bill
    recs = read_results(run_dir)
    assert len(recs) == b["answers"] and {r["response"]["body"]["model"] for r in recs} == {"m-2025-01-01"}
    assert summary(run_dir)["budget"]["spent"]["cost_usd"] <= 2.0


def test_a_claude_batch_holds_twice_the_tasks_without_cache_marks(tmp_path: Path) -> None:
    """A Claude model's first batch under a cap holds what the cap has room for at the rate its requests may be
    billed: the input rate without a ``cache_control`` mark, 1.25x it with one, 2x with a ``"ttl": "1h"`` one (as
    every Claude task was reserved before). Counted in the batches the mock received: 15, 12 and 7 tasks."""
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"claude-mock": {"input": 10.0, "output": 1.0}}))  # (1.25x and 2x its input)
    price = load_prices(prices, maintained=False).lookup("claude-mock")
    assert price is not None
    sizes = []
    for name, mark in (("none", None), ("5m", {"type": "ephemeral"}), ("1h", {"type": "ephemeral", "ttl": "1h"})):
        part: dict[str, Any] = {"type": "text", "text": "tell me more " * 100}
        if mark is not None:
            part["cache_control"] = mark
        body = {"max_tokens": 20, "messages": [{"role": "user", "content": [part]}]}
        tasks = lines(tmp_path / f"{name}.jsonl", [{"custom_id": f"t{i}", "method": "POST",
                                                     "url": "/v1/chat/completions", "body": body} for i in range(30)])
        f = figures(orjson.loads(tasks.read_bytes().splitlines()[0]), RequestDefaults("claude-mock"))
        p, c = f.approx_prompt, f.max_completion(None)
        worst = price.cost(p, c, written_tokens=p * (mark is not None),
                           written_1h_tokens=p * (mark is not None and "ttl" in mark))
        with MockThread(MockConfig(seed=5, batch_step_ms=20, models=("claude-mock",))) as mock:
            r = run_cli("run", "--model", "claude-mock", "--base-url", mock.url, *BATCH_FAST, "--batch-max-requests",
                        "1000", "--prices", str(prices), "--max-cost", "0.05", str(tasks), env=BATCH_KEY)
            assert r.returncode == 75, r.stderr
            sent = sorted(b["request_counts"]["total"] for b in batches_of(mock))
        chunks = Counter(rec["metrics"]["batch"]["chunk"] for rec in read_results(tmp_path / f"{name}.run"))
        assert sorted(chunks.values()) == sent  # (every task a batch held has its record)
        sizes.append(chunks[min(chunks)])
        assert sizes[-1] == int(0.05 // worst), (name, sizes)
    assert sizes[0] > sizes[1] > sizes[2] and sizes[0] >= 2 * sizes[2]
