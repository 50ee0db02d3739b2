"""Model prices, from three sources in this order: a user's file (``--prices FILE``, YAML or JSON, model by
model), the maintained ``genai-prices`` package when it is installed (``pip install 'evalsup[prices]'``: pydantic's
table of some 2,000 models and their providers, cached-input, cache-write, long-prompt, service-tier and batch
rates included), and the small table shipped with evalsup (``prices.json``, dated, its sources named), the
fallback for what neither knows. A self-hosted endpoint costs 0.

Prices are USD per million tokens: ``input``, ``output``, ``cached_input``, ``cache_write`` (a prompt token
written to the provider's cache for 5 minutes, Anthropic's default) and ``cache_write_1h`` (for an hour). A Claude
model (its name has "claude": Anthropic's, or Bedrock's, Vertex's, OpenRouter's copy) whose source gives no
cache-write rate has Anthropic's published multipliers of its input rate: 1.25x for a 5-minute write, 2x for a
1-hour one (genai-prices gives the 1-hour rate for Anthropic's own models, and none for most of the copies; the
shipped table gives neither), and is marked as writing only where a request asks (``writes_marked``).

A model is looked up by its name as given, then without a provider prefix (``openai/gpt-4o``: genai-prices is
asked for that provider's model), then without a date or version suffix (``gpt-4o-mini-2024-07-18`` is
``gpt-4o-mini``); the other way, ``snapshots`` names the models any source prices that are a model followed by
such suffixes (what an alias may be answered and billed as). A model found nowhere has no price: ``lookup``
returns None and every caller says so; it never counts as free. Each ``Price`` names its source and that
source's date.

genai-prices is read from the data bundled with the installed version only: evalsup never starts its
``UpdatePrices`` (a download from GitHub) and builds its own snapshot of the bundled data, so a price never comes
from the network, nor from an update another library in the same process may have started. Its rates are read
once a model (pydantic's ``calc_price`` takes ~60 µs a call; ``Price.cost`` is float arithmetic, as the budget
settles every result with it), at the moment the table was loaded (a run's start).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).with_name("prices.json")
PER = 1_000_000  # prices are per million tokens
PACKAGE = "genai-prices"
INSTALL = "pip install 'evalsup[prices]'"
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
    max_output: int | None = None  # the model's largest answer (what bounds a request without max_tokens)
    source: str = ""  # "genai-prices 0.2.3 (...)", "evalsup table 2025-06-15", the user's file, or "self-hosted"
    cache_write: float | None = None  # prompt tokens written to the provider's cache (Anthropic), else ``input``
    context: int | None = None  # the model's context window in tokens, when the source knows it
    # a provider's long-prompt rates: (a request's prompt tokens above which, the rates), ascending; past a
    # threshold every token of that request is at its rates (the providers' "cliff", as genai-prices has it)
    over: tuple[tuple[int, Price], ...] = ()
    # the rates of a service tier or of the batch API: (("service_tier", "flex"), price), (("processing", "batch"), ...)
    variants: tuple[tuple[tuple[str, str], Price], ...] = ()
    # prompt tokens written to the provider's cache for an hour (Anthropic's 1-hour TTL), else ``cache_write``
    cache_write_1h: float | None = None
    # the user's own (--prices FILE): it prices an answer to its model even when the response names a snapshot
    # another source knows (``rundir.usage.billed_price``: what the user says they pay wins)
    given: bool = field(default=False, compare=False)
    # Anthropic's (a Claude model, wherever served): its provider writes the prompt cache only where a request
    # marks it (``cache_control``; Bedrock's ``cachePoint``), so a request with no mark is never billed a write
    # (``supervisor.budget``)
    writes_marked: bool = field(default=False, compare=False)

    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0,
             written_tokens: float = 0.0, requests: float = 1.0, written_1h_tokens: float = 0.0) -> float:
        """USD for these tokens (of ``requests`` requests: a long-prompt rate applies by a request's mean prompt).
        ``cached_tokens`` and ``written_tokens`` are parts of ``prompt_tokens``: read from and written to the
        provider's prompt cache, at ``cached_input`` and ``cache_write`` when known, else at ``input``;
        ``written_1h_tokens``, a part of ``written_tokens``, were kept an hour: at ``cache_write_1h`` when known,
        else as the others."""
        p = self
        if self.over and requests > 0:
            per = prompt_tokens / requests
            for start, rates in reversed(self.over):
                if per > start:
                    p = rates
                    break
        cached = min(max(cached_tokens, 0.0), prompt_tokens)
        written = min(max(written_tokens, 0.0), prompt_tokens - cached)
        hour = min(max(written_1h_tokens, 0.0), written)
        read_rate = p.input if p.cached_input is None else p.cached_input
        write_rate = p.input if p.cache_write is None else p.cache_write
        hour_rate = write_rate if p.cache_write_1h is None else p.cache_write_1h
        return ((prompt_tokens - cached - written) * p.input + cached * read_rate + (written - hour) * write_rate
                + hour * hour_rate + completion_tokens * p.output) / PER

    def variant(self, service_tier: str | None = None, batch: bool = False) -> Price:
        """The rates an answer was billed at: the batch API's (``batch``), else the ``service_tier`` its response
        names (OpenAI's ``flex``, ``priority``...); this price when the source has none for it."""
        want = ("processing", "batch") if batch else ("service_tier", service_tier) if service_tier else None
        if want is not None:
            for when, p in self.variants:
                if when == want:
                    return p
        return self

    @property
    def completion_bound(self) -> int | None:
        """The most completion tokens a request without max_tokens may take: the model's largest answer, else its
        context window; None when neither is known (unbounded)."""
        return self.max_output if self.max_output is not None else self.context


@dataclass
class PriceTable:
    """The prices a run or an estimate uses: the user's, then genai-prices', then the shipped table's; all 0 when
    self-hosted."""

    models: dict[str, Price]  # the shipped table
    as_of: str = ""
    self_hosted: bool = False
    user: dict[str, Price] | None = None  # the user's file, looked up first
    maintained: bool = True  # genai-prices asked (when installed) before the shipped table
    at: datetime = field(default_factory=lambda: datetime.now(UTC))  # the moment whose rates are taken
    batch: bool = False  # a --batch-api run: the batch API's rates where the source has them (genai-prices)
    _memo: dict[str, Price | None] = field(default_factory=dict, compare=False, repr=False)  # by name, as asked
    _package: _Maintained | None = field(default=None, compare=False, repr=False)
    _loaded: bool = field(default=False, compare=False, repr=False)
    _index: dict[str, list[str]] | None = field(default=None, compare=False, repr=False)  # (``snapshots``)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

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
        got = _find(self.user, model) if self.user else None
        if got is None:
            package = self.package()
            got = package.find(model, self.models) if package is not None else None
        if got is None:
            got = _find(self.models, model)
        if got is not None and self.batch:
            got = got.variant(batch=True)
        if len(self._memo) < 10_000:  # (a file naming more models than that is looked up afresh)
            self._memo[model] = got
        return got

    def snapshots(self, model: str | None) -> tuple[str, ...]:
        """The names of ``model``'s snapshots that some source prices: every model the user's file, genai-prices
        or the shipped table names that is ``model`` followed by date or version suffixes (the names ``lookup``
        takes back to it: ``gpt-4o-2024-05-13`` for ``gpt-4o``, not ``gpt-4o-mini`` nor
        ``gpt-4o-realtime-preview``, other models), a provider prefix kept (``openai/gpt-4o``'s are
        ``openai/gpt-4o-2024-05-13``...). What the alias may be answered and billed as before any answer says
        which (``supervisor.budget.TaskCosts``). The names' index is built once (~5,000 names, ~3 ms, genai-prices
        loaded if it was not), at the first call, whatever ``model`` (None: only that)."""
        if self.self_hosted:
            return ()
        with self._lock:
            index = self._index
        if index is None:
            names: list[str] = [*(self.user or {}), *self.models]
            package = self.package()
            if package is not None:
                names += package.names()
            index = snapshot_index(dict.fromkeys(names))
            with self._lock:
                self._index = index
        if not model:
            return ()
        prefix, _, bare = model.rpartition("/")
        got = [*index.get(model, ()), *(f"{prefix}/{n}" for n in index.get(bare, ()) if prefix)]
        return tuple(dict.fromkeys(got))

    def package(self) -> _Maintained | None:
        """genai-prices' bundled data, loaded at the first look-up that needs it (~0.2 s, ~15 MB); None when it is
        not installed or not asked (``maintained`` False)."""
        if not self.maintained or self.self_hosted:
            return None
        with self._lock:
            if not self._loaded:
                self._package = _Maintained.load(self.at)
                self._loaded = True
        return self._package

    def sources(self) -> list[str]:
        """The sources in the order they are asked (the user's file, genai-prices, the shipped table)."""
        if self.self_hosted:
            return ["self-hosted"]
        out = [f"your prices ({next(iter(self.user.values())).source})"] if self.user else []
        package = self.package()
        if package is not None:
            out.append(package.source)
        out.append(f"evalsup table {self.as_of}")
        return out

    def describe(self) -> str:
        """Where the prices come from, for the estimate's and the run's first line, the summary."""
        if self.self_hosted:
            return "self-hosted: cost 0"
        text = " over ".join(self.sources()[:-1])
        text = (f"{text}, then " if text else "") + f"evalsup's table of {self.as_of}"
        if self.maintained and self.package() is None:
            text += f" ({PACKAGE} not installed: {INSTALL} for maintained prices)"
        return text + ("; the batch API's rates where known" if self.batch else "")

    def used(self) -> dict[str, str]:
        """{model: the source of its price} for the models looked up so far (at most 50), "no price" for those
        without: which source priced a run (summary.json)."""
        out: dict[str, str] = {}
        for name, p in list(self._memo.items()):  # (a copy: the pre-scan's thread may be looking up)
            if len(out) >= 50:
                break
            out[name] = "no price" if p is None else p.source
        return out

    def to_json(self) -> dict[str, Any]:
        """summary.json's ``prices``: the sources in order and which one priced each model of the run."""
        return {"sources": self.sources(), "by_model": self.used()}


SELF_HOSTED = Price(0.0, 0.0, 0.0, None, "self-hosted")

# Anthropic's cache writes, as multiples of the input rate (https://docs.claude.com/en/docs/build-with-claude/
# prompt-caching#pricing): a prompt kept 5 minutes (the default TTL) bills at 1.25x, one kept an hour at 2x
WRITE_5M, WRITE_1H = 1.25, 2.0


def _claude(name: str) -> bool:
    """An Anthropic model, wherever it is served (genai-prices' own test for Anthropic's models)."""
    return "claude" in name.lower()


def _anthropic_writes(p: Price) -> Price:
    """A Claude model's price with Anthropic's cache-write rates where its source gave none (derived from its
    input rate, tier by tier and variant by variant: the batch API's are half, as its input is), marked as
    writing only where a request asks (``Price.writes_marked``)."""
    if p.cache_write is not None and p.cache_write_1h is not None and not p.over and not p.variants and \
            p.writes_marked:
        return p
    return replace(p, cache_write=p.input * WRITE_5M if p.cache_write is None else p.cache_write,
                   cache_write_1h=p.input * WRITE_1H if p.cache_write_1h is None else p.cache_write_1h,
                   over=tuple((s, _anthropic_writes(t)) for s, t in p.over),
                   variants=tuple((w, _anthropic_writes(v)) for w, v in p.variants), writes_marked=True)


def _strips(name: str) -> Iterator[str]:
    """The names ``name`` is looked up as once its date or version suffixes go, one by one (``_find``'s order):
    ``gpt-4-1106-preview`` gives ``gpt-4-1106``, then ``gpt-4``."""
    bare = name
    while (m := _SUFFIX.search(bare)) is not None and m.start() > 0:
        bare = bare[: m.start()]
        yield bare


def snapshot_index(names: Iterable[str]) -> dict[str, list[str]]:
    """{model: the names among ``names`` that are it followed by date or version suffixes}: its snapshots."""
    out: dict[str, list[str]] = {}
    for name in names:
        for bare in _strips(name):
            out.setdefault(bare, []).append(name)
    return out


def _find(table: dict[str, Price], model: str) -> Price | None:
    names = [model]
    if "/" in model:
        names.append(model.rsplit("/", 1)[1])
    for name in names:
        if name in table:
            return table[name]
        for bare in _strips(name):
            if bare in table:
                return table[bare]
    return None


class _Maintained:
    """genai-prices' bundled data, read as ``Price``s (its data module, never its ``UpdatePrices``)."""

    def __init__(self, snapshot: Any, version: str, at: datetime, latest: date | None) -> None:
        self.snapshot, self.version, self.at = snapshot, version, at
        self.source = f"{PACKAGE} {version}" + (f" (latest price change {latest.isoformat()})" if latest else "")

    @classmethod
    def load(cls, at: datetime) -> _Maintained | None:
        try:
            from importlib.metadata import version

            # (the prices extra: mypy checks it when installed, as the test extra does)
            from genai_prices.data import providers  # type: ignore[import-not-found,unused-ignore]
            from genai_prices.data_snapshot import DataSnapshot  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None
        # our own snapshot of the bundled data: not get_snapshot(), which an UpdatePrices started by another
        # library in this process would have replaced with downloaded data
        snapshot = DataSnapshot(providers=providers, from_auto_update=False)
        return cls(snapshot, version(PACKAGE), at, _latest_change(providers, at.date()))

    def names(self) -> list[str]:
        """Every model name the data names: each model's id and the names its match rule gives whole (equals,
        starts-with; not a contains or a regex, which name no model)."""
        out: list[str] = []

        def clause(c: Any) -> None:
            for key in ("equals", "starts_with"):
                v = getattr(c, key, None)
                if isinstance(v, str):
                    out.append(v)
            for key in ("or_", "and_"):
                for sub in getattr(c, key, None) or ():
                    clause(sub)

        for provider in self.snapshot.providers:
            for info in provider.models:
                out.append(info.id)
                clause(info.match)
        return out

    def find(self, model: str, shipped: dict[str, Price]) -> Price | None:
        """``model``'s price, or None (the shipped table is asked next). Its largest answer comes from the
        shipped table when that knows the model (genai-prices has the context window only)."""
        tries: list[tuple[str, str | None]] = [(model, None)]
        if "/" in model:
            prefix, rest = model.split("/", 1)
            tries += [(rest, prefix), (rest, None)]
        for ref, provider_id in tries:
            try:
                provider, info = self.snapshot.find_provider_model(ref, None, provider_id, None)
            except (LookupError, ValueError):
                continue
            table = _find(shipped, model)
            got = _from_package(info, provider, self.at, self.source, table.max_output if table else None)
            return _anthropic_writes(got) if got is not None and _claude(f"{model} {info.id}") else got
        return None


def _latest_change(providers: Any, today: date) -> date | None:
    """The latest dated price change in effect on ``today`` in genai-prices' data: how fresh the data is."""
    latest: date | None = None
    for provider in providers:
        for info in provider.models:
            conds = [c.constraint for c in info.prices] if isinstance(info.prices, list) else []
            conds += [v.constraint for v in info.price_variants or ()]
            for c in conds:
                d = getattr(c, "start_date", None)
                if isinstance(d, date) and d <= today and (latest is None or d > latest):
                    latest = d
    return latest


def _rate(v: Any) -> tuple[float | None, dict[int, float]]:
    """A genai-prices rate: (its base in USD per million tokens, {threshold: rate} of its long-prompt tiers)."""
    if v is None:
        return None, {}
    tiers = getattr(v, "tiers", None)
    if tiers is not None:
        return float(v.base), {int(t.start): float(t.price) for t in tiers}
    return float(v), {}


def _rates(mp: Any, source: str, max_output: int | None, context: int | None) -> Price | None:
    # (cache_write_1h_mtok: Anthropic's 1-hour cache writes, in 0.2.5's data; a version without it: derived)
    got = {k: _rate(getattr(mp, k, None)) for k in ("input_mtok", "output_mtok", "cache_read_mtok",
                                                     "cache_write_mtok", "cache_write_1h_mtok")}
    if got["input_mtok"][0] is None and got["output_mtok"][0] is None:
        return None  # priced by something else than tokens (requests, characters, audio): not ours to say

    def at(k: str, start: int) -> float | None:  # a field's rate for a prompt past ``start`` (-1: the base)
        base, tiers = got[k]
        past = [s for s in tiers if s <= start]
        return tiers[max(past)] if past else base

    def rates(start: int) -> Price:
        return Price(at("input_mtok", start) or 0.0, at("output_mtok", start) or 0.0, at("cache_read_mtok", start),
                     max_output, source, at("cache_write_mtok", start), context,
                     cache_write_1h=at("cache_write_1h_mtok", start))

    base = rates(-1)
    over = tuple((s, rates(s)) for s in sorted({s for _, tiers in got.values() for s in tiers}))
    return Price(base.input, base.output, base.cached_input, max_output, source, base.cache_write, context, over,
                 cache_write_1h=base.cache_write_1h)


def _from_package(info: Any, provider: Any, at: datetime, source: str, max_output: int | None) -> Price | None:
    context = info.context_window if isinstance(info.context_window, int) else None
    base = _rates(info.get_prices(at), source, max_output, context)
    if base is None:
        return None
    variants: list[tuple[tuple[str, str], Price]] = []
    # a provider serving another's model (Azure's OpenAI models) has no tier rates of its own: standard then
    if any(info is m for m in provider.models):
        for v in info.price_variants or ():
            if len(v.when) != 1:
                continue
            ((key, value),) = v.when.items()
            if key in ("service_tier", "processing"):
                p = _rates(info.get_prices(at, {key: value}), source, max_output, context)
                if p is not None and p != base:
                    variants.append(((key, value), p))
    if variants:
        return replace(base, variants=tuple(variants))
    return base


def _price(entry: Any, where: str, source: str) -> Price:
    if not isinstance(entry, dict):
        raise PriceError(f"{where}: a model's price must be a mapping of input, output (and cached_input) in USD "
                         "per million tokens")
    unknown = set(entry) - {"input", "output", "cached_input", "cache_write", "cache_write_1h", "max_output",
                            "provider"}
    if unknown:
        raise PriceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (input, output, cached_input, "
                         "cache_write, cache_write_1h: USD per million tokens)")
    vals: dict[str, float | None] = {}
    for k in ("input", "output", "cached_input", "cache_write", "cache_write_1h"):
        v = entry.get(k)
        if v is None and k in ("input", "output"):
            raise PriceError(f"{where}: missing {k} (USD per million tokens)")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0):
            raise PriceError(f"{where}: {k} must be a number >= 0 (USD per million tokens), got {v!r}")
        vals[k] = None if v is None else float(v)
    mo = entry.get("max_output")
    if mo is not None and (isinstance(mo, bool) or not isinstance(mo, int) or mo < 0):
        raise PriceError(f"{where}: max_output must be a whole number of tokens >= 0, got {mo!r}")
    inp, out = vals["input"], vals["output"]
    assert inp is not None and out is not None
    return Price(inp, out, vals["cached_input"], mo, source, cache_write=vals["cache_write"],
                 cache_write_1h=vals["cache_write_1h"])


def _table(data: Any, name: str, source: str) -> dict[str, Price]:
    if isinstance(data, dict) and isinstance(data.get("models"), dict):
        data = data["models"]
    if not isinstance(data, dict) or not data:
        raise PriceError(f"{name}: expected a mapping of model name to its prices (input, output, cached_input "
                         "in USD per million tokens)")
    out = {str(m): _price(e, f"{name}: {m}", source) for m, e in data.items()}
    return {m: _anthropic_writes(p) if _claude(m) else p for m, p in out.items()}


def read_user_prices(path: Path) -> dict[str, Price]:
    """A user's price file: YAML (needs PyYAML: pip install 'evalsup[yaml]') or JSON (always), a mapping
    ``MODEL: {input: USD, output: USD, cached_input: USD}`` (per million tokens; ``cache_write`` and
    ``cache_write_1h``, a prompt written to the provider's cache for 5 minutes and for an hour, when its
    provider bills them apart), or the same under ``models:``."""
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
    return {m: replace(p, given=True) for m, p in _table(data, str(path), str(path)).items()}


def load_prices(user_file: Path | str | None = None, self_hosted: bool = False, *, maintained: bool = True,
                at: datetime | None = None, batch: bool = False) -> PriceTable:
    """The prices: ``user_file``'s over genai-prices' (when installed and ``maintained``) over the shipped
    table's, at the rates in effect at ``at`` (default: now), the batch API's where known when ``batch`` (a
    --batch-api run: its estimate, reservations and spend); every price 0 when ``self_hosted``. genai-prices is
    loaded at the first look-up that needs it, never here."""
    data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    as_of = str(data.get("as_of", ""))
    shipped = _table(data, str(SHIPPED), f"evalsup table {as_of}")
    user = read_user_prices(Path(user_file)) if user_file is not None else None
    return PriceTable(shipped, as_of, self_hosted, user, maintained, at or datetime.now(UTC), batch)
