"""A capped --batch-api run cannot wait for a first answer to learn the snapshot that bills its model (a batch
takes hours): its first batch is reserved at the dearest price among the alias and its snapshots the price
source names (issue 40, "caps hold"), so a provider answering as a dearer snapshot keeps the bill within the cap.
Counted at the mock's own bill."""

from __future__ import annotations

import json
from pathlib import Path

from evalsup.config.prices import Price
from evalsup.mock.server import MockConfig, MockThread
from tests.harness import BATCH_FAST, BATCH_KEY, lines, read_results, run_cli, summary

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
