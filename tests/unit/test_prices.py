"""Prices (issues 30, 40): genai-prices for the models it knows (cached input, cache writes, long prompts, service
tiers and the batch API, read from its bundled data only), the shipped table as the fallback (dated, sourced,
names as providers write them), a user's file over both (JSON always, YAML with PyYAML), 0 when self-hosted, a model
with no price never free, and each price naming its source and that source's date."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsup.config.caps import CapError, Caps, parse_caps
from evalsup.config.prices import SHIPPED, PriceError, load_prices


def test_the_shipped_table_is_dated_and_names_its_sources() -> None:
    data = json.loads(SHIPPED.read_text())
    assert data["as_of"] and data["unit"] == "USD per million tokens"
    assert all(u.startswith("https://") for u in data["sources"].values())
    assert {m["provider"] for m in data["models"].values()} == {"openai", "anthropic", "google"}


@pytest.mark.parametrize(("given", "found"), [
    ("gpt-4o-mini", "gpt-4o-mini"), ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"), ("gpt-4o-2024-08-06", "gpt-4o"),
    ("openai/gpt-4.1-nano", "gpt-4.1-nano"), ("claude-sonnet-4-20250514", "claude-sonnet-4"),
    ("claude-3-5-haiku-latest", "claude-3-5-haiku"), ("gemini-2.5-flash-preview-05-20", "gemini-2.5-flash"),
])
def test_a_model_is_found_in_the_shipped_table_as_providers_name_it(given: str, found: str) -> None:
    t = load_prices(maintained=False)
    assert t.lookup(given) == t.models[found]


@pytest.mark.parametrize("name", ["mock-model", "llama-3-70b", "gpt-4o-audio-preview-x", "", None])  # the table
def test_an_unknown_model_has_no_price(name: str | None) -> None:
    assert load_prices(maintained=False).lookup(name) is None


def test_cost_per_million_and_cached_input() -> None:
    p = load_prices(maintained=False).lookup("gpt-4o")
    assert p is not None
    assert p.cost(1_000_000, 0) == pytest.approx(2.5) and p.cost(0, 1_000_000) == pytest.approx(10.0)
    assert p.cost(1_000_000, 0, cached_tokens=1_000_000) == pytest.approx(1.25)


def test_a_users_file_overrides_model_by_model(tmp_path: Path) -> None:
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"models": {"gpt-4o": {"input": 1, "output": 2}, "mine": {"input": 0, "output": 0}}}))
    t = load_prices(f, maintained=False)
    over, mine, other = t.lookup("gpt-4o-2024-08-06"), t.lookup("mine"), t.lookup("gpt-4o-mini")
    assert over is not None and (over.input, over.output) == (1.0, 2.0) and over.source == str(f)
    assert mine is not None and mine.cost(10**6, 10**6) == 0.0  # given as 0: free because the user said so
    assert other is not None and other.input == 0.15  # the rest from the shipped table
    assert "your prices" in t.describe()


def test_yaml_when_pyyaml_is_there(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    f = tmp_path / "p.yaml"
    f.write_text("my-model:\n  input: 0.5\n  output: 1.5\n  cached_input: 0.25\n")
    p = load_prices(f).lookup("my-model")
    assert p is not None and (p.input, p.output, p.cached_input) == (0.5, 1.5, 0.25)


@pytest.mark.parametrize(("text", "said"), [
    ('{"m": {"input": 1}}', "missing output"),
    ('{"m": {"input": -1, "output": 1}}', "input must be a number >= 0"),
    ('{"m": {"input": 1, "output": 1, "price": 3}}', "unknown key(s) price"),
    ('{"m": {"input": 1, "output": 1, "cache_write_1h": "2x"}}', "cache_write_1h must be a number >= 0"),
    ('{"m": 3}', "must be a mapping"),
    ("[]", "expected a mapping"),
    ('{"m": {', "not valid JSON"),
])
def test_a_bad_price_file_is_one_line_naming_it(tmp_path: Path, text: str, said: str) -> None:
    f = tmp_path / "p.json"
    f.write_text(text)
    with pytest.raises(PriceError) as e:
        load_prices(f)
    assert str(f) in str(e.value) and said in str(e.value) and "\n" not in str(e.value)


def test_a_claude_model_without_cache_write_rates_has_anthropics(tmp_path: Path) -> None:
    """The shipped table gives no cache-write rate: a Claude model's are Anthropic's multiples of its input rate
    (1.25x kept 5 minutes, 2x kept an hour); a user's file may give its own, and a model that is not Claude
    keeps its writes at the input rate."""
    t = load_prices(maintained=False)
    p = t.lookup("claude-sonnet-4-20250514")
    assert p is not None and (p.input, p.cache_write, p.cache_write_1h) == (3.0, 3.75, 6.0)
    # 1,000 prompt tokens: 100 uncached, 300 written for 5 minutes, 600 for an hour
    assert p.cost(1_000, 0, 0, 900, written_1h_tokens=600) == pytest.approx((100 * 3 + 300 * 3.75 + 600 * 6) / 1e6)
    gpt = t.lookup("gpt-4o")
    assert gpt is not None and gpt.cache_write is None and gpt.cache_write_1h is None
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"claude-via-gateway": {"input": 1, "output": 5, "cache_write": 1.5},
                             "my-alias": {"input": 1, "output": 5, "cache_write": 1.25, "cache_write_1h": 2.5}}))
    mine = load_prices(f, maintained=False)
    gw, alias = mine.lookup("claude-via-gateway"), mine.lookup("my-alias")
    assert gw is not None and (gw.cache_write, gw.cache_write_1h) == (1.5, 2.0)  # given, and derived
    assert alias is not None and alias.cost(1_000, 0, 0, 1_000, written_1h_tokens=1_000) == pytest.approx(2.5e-3)


def test_self_hosted_is_free_for_every_model() -> None:
    t = load_prices(self_hosted=True)
    p = t.lookup("anything")
    assert p is not None and p.cost(10**9, 10**9) == 0.0 and t.describe().startswith("self-hosted")


def test_caps_divide_among_shards_unless_given_per_shard() -> None:
    assert parse_caps("10", None, None, None) == Caps(10.0)
    assert parse_caps("10", "1000", "4000", (0, 4)) == Caps(2.5, 250, 1000)
    assert parse_caps("10/shard", "1000/shard", None, (1, 4)) == Caps(10.0, 1000)
    assert not Caps().any and Caps(total_tokens=1).any
    for bad in ("0", "-1", "x", "nan"):
        with pytest.raises(CapError):
            parse_caps(bad, None, None, None)
    with pytest.raises(CapError, match="whole number"):
        parse_caps(None, "1.5", None, None)
