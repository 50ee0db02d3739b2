"""Prices from a maintained source (issue 40): genai-prices prices the models it knows as it bills them (cached
input, cache writes, long prompts, the service tier an answer names, the batch API), the shipped table prices
the rest, ``--prices FILE`` wins over both, every price names its source and that source's date, and no price is
ever fetched from the network."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

genai_prices = pytest.importorskip("genai_prices")

from evalsup.config.prices import Price, load_prices  # noqa: E402
from evalsup.rundir.usage import usage_of_results  # noqa: E402

AT = datetime(2026, 12, 1, tzinfo=UTC)


def billed(model: str, price_context: dict[str, str] | None = None, **usage: int) -> float:
    """What genai-prices itself says the usage costs: the reference each evalsup figure is checked against."""
    got = genai_prices.calc_price(genai_prices.Usage(**usage), model, genai_request_timestamp=AT,
                                  price_context=price_context)
    return float(got.total_price)


def test_a_known_model_is_priced_by_genai_prices_and_says_so() -> None:
    t = load_prices(at=AT)
    p = t.lookup("gpt-4o-mini-2024-07-18")
    assert p is not None and p.source.startswith(f"genai-prices {genai_prices.__version__}")
    assert "latest price change 20" in p.source  # the data's date
    assert p.cost(12_000, 3_000) == pytest.approx(billed("gpt-4o-mini", input_tokens=12_000, output_tokens=3_000))
    assert t.describe().startswith(f"genai-prices {genai_prices.__version__}")
    assert "then evalsup's table of" in t.describe()  # the fallback is named too
    assert t.to_json()["by_model"] == {"gpt-4o-mini-2024-07-18": p.source}


@pytest.mark.parametrize(("model", "usage"), [
    ("gpt-4o", {"input_tokens": 10_000, "cache_read_tokens": 8_000, "output_tokens": 500}),
    ("claude-sonnet-4-20250514", {"input_tokens": 20_000, "cache_read_tokens": 5_000, "cache_write_tokens": 10_000,
                                  "output_tokens": 700}),
])
def test_cached_and_cache_written_prompt_tokens_at_their_rates(model: str, usage: dict[str, int]) -> None:
    p = load_prices(at=AT).lookup(model)
    assert p is not None
    got = p.cost(usage["input_tokens"], usage["output_tokens"], usage["cache_read_tokens"],
                 usage.get("cache_write_tokens", 0))
    assert got == pytest.approx(billed(model, **usage))
    assert got != pytest.approx(p.cost(usage["input_tokens"], usage["output_tokens"]))  # the cache changes the bill


def test_anthropics_1h_cache_writes_at_their_own_rate_as_genai_prices_bills_them() -> None:
    """Anthropic's usage splits its cache writes by how long they are kept: the 1-hour ones at genai-prices' own
    rate for them (2x input, where the 5-minute writes are 1.25x), the batch API's halved with the rest."""
    p = load_prices(at=AT).lookup("claude-sonnet-4-20250514")
    assert p is not None and p.cache_write_1h is not None and p.cache_write is not None
    assert p.cache_write_1h == pytest.approx(2 * p.input) and p.cache_write == pytest.approx(1.25 * p.input)
    got = p.cost(10_000, 500, 0, 6_000, written_1h_tokens=4_000)
    assert got == pytest.approx(billed("claude-sonnet-4-20250514", input_tokens=10_000, cache_write_tokens=6_000,
                                       cache_write_1h_tokens=4_000, output_tokens=500))
    assert got > p.cost(10_000, 500, 0, 6_000)  # dearer than the same writes kept 5 minutes
    batch = load_prices(at=AT, batch=True).lookup("claude-sonnet-4-20250514")
    assert batch is not None and batch.cost(10_000, 500, 0, 6_000, written_1h_tokens=4_000) == pytest.approx(
        billed("claude-sonnet-4-20250514", {"processing": "batch"}, input_tokens=10_000, cache_write_tokens=6_000,
               cache_write_1h_tokens=4_000, output_tokens=500))


def test_a_claude_copy_without_a_1h_rate_has_anthropics_2x() -> None:
    """A Claude model served elsewhere, for which genai-prices has a 5-minute write rate and no 1-hour one (AWS
    Bedrock's regional copies): its 1-hour writes at 2x its input rate, never at the 5-minute rate."""
    t = load_prices(at=AT)
    found = None
    for info in next(pr for pr in genai_prices.data.providers if pr.id == "aws").models:
        mp = info.get_prices(AT)
        if "claude" in info.id and getattr(mp, "cache_write_mtok", None) is not None \
                and getattr(mp, "cache_write_1h_mtok", None) is None:
            found = info.id
            break
    if found is None:
        pytest.skip("the installed genai-prices gives every Claude copy a 1-hour rate")
    p = t.lookup(f"aws/{found}")
    assert p is not None and p.cache_write_1h == pytest.approx(2 * p.input)


@pytest.mark.parametrize("tier", ["flex", "priority"])
def test_the_service_tier_an_answer_names(tier: str) -> None:
    p = load_prices(at=AT).lookup("o3")
    assert p is not None
    want = billed("o3", {"service_tier": tier}, input_tokens=10**6, output_tokens=10**6)
    assert p.variant(tier).cost(10**6, 10**6) == pytest.approx(want)
    assert want != pytest.approx(p.cost(10**6, 10**6))
    assert p.variant("no-such-tier") is p and p.variant("default").cost(10**6, 10**6) == p.cost(10**6, 10**6)
    assert p.variant(batch=True).cost(10**6, 10**6) == pytest.approx(
        billed("o3", {"processing": "batch"}, input_tokens=10**6, output_tokens=10**6))


def test_a_long_prompt_rate_applies_by_request_not_to_a_sum() -> None:
    p = load_prices(at=AT).lookup("gemini-2.5-pro")
    assert p is not None and p.over  # its prompts past 200k tokens cost more
    long = p.cost(300_000, 1_000)
    assert long == pytest.approx(billed("gemini-2.5-pro", input_tokens=300_000, output_tokens=1_000))
    # an estimate's sum of 10 requests of 30k prompt tokens is at the base rate
    assert p.cost(300_000, 1_000, requests=10) == pytest.approx(
        10 * billed("gemini-2.5-pro", input_tokens=30_000, output_tokens=100))


def test_the_shipped_table_prices_what_genai_prices_does_not_know() -> None:
    t = load_prices(at=AT)
    t.models["evalsup-only-model"] = Price(1.0, 2.0, None, 4096, f"evalsup table {t.as_of}")
    p = t.lookup("evalsup-only-model-2025-01-01")
    assert p is not None and p.source == f"evalsup table {t.as_of}" and p.cost(10**6, 10**6) == 3.0
    assert t.lookup("mock-model") is None  # known nowhere: no price, never free
    assert t.to_json()["by_model"]["mock-model"] == "no price"


def test_a_users_file_wins_over_genai_prices(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"gpt-4o": {"input": 1, "output": 1}}))
    t = load_prices(f, at=AT)
    mine, theirs = t.lookup("gpt-4o"), t.lookup("gpt-4o-mini")
    assert mine is not None and (mine.input, mine.output, mine.source) == (1.0, 1.0, str(f))
    assert theirs is not None and theirs.source.startswith("genai-prices")
    assert t.describe().startswith(f"your prices ({f}) over genai-prices")


def test_without_genai_prices_the_table_prices_and_the_line_says_how_to_get_it(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # not installed: any import of it fails
    monkeypatch.setitem(sys.modules, "genai_prices.data", None)
    t = load_prices(at=AT)
    p = t.lookup("gpt-4o")
    assert p is not None and p.source == f"evalsup table {t.as_of}"
    assert "genai-prices not installed: pip install 'evalsup[prices]'" in t.describe()


def test_prices_come_from_the_bundled_data_never_an_update(monkeypatch: Any) -> None:
    """Another library's UpdatePrices replaces genai-prices' global snapshot with downloaded data; evalsup reads
    its own snapshot of the bundled data, so what it charges cannot change under a run (and nothing is fetched:
    the unit tier's guard fails any socket)."""
    from genai_prices import data_snapshot

    class Poisoned:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError("evalsup used genai-prices' global (updatable) snapshot")

    monkeypatch.setattr(data_snapshot, "_custom_snapshot", Poisoned())
    p = load_prices(at=AT).lookup("gpt-4o")
    assert p is not None and p.source.startswith("genai-prices")
    assert p.cost(10**6, 0) == pytest.approx(billed_bundled("gpt-4o"))


def billed_bundled(model: str) -> float:
    from genai_prices.data import providers
    from genai_prices.data_snapshot import DataSnapshot

    got = DataSnapshot(providers=providers, from_auto_update=False).calc(
        genai_prices.Usage(input_tokens=10**6), model, None, None, AT)
    return float(got.total_price)


def test_a_resume_reads_answers_back_as_they_were_billed(tmp_path: Path) -> None:
    """rundir.usage (a resume's spend, the estimate): cached tokens and the service tier from the answer's body,
    the batch API's rates for a batch's record."""
    def rec(cid: str, model: str, usage: dict[str, Any], tier: str | None = None,
            batch: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "choices": [{"message": {"content": "x"}}], "usage": usage}
        if tier:
            body["service_tier"] = tier
        return {"id": cid, "custom_id": cid, "response": {"status_code": 200, "body": body}, "error": None,
                "metrics": {"batch": {"id": "b"}} if batch else {}}

    recs = [
        rec("a", "gpt-4o", {"prompt_tokens": 10_000, "completion_tokens": 100,
                            "prompt_tokens_details": {"cached_tokens": 9_000}}),
        rec("b", "o3", {"prompt_tokens": 1_000, "completion_tokens": 2_000}, tier="flex"),
        rec("c", "claude-sonnet-4-20250514", {"input_tokens": 100, "output_tokens": 50,
                                              "cache_read_input_tokens": 4_000, "cache_creation_input_tokens": 900}),
        rec("d", "o3", {"prompt_tokens": 1_000, "completion_tokens": 2_000}, batch=True),
        rec("e", "claude-sonnet-4-20250514", {"input_tokens": 100, "output_tokens": 50,
                                              "cache_creation_input_tokens": 3_000, "cache_creation": {
                                                  "ephemeral_5m_input_tokens": 1_000,
                                                  "ephemeral_1h_input_tokens": 2_000}}),
    ]
    (tmp_path / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    u = usage_of_results(tmp_path / "results.jsonl", load_prices(at=AT).lookup)
    want = (billed("gpt-4o", input_tokens=10_000, cache_read_tokens=9_000, output_tokens=100)
            + billed("o3", {"service_tier": "flex"}, input_tokens=1_000, output_tokens=2_000)
            + billed("claude-sonnet-4-20250514", input_tokens=5_000, cache_read_tokens=4_000,
                     cache_write_tokens=900, output_tokens=50)
            + billed("o3", {"processing": "batch"}, input_tokens=1_000, output_tokens=2_000)
            + billed("claude-sonnet-4-20250514", input_tokens=3_100, cache_write_tokens=3_000,
                     cache_write_1h_tokens=2_000, output_tokens=50))
    assert u.cost == pytest.approx(want)
    assert u.unpriced == 0


def test_a_batch_run_is_priced_at_the_batch_apis_rates_where_known(tmp_path: Path) -> None:
    t = load_prices(at=AT, batch=True)
    p = t.lookup("gpt-4o")
    assert p is not None and p.cost(10**6, 10**6) == pytest.approx(
        billed("gpt-4o", {"processing": "batch"}, input_tokens=10**6, output_tokens=10**6))
    assert p.cost(10**6, 10**6) < load_prices(at=AT).lookup("gpt-4o").cost(10**6, 10**6)  # type: ignore[union-attr]
    assert "batch API's rates" in t.describe()
    f = tmp_path / "p.json"  # a user's price is theirs: taken as given
    f.write_text(json.dumps({"gpt-4o": {"input": 1, "output": 1}}))
    mine = load_prices(f, at=AT, batch=True).lookup("gpt-4o")
    assert mine is not None and mine.cost(10**6, 10**6) == 2.0
