"""Model prices: the table shipped with evalsup (``prices.json``, dated, its sources named), a user's file that
overrides it model by model (``--prices FILE``, YAML or JSON), and 0 for a self-hosted endpoint.

Prices are USD per million tokens: ``input``, ``output`` and ``cached_input``. A model is looked up by its name
as given, then without a provider prefix (``openai/gpt-4o``), then without a date or version suffix
(``gpt-4o-mini-2024-07-18`` is ``gpt-4o-mini``, ``claude-sonnet-4-20250514`` is ``claude-sonnet-4``). A model
found nowhere has no price: ``lookup`` returns None and every caller says so; it never counts as free.

A well-kept price package exists (pydantic's ``genai-prices``, LiteLLM's ``model_prices_and_context_window.json``,
``tokencost``); evalsup ships its own small table instead (two dozen common models, a few KB, offline, no
dependency) and lets a file of the user's override it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("prices.json")
PER = 1_000_000  # prices are per million tokens
# suffixes a provider puts after the model's family name: a date, a snapshot number, "latest", a preview tag
_SUFFIX = re.compile(r"(-\d{4}-\d{2}-\d{2}|-\d{8}|@\d{8}|-\d{3,4}|-latest|-preview(-\d{2}-\d{2})?|-exp)$")

__all__ = ["Price", "PriceError", "PriceTable", "load_prices"]


class PriceError(Exception):
    """A price file that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class Price:
    """One model's price (USD per million tokens) and where it came from."""

    input: float
    output: float
    cached_input: float | None = None
    max_output: int | None = None  # the model's largest answer (assumed for a request without max_tokens)
    source: str = ""  # "evalsup table 2025-06-15", the user's file, or "self-hosted"

    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0) -> float:
        """USD for these tokens. Cached prompt tokens at ``cached_input`` when it is known, else at ``input``."""
        cached = min(cached_tokens, prompt_tokens)
        rate = self.input if self.cached_input is None else self.cached_input
        return ((prompt_tokens - cached) * self.input + cached * rate + completion_tokens * self.output) / PER


@dataclass(frozen=True)
class PriceTable:
    """The prices a run or an estimate uses: the user's, then the shipped table's; all 0 when self-hosted."""

    models: dict[str, Price]
    as_of: str = ""
    self_hosted: bool = False
    user: dict[str, Price] | None = None  # the user's file, looked up first
    _memo: dict[str, Price | None] = field(default_factory=dict, compare=False, repr=False)  # by name, as asked

    def lookup(self, model: str | None) -> Price | None:
        """The price of ``model``, or None (no price known: say so, never count it as free)."""
        if self.self_hosted:
            return SELF_HOSTED
        if not model:
            return None
        try:
            return self._memo[model]
        except KeyError:
            pass
        got = None
        for table in (self.user or {}, self.models):
            got = _find(table, model)
            if got is not None:
                break
        if len(self._memo) < 10_000:  # (a file naming more models than that is looked up afresh)
            self._memo[model] = got
        return got

    def describe(self) -> str:
        """Where the prices come from, for the estimate's and the run's first line."""
        if self.self_hosted:
            return "self-hosted: cost 0"
        own = f"your prices ({next(iter(self.user.values())).source}) over " if self.user else ""
        return f"{own}evalsup's table of {self.as_of}"


SELF_HOSTED = Price(0.0, 0.0, 0.0, None, "self-hosted")


def _find(table: dict[str, Price], model: str) -> Price | None:
    names = [model]
    if "/" in model:
        names.append(model.rsplit("/", 1)[1])
    for name in names:
        if name in table:
            return table[name]
        bare = name
        while (m := _SUFFIX.search(bare)) is not None and m.start() > 0:
            bare = bare[: m.start()]
            if bare in table:
                return table[bare]
    return None


def _price(entry: Any, where: str, source: str) -> Price:
    if not isinstance(entry, dict):
        raise PriceError(f"{where}: a model's price must be a mapping of input, output (and cached_input) in USD "
                         "per million tokens")
    unknown = set(entry) - {"input", "output", "cached_input", "max_output", "provider"}
    if unknown:
        raise PriceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (input, output, cached_input: USD "
                         "per million tokens)")
    vals: dict[str, float | None] = {}
    for k in ("input", "output", "cached_input"):
        v = entry.get(k)
        if v is None and k != "cached_input":
            raise PriceError(f"{where}: missing {k} (USD per million tokens)")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0):
            raise PriceError(f"{where}: {k} must be a number >= 0 (USD per million tokens), got {v!r}")
        vals[k] = None if v is None else float(v)
    mo = entry.get("max_output")
    if mo is not None and (isinstance(mo, bool) or not isinstance(mo, int) or mo < 0):
        raise PriceError(f"{where}: max_output must be a whole number of tokens >= 0, got {mo!r}")
    inp, out = vals["input"], vals["output"]
    assert inp is not None and out is not None
    return Price(inp, out, vals["cached_input"], mo, source)


def _table(data: Any, name: str, source: str) -> dict[str, Price]:
    if isinstance(data, dict) and isinstance(data.get("models"), dict):
        data = data["models"]
    if not isinstance(data, dict) or not data:
        raise PriceError(f"{name}: expected a mapping of model name to its prices (input, output, cached_input "
                         "in USD per million tokens)")
    return {str(m): _price(e, f"{name}: {m}", source) for m, e in data.items()}


def read_user_prices(path: Path) -> dict[str, Price]:
    """A user's price file: YAML (needs PyYAML: pip install 'evalsup[yaml]') or JSON (always), a mapping
    ``MODEL: {input: USD, output: USD, cached_input: USD}`` (per million tokens), or the same under ``models:``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PriceError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PriceError(f"{path}: not UTF-8 text") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            raise PriceError(f"{path}: reading YAML needs PyYAML (pip install 'evalsup[yaml]'); or give the "
                             "prices as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            raise PriceError(f"{path}{where}: not valid YAML") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PriceError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    return _table(data, str(path), str(path))


def load_prices(user_file: Path | str | None = None, self_hosted: bool = False) -> PriceTable:
    """The shipped table, with ``user_file``'s prices over it; every price 0 when ``self_hosted``."""
    data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    as_of = str(data.get("as_of", ""))
    shipped = _table(data, str(SHIPPED), f"evalsup table {as_of}")
    user = read_user_prices(Path(user_file)) if user_file is not None else None
    return PriceTable(shipped, as_of, self_hosted, user)
