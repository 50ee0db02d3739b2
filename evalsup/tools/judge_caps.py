"""The caps of `evalsup score --scorer judge` (issue 43): --max-cost and --max-total-tokens over the judge's spend.

A room, after the run's ``supervisor.budget``: it decides, the rescoring loop acts. Before a record's judge request
goes out, ``affords(need)`` says whether its worst case fits beside what was spent and what is reserved by the
requests out; ``reserve`` holds it, ``settle`` swaps it for what the judge's usage says it cost. A record that does
not fit waits for the requests out; with none out the rescoring stops (exit 75), its scored records kept, and a
rerun with a higher cap goes on from there. The spend of a killed rescoring's kept records (their judge tokens, in
``score_detail.judge.usage``) is where it starts.

Invariants: ``spent + reserved`` never passes a cap while a request is out; a request's reservation is at least
what it can cost (its prompt estimated from the record's bytes, its answer at the judge's max_tokens, else the
model's largest answer, else ``UNBOUNDED_COMPLETION``). No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evalsup.config.caps import CapError, parse_caps
from evalsup.config.prices import Price, PriceError, load_prices

UNBOUNDED_COMPLETION = 4096  # a judge's reply without max_tokens nor a known largest answer: its reservation
BYTES_PER_TOKEN = 2.0  # the prompt's reservation: the template and the record (answer, request) at 2 bytes a token


@dataclass(frozen=True, slots=True)
class Need:
    """One judge request's worst case."""

    prompt: int
    completion: int


@dataclass
class JudgeCaps:
    cost: float | None
    tokens: int | None
    price: Price | None  # the judge model's (None: unpriced, refused with a cost cap)
    max_tokens: int | None  # the judge's max_tokens
    spent_tokens: int = 0
    spent_usd: float = 0.0
    _held: list[Need] = field(default_factory=list)

    def need(self, record_bytes: int, template_bytes: int) -> Need:
        completion = self.max_tokens or (self.price.completion_bound if self.price else None) or UNBOUNDED_COMPLETION
        return Need(int((record_bytes + template_bytes) / BYTES_PER_TOKEN) + 1, completion)

    def _usd(self, prompt: float, completion: float) -> float:
        return self.price.cost(prompt, completion) if self.price is not None else 0.0

    def affords(self, n: Need) -> bool:
        held_tokens = sum(h.prompt + h.completion for h in self._held)
        if self.tokens is not None and self.spent_tokens + held_tokens + n.prompt + n.completion > self.tokens:
            return False
        if self.cost is not None:
            held = sum(self._usd(h.prompt, h.completion) for h in self._held)
            if self.spent_usd + held + self._usd(n.prompt, n.completion) > self.cost:
                return False
        return True

    def reserve(self, n: Need) -> None:
        self._held.append(n)

    def settle(self, n: Need | None, prompt: int, completion: int) -> None:
        """A request came back (``n`` its reservation; None for spend without one: a killed run's kept records)."""
        if n is not None:
            self._held.remove(n)
        self.spent_tokens += prompt + completion
        self.spent_usd += self._usd(prompt, completion)

    def said(self) -> str:
        """What was spent, for the stop's line."""
        parts = [f"{self.spent_tokens:,} judge tokens"]
        if self.price is not None and self.cost is not None:
            parts.append(f"${self.spent_usd:,.4f}")
        return ", ".join(parts)


def caps_for(model: str | None, max_tokens: int | None, max_cost: str | None, max_total: str | None,
             prices_file: Path | None) -> JudgeCaps | None:
    """`evalsup score`'s caps on the judge's spend from its flags (None without one), read as `evalsup run` reads
    its caps; an unpriced judge under --max-cost is refused (ValueError, one line), as `evalsup run` refuses an
    unpriced model."""
    if max_cost is None and max_total is None:
        return None
    try:
        caps = parse_caps(max_cost, None, max_total, None)
        price = load_prices(prices_file).lookup(model)
    except (CapError, PriceError) as e:
        raise ValueError(str(e)) from None
    if caps.cost is not None and price is None:
        raise ValueError(f"--max-cost: no price for the judge's model {model!r}; give its price with --prices FILE "
                         "(or cap tokens with --max-total-tokens)")
    return JudgeCaps(caps.cost, caps.total_tokens, price, max_tokens)
