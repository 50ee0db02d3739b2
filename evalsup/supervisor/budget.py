"""The run's budget (issue 30): what has been spent, what the requests out reserve, and whether the next request
may go without passing a cap (--max-cost, --max-completion-tokens-total, --max-total-tokens). A room: it decides
and holds figures; the arbiter's dispatch asks it (``would_exceed``), reserves when it hands a task out and
settles when the result comes (and spends the judge's tokens then, ``spend``, when the judge has a price).
No I/O, no clock.

A request reserves its worst case when it is handed out: its prompt (≈ chars/4, tasks.tokens) and max_tokens a
choice (the model's largest answer without one), priced. Its result settles it: the reservation goes, the
usage the worker read (``ResultMeta`` pt/ct) is spent, priced as reserved. A task handed back unanswered (a
worker gone, a DRAIN) releases its reservation and spends nothing.

Invariants (tests/unit/test_budget.py drives random sequences against a plain model):
1. ``reserved`` is the sum of the open reservations, one per key at most; ``reservations`` their count.
2. ``spent`` only grows: by each settled result's usage, never by a reservation released.
3. ``would_exceed(a)`` names a cap that spent + reserved + a passes, and only then; with no cap it is None.
4. While every answer's usage stays within its reservation, spent + reserved never passes a cap that dispatch
   respected: spent <= cap at any moment, and the overshoot of a cap is at most what the requests out used
   beyond their reservations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from evalsup.config.caps import Caps

__all__ = ["Amount", "Budget"]


class Priced(Protocol):
    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0) -> float: ...


@dataclass(slots=True)
class Amount:
    """Tokens and dollars (``cost`` None: the model has no price). Treated as a value: never changed once made
    (not frozen only because a frozen dataclass costs twice as much to make, once a task)."""

    prompt: int = 0
    completion: int = 0
    cost: float | None = 0.0

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def __add__(self, o: Amount) -> Amount:
        cost = None if self.cost is None or o.cost is None else self.cost + o.cost
        return Amount(self.prompt + o.prompt, self.completion + o.completion, cost)


def priced(prompt: int, completion: int, price: Priced | None) -> Amount:
    return Amount(prompt, completion, None if price is None else price.cost(prompt, completion))


class Budget:
    """Spent and reserved against the caps (``Caps``; a shard's share already taken)."""

    def __init__(self, caps: Caps, spent: Amount | None = None, unpriced: int = 0) -> None:
        self.caps = caps
        self.spent_prompt = spent.prompt if spent else 0
        self.spent_completion = spent.completion if spent else 0
        self.spent_cost = (spent.cost or 0.0) if spent else 0.0
        self.unpriced = unpriced  # results whose cost is unknown (a model with no price): not in spent_cost
        self.settled = 0  # results settled this session (the projection's average is over them)
        self.session_prompt = self.session_completion = 0  # spent this session
        self.session_cost = 0.0
        self._open: dict[int, tuple[Amount, Priced | None]] = {}
        self.res_prompt = self.res_completion = 0
        self.res_cost = 0.0

    # ----- figures -----

    @property
    def spent(self) -> Amount:
        return Amount(self.spent_prompt, self.spent_completion, self.spent_cost)

    @property
    def reserved(self) -> Amount:
        return Amount(self.res_prompt, self.res_completion, self.res_cost)

    @property
    def reservations(self) -> int:
        return len(self._open)

    # ----- decisions -----

    def would_exceed(self, a: Amount) -> str | None:
        """The first cap that spent + reserved + ``a`` would pass ("cost", "completion_tokens",
        "total_tokens"), or None. An amount of unknown cost under --max-cost passes it (never taken as free)."""
        c = self.caps
        if c.cost is not None and (a.cost is None or self.spent_cost + self.res_cost + a.cost > c.cost + 1e-12):
            return "cost"
        if c.completion_tokens is not None and \
                self.spent_completion + self.res_completion + a.completion > c.completion_tokens:
            return "completion_tokens"
        if c.total_tokens is not None and \
                self.spent_prompt + self.spent_completion + self.res_prompt + self.res_completion + a.total \
                > c.total_tokens:
            return "total_tokens"
        return None

    # ----- moves -----

    def reserve(self, key: int, a: Amount, price: Priced | None) -> None:
        """A request handed out (key: its task's key) reserves ``a``, its worst case."""
        if key in self._open:
            self.release(key)
        self._open[key] = (a, price)
        self.res_prompt += a.prompt
        self.res_completion += a.completion
        self.res_cost += a.cost or 0.0

    def release(self, key: int) -> None:
        """A task handed back unanswered: its reservation goes, nothing is spent."""
        got = self._open.pop(key, None)
        if got is None:
            return
        a = got[0]
        self.res_prompt -= a.prompt
        self.res_completion -= a.completion
        self.res_cost = max(0.0, self.res_cost - (a.cost or 0.0)) if self._open else 0.0

    def settle(self, key: int, prompt: int, completion: int, price: Priced | None = None) -> Amount:
        """A result's usage: its reservation goes and the usage is spent, priced as the reservation was (or at
        ``price`` for a result that had none). Returns what was spent."""
        got = self._open.get(key)
        if got is not None:
            price = got[1]
            self.release(key)
        prompt, completion = max(0, prompt), max(0, completion)
        cost = None if price is None else price.cost(prompt, completion)
        self.spent_prompt += prompt
        self.spent_completion += completion
        self.session_prompt += prompt
        self.session_completion += completion
        if cost is None:
            self.unpriced += 1
        else:
            self.spent_cost += cost
            self.session_cost += cost
        self.settled += 1
        return Amount(prompt, completion, cost)

    def spend(self, prompt: int, completion: int, price: Priced) -> Amount:
        """Usage that had no reservation of its own, spent when it is known: the judge's tokens of a task
        (--scorer judge, a judge model with a price), settled with the task's result. Not a result: the
        projection's mean a task takes it in, the count of results does not."""
        prompt, completion = max(0, prompt), max(0, completion)
        cost = price.cost(prompt, completion)
        self.spent_prompt += prompt
        self.spent_completion += completion
        self.session_prompt += prompt
        self.session_completion += completion
        self.spent_cost += cost
        self.session_cost += cost
        return Amount(prompt, completion, cost)

    # ----- what a person sees -----

    def projection(self, left: int | None) -> Amount | None:
        """What the whole run will have spent when the ``left`` tasks not yet answered are: spent + the mean of
        this session's results x left (None before any result, or with no count of what is left)."""
        if left is None or not self.settled:
            return None
        n = self.settled
        return Amount(self.spent_prompt + round(self.session_prompt / n * left), self.spent_completion
                      + round(self.session_completion / n * left), self.spent_cost + self.session_cost / n * left)

    def to_json(self, left: int | None = None) -> dict[str, Any]:
        """The budget's figures: summary.json, the checkpoint's counters (status reads them), the progress."""
        proj = self.projection(left)
        return {
            "caps": self.caps.to_json(),
            "spent": {"prompt_tokens": self.spent_prompt, "completion_tokens": self.spent_completion,
                      "cost_usd": round(self.spent_cost, 6)},
            "reserved": {"requests": self.reservations, "prompt_tokens": self.res_prompt,
                         "completion_tokens": self.res_completion, "cost_usd": round(self.res_cost, 6)},
            "unpriced_results": self.unpriced,
            "projected": None if proj is None else {"prompt_tokens": proj.prompt, "completion_tokens": proj.completion,
                                                    "cost_usd": round(proj.cost or 0.0, 6)},
        }
