"""The caps of a whole run (issue 30): --max-cost USD, --max-completion-tokens-total N, --max-total-tokens N; and
how spending against them is said (``budget_text``: the summary, `evalsup status`).

Each is given for the whole run. Under --shard K/N each shard takes its share, the cap divided by N (the shards
run apart and cannot lend to one another); a value written ``X/shard`` is that shard's own cap as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from evalsup.config.options import INT64, INT64_MAX

__all__ = ["CapError", "Caps", "budget_text", "parse_caps"]

PER_SHARD = "/shard"


class CapError(Exception):
    """A cap that cannot be read; the message names the flag."""


@dataclass(frozen=True, slots=True)
class Caps:
    """The caps this process keeps (a shard's share already taken); None: no such cap."""

    cost: float | None = None  # USD
    completion_tokens: int | None = None
    total_tokens: int | None = None  # prompt + completion

    @property
    def any(self) -> bool:
        return self.cost is not None or self.completion_tokens is not None or self.total_tokens is not None

    def to_json(self) -> dict[str, float | int | None]:
        return {"cost": self.cost, "completion_tokens": self.completion_tokens, "total_tokens": self.total_tokens}


def _one(flag: str, value: str | float | None, shards: int, whole: bool) -> float | None:
    if value is None:
        return None
    text = str(value).strip()
    own = text.endswith(PER_SHARD)
    if own:
        text = text[: -len(PER_SHARD)].strip()
    try:
        x: float = int(text) if whole and text.isdigit() else float(text)  # an integer exactly, up to the bound
    except ValueError:
        raise CapError(f"{flag} takes a number (or NUMBER/shard for one shard's own cap), got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise CapError(f"{flag} must be more than 0, got {value!r}")
    if whole and not float(x).is_integer():
        raise CapError(f"{flag} takes a whole number of tokens, got {value!r}")
    if whole and x > INT64_MAX:
        raise CapError(f"{flag} must be at most {INT64_MAX:,} tokens ({INT64.why}), got {value!r}")
    return x if own or shards <= 1 else x / shards


def parse_caps(max_cost: str | float | None, max_completion: str | int | None, max_total: str | int | None,
               shard: tuple[int, int] | None) -> Caps:
    """The caps as given, each divided among the shards unless written NUMBER/shard. Raises CapError."""
    n = shard[1] if shard else 1
    cost = _one("--max-cost", max_cost, n, False)
    comp = _one("--max-completion-tokens-total", max_completion, n, True)
    total = _one("--max-total-tokens", max_total, n, True)
    return Caps(cost, None if comp is None else max(1, int(comp)), None if total is None else max(1, int(total)))


def budget_text(b: dict[str, Any]) -> str:
    """A budget's figures (``Budget.to_json``) in one phrase: spent of each cap, reserved, projected."""
    caps, spent, res, proj = b["caps"], b["spent"], b["reserved"], b.get("projected")
    parts = []
    if caps.get("cost") is not None:
        parts.append(f"${spent['cost_usd']:,.4f} of ${caps['cost']:,.4f}")
    if caps.get("completion_tokens") is not None:
        parts.append(f"{spent['completion_tokens']:,} of {caps['completion_tokens']:,} completion tokens")
    if caps.get("total_tokens") is not None:
        parts.append(f"{spent['prompt_tokens'] + spent['completion_tokens']:,} of {caps['total_tokens']:,} tokens")
    text = "spent " + ", ".join(parts)
    if res.get("requests"):
        text += f"; reserved ${res['cost_usd']:,.4f}, {res['prompt_tokens'] + res['completion_tokens']:,} tokens " \
                f"by {res['requests']:,} request(s) out"
    if proj is not None:
        text += f"; projected for the whole run ${proj['cost_usd']:,.4f}, " \
                f"{proj['prompt_tokens'] + proj['completion_tokens']:,} tokens"
    if b.get("unpriced_results"):
        text += f"; {b['unpriced_results']:,} answer(s) of unknown cost (no price)"
    return text
