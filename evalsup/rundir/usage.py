"""What a run's answers have used, read back from results.jsonl (the one source of truth, so right after any
kill): tokens, the cost at the prices given, and the completion lengths seen (issue 30). Streamed: memory flat.

Spend already paid keeps counting when its record leaves results.jsonl: the records `run --retry-failed` moved
to replaced.jsonl and those `evalsup repair` moved to damaged.jsonl (the lines of it that are records) add their
tokens and cost, never their lengths or a record done.

Each answer is priced as it was billed, where its body says so (issue 40): its prompt tokens read from and
written to the provider's prompt cache (OpenAI's ``prompt_tokens_details.cached_tokens`` /
``input_tokens_details``, Anthropic's ``cache_read_input_tokens`` / ``cache_creation_input_tokens``), the
``service_tier`` its response names, and the batch API's rates for a record of a batch (``metrics.batch``), when
the price knows them (``config.prices.Price.variant``: genai-prices' rates).

A resume with a cap (--max-cost, --max-completion-tokens-total, --max-total-tokens) starts its budget from this;
`evalsup estimate` takes the lengths seen for its band.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from evalsup.rundir.layout import DAMAGED, REPLACED
from evalsup.rundir.results_file import iter_records
from evalsup.tasks.tokens import fmt_usd

__all__ = ["Usage", "usage_of_results"]


class Priced(Protocol):
    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0) -> float: ...


def _billed(price: Priced, usage: dict[str, Any], pt: int, ct: int, tier: Any, batch: bool) -> float:
    """An answer's cost as billed: its cached and cache-written prompt tokens, its service tier or the batch
    API's rates, where ``price`` knows them (a ``config.prices.Price``); else its plain tokens."""
    variant = getattr(price, "variant", None)
    if variant is None:
        return price.cost(pt, ct)
    p = variant(tier if isinstance(tier, str) else None, batch)
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens"))
    if read or written:  # Anthropic: input_tokens are the uncached part
        return float(p.cost(pt + read + written, ct, read, written))
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    if isinstance(details, dict):
        read, written = _count(details.get("cached_tokens")), _count(details.get("cache_write_tokens"))
    return float(p.cost(pt, ct, read, written))


@dataclass
class Usage:
    records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    unpriced: int = 0  # answers with usage whose model has no price: their cost is not in ``cost``
    unpriced_models: set[str] | None = None  # (at most a few names, for the message)
    answers: int = 0  # records with a usage
    low: float = math.inf  # completion tokens a choice: the shortest seen, and their sum (for the mean)
    sum_per_choice: float = 0.0
    judge_prompt_tokens: int = 0  # the judge's tokens (with judge_price), in prompt_tokens / completion_tokens too
    judge_completion_tokens: int = 0

    @property
    def seen(self) -> tuple[float, float] | None:
        """(shortest, mean) completion tokens a choice, or None before any answer with usage."""
        return (self.low, self.sum_per_choice / self.answers) if self.answers else None

    def said(self) -> str:
        """What a resume says at its start (issue 40): the answers so far, what they spent and how long they were,
        as read back from results.jsonl, the figures the estimate's band then starts from."""
        if not self.records and not self.prompt_tokens:
            return "resumed: no answer in results.jsonl yet"
        text = (f"resumed: {self.records:,} record(s) so far in results.jsonl; spent {self.prompt_tokens:,} prompt "
                f"and {self.completion_tokens:,} completion tokens")
        names = ", ".join(sorted(self.unpriced_models or ())) or "a model"
        if self.unpriced and not self.cost:
            text += f", cost unknown (no price for {names})"
        else:
            text += f", {fmt_usd(self.cost)}"
            if self.unpriced:
                text += f" plus {self.unpriced:,} answer(s) of unknown cost (no price for {names})"
        seen = self.seen
        if seen is not None:
            text += (f"; their answers were {seen[1]:,.1f} completion tokens on average (shortest {seen[0]:,.0f}), "
                     "which the estimate below assumes")
        return text


def _count(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _reasked(u: Usage, rec: dict[str, Any], body: Any, price_of: Callable[[str | None], Priced | None],
             fallback_model: str | None) -> None:
    """The answers asked again for a JSON schema (``metrics.reask_usage``) were paid beside the record's own: their
    tokens spent, priced as the record's answer (its model, else ``fallback_model``)."""
    metrics = rec.get("metrics")
    ru = metrics.get("reask_usage") if isinstance(metrics, dict) else None
    if not isinstance(ru, dict):
        return
    pt, ct = _count(ru.get("prompt_tokens")), _count(ru.get("completion_tokens"))
    u.prompt_tokens += pt
    u.completion_tokens += ct
    model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else None
    price = price_of(model) if model else None
    if price is None and fallback_model:
        price = price_of(fallback_model)
    if price is not None:
        u.cost += price.cost(pt, ct)


def _taken_out(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The records once in ``run_dir``'s results.jsonl that a rewrite took out: replaced.jsonl's lines, and the
    lines of damaged.jsonl (``{"line", "reason", "raw"}``) whose raw text is a record. Never raises on a line
    that is not one: these files are read for their spend only."""
    for name in (REPLACED, DAMAGED):
        if not (run_dir / name).is_file():
            continue
        with open(run_dir / name, "rb") as f:
            for line in f:
                try:
                    rec = orjson.loads(line)
                    if name == DAMAGED:
                        raw = rec.get("raw") if isinstance(rec, dict) else None
                        rec = orjson.loads(raw) if isinstance(raw, str) else None
                except orjson.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    yield rec


def _all_records(path: Path) -> Iterator[tuple[bool, dict[str, Any]]]:
    """(in results.jsonl, record): the results file's records, then those taken out of it beside it."""
    for _, _, rec in iter_records(path):
        yield True, rec
    for rec in _taken_out(path.parent):
        yield False, rec


def usage_of_results(path: Path, price_of: Callable[[str | None], Priced | None],
                     fallback_model: str | None = None, judge_price: Priced | None = None) -> Usage:
    """The usage of every complete record of ``path`` (none: an empty Usage). A record's cost is priced by the
    model its answer names, else ``fallback_model`` (the run's --model); an answer from the cache is not spend.
    With ``judge_price`` (--scorer judge, a judge model with a price) the judge's tokens of each record
    (``score_detail.judge.usage``) are spent too, as the run's budget counts them; so are the answers asked
    again for a JSON schema (``metrics.reask_usage``), and a hedged answer's other copy (``metrics.hedged``: the
    same usage again, as the budget settles it). The records taken out of ``path`` into replaced.jsonl /
    damaged.jsonl beside it count for the spend only (see the module). Raises RunDirDamaged on a bad line of
    ``path``."""
    u = Usage(unpriced_models=set())
    if not path.is_file():
        return u
    for kept, rec in _all_records(path):
        u.records += kept
        body: Any = (rec.get("response") or {}).get("body")
        _reasked(u, rec, body, price_of, fallback_model)
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            continue
        pt = usage.get("prompt_tokens", usage.get("input_tokens"))
        ct = usage.get("completion_tokens", usage.get("output_tokens"))
        pt = pt if isinstance(pt, int) and not isinstance(pt, bool) else 0
        ct = ct if isinstance(ct, int) and not isinstance(ct, bool) else 0
        # an answer from the cache (--cache: metrics.cache "hit") cost nothing this run; its lengths still count
        metrics = rec.get("metrics") or {}
        paid = metrics.get("cache") != "hit"
        model = body.get("model") if isinstance(body.get("model"), str) else None
        copies = 2 if metrics.get("hedged") else 1  # --hedge: the other copy was paid too, taken to use as much
        if paid:
            u.prompt_tokens += pt * copies
            u.completion_tokens += ct * copies
            price = price_of(model) if model else None
            if price is None and fallback_model:
                price = price_of(fallback_model)
            if price is None:
                u.unpriced += 1
                if u.unpriced_models is not None and len(u.unpriced_models) < 5:
                    u.unpriced_models.add(str(model or fallback_model))
            else:
                u.cost += copies * _billed(price, usage, pt, ct, body.get("service_tier"),
                                           isinstance((rec.get("metrics") or {}).get("batch"), dict))
        if judge_price is not None:
            judge = (rec.get("score_detail") or {}).get("judge")
            ju = judge.get("usage") if isinstance(judge, dict) else None
            if isinstance(ju, dict):
                jp, jc = _count(ju.get("prompt_tokens")), _count(ju.get("completion_tokens"))
                u.judge_prompt_tokens += jp
                u.judge_completion_tokens += jc
                u.prompt_tokens += jp
                u.completion_tokens += jc
                u.cost += judge_price.cost(jp, jc)
        if rec.get("error") is None and kept:
            choices = body.get("choices")
            per = ct / max(1, len(choices) if isinstance(choices, list) else 1)
            u.answers += 1
            u.sum_per_choice += per
            u.low = min(u.low, per)
    return u
