"""What a run's answers have used, read back from results.jsonl (the one source of truth, so right after any
kill): tokens, the cost at the prices given, and the completion lengths seen (issue 30). Streamed: memory flat.

Spend already paid keeps counting when its record leaves results.jsonl: the records `run --retry-failed` moved
to replaced.jsonl and those `evalsup repair` moved to damaged.jsonl (the lines of it that are records) add their
tokens and cost, never their lengths or a record done.

Each answer is priced as it was billed, where its body says so (issue 40): its prompt tokens read from and
written to the provider's prompt cache (OpenAI's ``prompt_tokens_details.cached_tokens`` /
``input_tokens_details``, Anthropic's ``cache_read_input_tokens`` / ``cache_creation_input_tokens``: read by
``tasks.billed``), the ``service_tier`` its response names (else the one its request asked, which the worker wrote
as ``metrics.service_tier``), and the batch API's rates for a record of a batch (``metrics.batch``; not the
answer of the online request ``--batch-fallback online`` sent after it: ``tasks.billed.by_batch``), when the
price knows them (``config.prices.Price.variant``: genai-prices' rates); Anthropic's 1-hour cache writes
(``cache_creation.ephemeral_1h_input_tokens``) at their own rate. ``answer_cost`` is that pricing, and the run's
budget settles each result with it too, from the same counts in the RESULT's meta: the live spend and this
read-back are one figure. So is the model an answer is priced by (``billed_price``): the model its response
names (the dated snapshot the provider billed: ``gpt-4o`` asked, ``gpt-4o-2024-08-06`` answered) when a price
is known for it, else the request's (``metrics.model`` when the task named its own, else the run's --model).

A resume with a cap (--max-cost, --max-completion-tokens-total, --max-total-tokens) starts its budget from this,
the snapshots each model answered as and was billed at among it (``Usage.answered_as``: its tasks reserve at the
dearest, as they did live) and the models that answered (``Usage.answered``: their tasks go without waiting for a
first answer, reserved at their own price and not at their snapshots' dearest);
`evalsup estimate` takes the lengths seen for its band.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload

import orjson

from evalsup.rundir.layout import DAMAGED, REPLACED
from evalsup.rundir.results_file import iter_records
from evalsup.tasks.billed import NOTHING, Billed, billed, by_batch, count, tier_of
from evalsup.tasks.tokens import fmt_usd

__all__ = ["Usage", "answer_cost", "billed_price", "keep", "note_snapshot", "usage_of_results"]

MAX_MODELS = 1_000  # models asked a run keeps by name (answered_as, answered): a few a run; bounded all the same

K = TypeVar("K")
V = TypeVar("V")


@overload
def keep(kept: set[K], name: K) -> None: ...


@overload
def keep(kept: dict[K, V], name: K, value: V) -> None: ...


def keep(kept: set[Any] | dict[Any, Any], name: Any, value: Any = None) -> None:
    """Add ``name`` to ``kept`` (with ``value``, to a dict) while it holds fewer than MAX_MODELS names: what a run
    keeps by model name stays bounded, and once full it changes no more (a name a full dict holds keeps its
    value)."""
    if len(kept) < MAX_MODELS:
        if isinstance(kept, set):
            kept.add(name)
        else:
            kept[name] = value


class Priced(Protocol):
    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0,
             written_tokens: float = 0.0, requests: float = 1.0, written_1h_tokens: float = 0.0) -> float: ...


P = TypeVar("P")


def billed_price(price_of: Callable[[str | None], P | None], answered: str | None, asked: str | None) -> P | None:
    """The price an answer is billed at, the one rule of the live budget and the read-back: the model its
    response names (``answered``: a provider bills the snapshot that served it, ``gpt-4o-2024-08-06`` for a
    request asking ``gpt-4o``, whose rates may differ from the alias's) when a price is known for it, else the
    model the request asked (``asked``); None: neither has a price. A price the user gave for the model asked
    (--prices FILE, ``Price.given``) wins over another source's for the snapshot (what they say they pay), not
    over one they gave for the snapshot itself."""
    mine = price_of(asked) if asked else None
    if answered and answered != asked:
        p = price_of(answered)
        if p is not None and (getattr(p, "given", False) or not getattr(mine, "given", False)):
            return p
    return mine


def note_snapshot(answered_as: dict[str, str], asked: str, answered: str,
                  price_of: Callable[[str | None], Priced | None], prompt: int, completion: int) -> None:
    """Note that the model ``asked`` answered as ``answered`` and was billed at its price (``billed_price``
    chose it), so its next tasks reserve at the dearer of the two (``supervisor.budget.TaskCosts``). An alias
    that answered as several snapshots keeps the dearest: a new one replaces the one kept only when it costs
    more for these tokens (the answer's: ``prompt``, ``completion``). The live budget and the read-back of a
    resume note the same pairs in the same order (results.jsonl's), so both keep the same name."""
    kept = answered_as.get(asked)
    if kept == answered or (kept is None and len(answered_as) >= MAX_MODELS):
        return
    if kept is not None:
        old, new = price_of(kept), price_of(answered)
        if old is not None and (new is None or new.cost(prompt, completion) <= old.cost(prompt, completion)):
            return
    answered_as[asked] = answered


def answer_cost(price: Priced, answer: Billed, tier: str | None = None, batch: bool = False, copies: int = 1,
                reasks: Billed = NOTHING, reask_requests: int = 1) -> float:
    """What one task's answers cost, priced as billed: the one pricing of spend, the run's budget settling a
    RESULT (``supervisor.budget``, from the meta's counts) and this read-back (from the record's body) alike.

    ``answer``: the record's answer (``tasks.billed``: its cached and cache-written prompt tokens, the 1-hour
    writes among them), at the rates of
    its service tier ``tier`` or the batch API's (``batch``) where ``price`` knows them (``Price.variant``:
    genai-prices' rates), ``copies`` times (2: --hedge sent a second copy, taken to use as much); ``reasks``: the
    answers asked again for a JSON schema (``reask_requests`` of them), at the plain rates (their bodies are not
    kept). A long-prompt rate applies by a request's prompt (the re-asks' by their mean), never by a sum."""
    variant = getattr(price, "variant", None)
    p: Priced = variant(tier, batch) if variant is not None else price
    out = 0.0
    if answer.prompt or answer.completion:
        out += copies * p.cost(answer.prompt, answer.completion, answer.cached, answer.written,
                               written_1h_tokens=answer.written_1h)
    if reasks.prompt or reasks.completion:
        out += price.cost(reasks.prompt, reasks.completion, requests=max(1, reask_requests))
    return out


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
    # {model asked: the dearest snapshot it answered as and was billed at} (``note_snapshot``), and the models
    # asked that answered at all: a resume's budget starts knowing them (``supervisor.budget.Budget.learn``)
    answered_as: dict[str, str] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)

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
    model its answer names when it has a price, else its request's (``billed_price``: ``metrics.model``, written
    when the task named a model of its own, else ``fallback_model``, the run's --model); an answer from the cache
    is not spend.
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
        body = body if isinstance(body, dict) else {}
        metrics = rec.get("metrics")
        metrics = metrics if isinstance(metrics, dict) else {}
        usage = body.get("usage")
        answer = billed(usage)
        ru = metrics.get("reask_usage")  # the answers asked again for a JSON schema: paid beside the record's own
        reasks = Billed(count(ru.get("prompt_tokens")), count(ru.get("completion_tokens"))) \
            if isinstance(ru, dict) else NOTHING
        # an answer from the cache (--cache: metrics.cache "hit") cost nothing this run; its lengths still count
        paid = isinstance(usage, dict) and metrics.get("cache") != "hit"
        spent = answer if paid else NOTHING
        copies = 2 if metrics.get("hedged") else 1  # --hedge: the other copy was paid too, taken to use as much
        model = body.get("model") if isinstance(body.get("model"), str) else None
        asked = metrics.get("model") if isinstance(metrics.get("model"), str) else fallback_model
        price = billed_price(price_of, model, asked) if paid or reasks != NOTHING or isinstance(usage, dict) \
            else None
        if isinstance(usage, dict) and asked:  # what the budget learns as it settles the same answer
            keep(u.answered, asked)
            if model and model != asked and price is not None and price != price_of(asked):
                note_snapshot(u.answered_as, asked, model, price_of, copies * spent.prompt + reasks.prompt,
                              copies * spent.completion + reasks.completion)
        if paid or reasks != NOTHING:
            u.prompt_tokens += copies * spent.prompt + reasks.prompt
            u.completion_tokens += copies * spent.completion + reasks.completion
            if price is not None:
                # the tier the response names, else the one the request asked (the worker wrote it in metrics)
                tier = tier_of(body) or tier_of(metrics)
                u.cost += answer_cost(price, spent, tier, by_batch(metrics.get("batch")), copies, reasks,
                                      count(metrics.get("reasks")))
            elif paid:
                u.unpriced += 1
                if u.unpriced_models is not None and len(u.unpriced_models) < 5:
                    u.unpriced_models.add(str(model or asked))
        if judge_price is not None:
            judge = (rec.get("score_detail") or {}).get("judge")
            ju = judge.get("usage") if isinstance(judge, dict) else None
            if isinstance(ju, dict):
                jp, jc = count(ju.get("prompt_tokens")), count(ju.get("completion_tokens"))
                u.judge_prompt_tokens += jp
                u.judge_completion_tokens += jc
                u.prompt_tokens += jp
                u.completion_tokens += jc
                u.cost += judge_price.cost(jp, jc)
        if isinstance(usage, dict) and rec.get("error") is None and kept:
            choices = body.get("choices")
            per = answer.completion / max(1, len(choices) if isinstance(choices, list) else 1)
            u.answers += 1
            u.sum_per_choice += per
            u.low = min(u.low, per)
    return u
