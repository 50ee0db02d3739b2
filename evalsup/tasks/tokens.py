"""A task's token figures before it is sent: its model, the characters of its prompt, its max_tokens, its
choices. Read by the estimate (``evalsup estimate``, the line at a run's start) and by the budget's
reservation (``--max-cost`` and the token caps, supervisor.budget). Pure: no I/O.

Without the endpoint's tokenizer a prompt's tokens are estimated as characters / 4 plus ``PER_MESSAGE`` a chat
message (``approx_prompt_tokens``), always shown as such (≈). A request's worst case is its prompt and
``max_tokens`` a choice. A request with no max_tokens is bounded by the model's largest answer, else its context
window (``config.prices.Price.completion_bound``); with neither known, the estimate says it is unbounded (and its
expected length unknown until answers are seen) rather than make a figure up (issue 40: half of an assumed 4,096
was 585 times the real answers). The budget's reservation still needs a number: ``Figures.max_completion``
takes ``DEFAULT_MAX_OUTPUT`` for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from evalsup.tasks.requests import RequestDefaults, simple_body
from evalsup.tasks.routes import BY_PATH, DEFAULT

CHARS_PER_TOKEN = 4  # the ≈ estimate of a prompt's tokens (English text with BPE tokenizers: 3.5-4.5)
PER_MESSAGE = 4  # tokens a chat message costs beyond its text (role, separators)
DEFAULT_MAX_OUTPUT = 4096  # a request without max_tokens, when the model's largest answer is not known either
PROMPT_BAND = (5, 3)  # the ≈ estimate's low and high ends: characters / 5 and characters / 3
EXPECTED_FRACTION = 0.5  # expected completion without answers seen yet: this fraction of max_tokens
MAX_MODELS = 1000  # distinct models a tally keeps by name (the rest are counted together)
SHAPES = 256  # distinct (choices, max completion) pairs a model keeps, to band its completion at the end
OTHER = "(other models)"

__all__ = ["Figures", "Tally", "approx_prompt_tokens", "figures"]


class Priced(Protocol):
    """A model's price as config.prices.Price has it (tasks imports no config)."""

    @property
    def max_output(self) -> int | None: ...

    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0,
             written_tokens: float = 0.0, requests: float = 1.0) -> float: ...


Lookup = Callable[[str | None], Priced | None]


@dataclass(slots=True)
class Figures:  # (not frozen: made once a task, and a frozen dataclass costs twice as much to make)
    model: str | None
    path: str  # the route, e.g. /v1/chat/completions
    prompt_chars: int  # characters of the prompt's text (messages' content, prompt, input)
    messages: int  # chat messages (0 for a plain prompt)
    max_tokens: int | None  # a choice's max_tokens (max_completion_tokens, max_output_tokens), None: not set
    choices: int  # n (1 when absent); 0 for a route that generates nothing (embeddings)

    @property
    def approx_prompt(self) -> int:
        return approx_prompt_tokens(self.prompt_chars, self.messages)

    def max_completion(self, model_max: int | None) -> int:
        """The most completion tokens this request may cost: max_tokens (else the model's largest answer, else
        DEFAULT_MAX_OUTPUT) for each choice."""
        if not self.choices:
            return 0
        per = self.max_tokens if self.max_tokens is not None else (model_max or DEFAULT_MAX_OUTPUT)
        return per * self.choices


def approx_prompt_tokens(chars: int, messages: int = 0) -> int:
    return max(1, -(-chars // CHARS_PER_TOKEN) + PER_MESSAGE * messages)


def _chars(value: Any) -> int:
    """Characters of a content value's text: a string, or a list of parts ({"text": ...}, {"content": ...},
    strings)."""
    if isinstance(value, str):
        return len(value)
    n = 0
    if isinstance(value, list):
        for part in value:
            if isinstance(part, str):
                n += len(part)
            elif isinstance(part, dict):
                for k in ("text", "content", "input_text"):
                    if k in part:
                        n += _chars(part[k])
    return n


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def figures(obj: dict[str, Any], defaults: RequestDefaults) -> Figures:
    """A validated task line's figures: those of the request it sends (a batch line's body; a simple line's
    messages only, ``requests.simple_body``: its other keys, ``model`` and ``max_tokens`` among them, are its
    record's metadata and never sent), with the run's defaults (--model, --max-tokens) where it sets none."""
    if "custom_id" in obj:
        path = str(obj.get("url", DEFAULT.path))
        body = obj.get("body") or {}
    else:
        path, body = DEFAULT.path, simple_body(obj)
    route = BY_PATH.get(path)
    samples = route is None or route.samples
    messages = body.get("messages")
    chars = n_msgs = 0
    if isinstance(messages, list):
        n_msgs = len(messages)
        for m in messages:
            if isinstance(m, dict):
                chars += _chars(m.get("content"))
    for k in ("prompt", "input", "instructions"):
        if k in body:
            chars += _chars(body[k])
    model = body.get("model") if isinstance(body.get("model"), str) else defaults.model
    mt = None
    for k in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        mt = _int(body.get(k))
        if mt is not None:
            break
    if mt is None and samples:
        mt = defaults.max_tokens
    n = _int(body.get("n")) or 1
    return Figures(model, path, chars, n_msgs, mt, n if samples else 0)


@dataclass
class Band:
    low: float = 0.0
    expected: float = 0.0
    high: float = 0.0

    def add(self, low: float, expected: float, high: float) -> None:
        self.low += low
        self.expected += expected
        self.high += high

    def to_json(self) -> dict[str, float]:
        return {"low": round(self.low), "expected": round(self.expected), "high": round(self.high)}


@dataclass
class ModelTally:
    """One model's part of an estimate: requests, prompt characters and tokens, completion tokens' band."""

    requests: int = 0
    prompt_chars: int = 0
    prompt: Band = field(default_factory=Band)  # counted by the endpoint's tokenizer, or ≈ chars/4 (Tally.exact)
    completion: Band = field(default_factory=Band)  # as each request was added (with the lengths seen then)
    no_max_tokens: int = 0  # requests without max_tokens: bounded by the model's largest answer or context
    unbounded: int = 0  # of those, the requests whose model has no known bound: no high end, say so
    unknown: int = 0  # requests without max_tokens added before any answer was seen: no expected length
    # requests by (choices, most completion tokens (None: unbounded), whether their own max_tokens sets it): the
    # completion band is made from them with the lengths seen when the summary is asked, so lengths learnt after
    # the pass (a resume's results, the cache's answers) count for every request; None past SHAPES of them (then
    # ``completion`` is the band)
    shapes: dict[tuple[int, int | None, bool], float] | None = field(default_factory=dict)


@dataclass
class Tally:
    """An estimate's sums, in constant memory (at most MAX_MODELS models by name): fed one request at a time.

    ``seen`` is what earlier answers of this run showed, (min, mean) completion tokens a choice: the low end
    is then the shortest seen and the expected the mean, instead of 0 and EXPECTED_FRACTION of max_tokens."""

    seen: tuple[float, float] | None = None
    models: dict[str, ModelTally] = field(default_factory=dict)
    requests: int = 0
    exact: int = 0  # requests whose prompt tokens the endpoint counted

    def add(self, f: Figures, model_max: int | None, prompt_tokens: int | None = None, counted: bool = True) -> None:
        """Count one request. ``prompt_tokens``: the endpoint's tokenizer's count (``counted``), or a figure scaled
        from its counts of other requests (not ``counted``: banded as the ≈ estimate is); None: ≈ chars/4."""
        name = f.model or "(no model)"
        if name not in self.models and len(self.models) >= MAX_MODELS:
            name = OTHER
        t = self.models.setdefault(name, ModelTally())
        t.requests += 1
        self.requests += 1
        t.prompt_chars += f.prompt_chars
        if prompt_tokens is not None and counted:
            self.exact += 1
            t.prompt.add(prompt_tokens, prompt_tokens, prompt_tokens)
        else:  # ≈: chars/4, between chars/5 and chars/3 (PROMPT_BAND); a scaled count the same way around it
            mid = f.approx_prompt if prompt_tokens is None else prompt_tokens
            over = PER_MESSAGE * f.messages
            t.prompt.add(max(0.0, (mid - over) * CHARS_PER_TOKEN / PROMPT_BAND[0]) + over / 2, mid,
                         (mid - over) * CHARS_PER_TOKEN / PROMPT_BAND[1] + over)
        if not f.choices:
            return  # (embeddings: no completion)
        own = f.max_tokens is not None
        # without max_tokens: the model's largest answer or context, else nothing bounds it (None)
        high = f.max_completion(model_max) if own or model_max is not None else None
        key = (f.choices, high, own)
        if t.shapes is not None:
            if key not in t.shapes and len(t.shapes) >= SHAPES:
                t.shapes = None
            else:
                t.shapes[key] = t.shapes.get(key, 0) + 1
        if not own:
            t.no_max_tokens += 1
            t.unknown += self.seen is None
        t.unbounded += high is None
        low, expected = _band_of(f.choices, high, own, self.seen)
        t.completion.add(low, expected, high or 0.0)

    def scaled(self, left: float) -> Tally:
        """The same estimate for a ``left`` fraction of its requests (a resume: what is still to be sent)."""
        out = Tally(self.seen, {}, round(self.requests * left), round(self.exact * left))
        for name, t in self.models.items():
            p, c = t.prompt, t.completion
            out.models[name] = ModelTally(round(t.requests * left), round(t.prompt_chars * left),
                                          Band(p.low * left, p.expected * left, p.high * left),
                                          Band(c.low * left, c.expected * left, c.high * left),
                                          round(t.no_max_tokens * left), round(t.unbounded * left),
                                          round(t.unknown * left),
                                          None if t.shapes is None else {k: n * left for k, n in t.shapes.items()})
        return out

    def summary(self, lookup: Lookup) -> dict[str, Any]:
        """Requests, prompt and completion tokens and the cost, each as a low / expected / high band, by model and
        in all. A model with no price says so (``unpriced``) and its cost is left out of the total (``cost`` is
        then a lower bound, and ``cost_complete`` false): never counted as free. Requests with nothing to bound
        their answers (``unbounded``: no max_tokens, no known limit of the model) leave ``high`` None, and
        ``expected`` too while no answer was seen (``unknown``)."""
        prompt, completion, cost = Band(), Band(), Band()
        by_model: dict[str, Any] = {}
        unpriced: list[str] = []
        unbounded: list[str] = []
        unknown = False
        for name, t in self.models.items():
            price = lookup(None if name in ("(no model)", OTHER) else name)
            co, t_unbounded, t_unknown = self._completion(t)
            row: dict[str, Any] = {"requests": t.requests, "prompt_tokens": t.prompt.to_json(),
                                   "completion_tokens": _band(co, t_unbounded, t_unknown)}
            if t.no_max_tokens:
                row["no_max_tokens"] = t.no_max_tokens
            if t_unbounded:
                row["unbounded"] = max(1, t.unbounded)
                unbounded.append(name)
            unknown = unknown or t_unknown
            prompt.add(t.prompt.low, t.prompt.expected, t.prompt.high)
            completion.add(co.low, co.expected, co.high)
            if price is None:
                unpriced.append(name)
                row["cost_usd"] = None
            else:
                pr, n = t.prompt, max(1, t.requests)
                c = Band(price.cost(pr.low, co.low, requests=n), price.cost(pr.expected, co.expected, requests=n),
                         price.cost(pr.high, co.high, requests=n))
                cost.add(c.low, c.expected, c.high)
                row["cost_usd"] = _money(c, t_unbounded, t_unknown)
            by_model[name] = row
        return {
            "requests": self.requests,
            "prompt_tokens": prompt.to_json(),
            "prompt_tokens_counted": "endpoint" if self.requests and self.exact == self.requests else
            ("partly endpoint" if self.exact else "approx chars/4"),
            "completion_tokens": _band(completion, bool(unbounded), unknown),
            "completion_from": "seen" if self.seen is not None else f"{EXPECTED_FRACTION:g} x max_tokens",
            "cost_usd": _money(cost, bool(unbounded), unknown),
            "cost_complete": not unpriced,
            "unpriced": unpriced,
            "unbounded": unbounded,  # models with requests that nothing bounds (set --max-tokens)
            "models": by_model,
        }


    def _completion(self, t: ModelTally) -> tuple[Band, bool, bool]:
        """A model's completion band with the lengths seen now, whether some of its requests are unbounded, and
        whether its expected length is unknown (unbounded requests, no answer seen)."""
        if t.shapes is None:
            return t.completion, t.unbounded > 0, t.unknown > 0
        out = Band()
        unbounded = unknown = False
        for (c, h, own), n in t.shapes.items():
            if n <= 0:
                continue
            unbounded = unbounded or h is None
            unknown = unknown or (not own and self.seen is None)
            low, expected = _band_of(c, h, own, self.seen)
            out.add(n * low, n * expected, n * (h or 0.0))
        return out, unbounded, unknown


def _band_of(choices: int, high: int | None, own: bool, seen: tuple[float, float] | None) -> tuple[float, float]:
    """One request's (low, expected) completion tokens: from the lengths seen (at most its high end), else 0 and
    EXPECTED_FRACTION of its own max_tokens; without max_tokens and nothing seen, no expected figure (0, said
    unknown): half of a model's largest answer is no estimate of an answer."""
    if seen is not None:
        cap = math.inf if high is None else high
        return min(seen[0] * choices, cap), min(seen[1] * choices, cap)
    return 0.0, (high * EXPECTED_FRACTION if own and high is not None else 0.0)


def _band(b: Band, unbounded: bool, unknown: bool) -> dict[str, float | None]:
    out: dict[str, float | None] = dict(b.to_json())
    if unbounded:
        out["high"] = None
    if unknown:
        out["expected"] = None
    return out


def _money(b: Band, unbounded: bool, unknown: bool) -> dict[str, float | None]:
    out: dict[str, float | None] = {k: round(getattr(b, k), 4) for k in ("low", "expected", "high")}
    if unbounded:
        out["high"] = None
    if unknown:
        out["expected"] = None
    return out


def fmt_tokens(x: float) -> str:
    return f"{x:,.0f}" if x < 1e6 else f"{x / 1e6:,.1f}M" if x < 1e9 else f"{x / 1e9:,.2f}B"


def fmt_usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 0.1 else f"${x:,.4f}"


def _models(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} other(s)" if len(names) > 3 else "")


def one_line(s: dict[str, Any]) -> str:
    """An estimate's summary (``Tally.summary``) in one sentence, as a run says it at its start and
    `evalsup estimate` under its head: the requests, their prompt, how long their answers may be and what
    bounds them, and the cost."""
    p, c, cost = s["prompt_tokens"], s["completion_tokens"], s["cost_usd"]
    counted = s["prompt_tokens_counted"] == "endpoint"
    text = f"{s['requests']:,} requests; prompts " + (
        f"{fmt_tokens(p['expected'])} tokens in all (counted by the endpoint)" if counted else
        f"≈ {fmt_tokens(p['expected'])} tokens in all (characters / 4)")
    unbounded = [m for m in s.get("unbounded") or [] if m in s["models"]]
    n_unbounded = sum(s["models"][m].get("unbounded", 0) for m in unbounded)
    seen = str(s["completion_from"]).startswith("seen")
    why = "the mean length of the answers seen so far" if seen else \
        f"{'half' if EXPECTED_FRACTION == 0.5 else EXPECTED_FRACTION} of max_tokens: no answer seen yet"
    no_max = sum(m.get("no_max_tokens", 0) for m in s["models"].values())
    if c["expected"] is None and c["high"] is None:  # unbounded, nothing seen: no figure to give
        text += (f"; answers of unknown length: {n_unbounded:,} request(s) of {_models(unbounded)} have no "
                 "max_tokens and no known limit (unbounded: set --max-tokens)")
    elif c["expected"] is None:
        text += (f"; answers at most {fmt_tokens(c['high'])} tokens in all, their length unknown until some are "
                 f"seen ({no_max:,} request(s) without max_tokens, bounded only by the model's largest answer or "
                 "context: set --max-tokens for a closer bound)")
    elif c["high"] is None:
        text += (f"; answers ≈ {fmt_tokens(c['expected'])} tokens in all ({why}), with no upper bound: "
                 f"{n_unbounded:,} request(s) of {_models(unbounded)} have no max_tokens and no known limit "
                 "(set --max-tokens)")
    else:
        text += (f"; answers at most {fmt_tokens(c['high'])} tokens in all, ≈ {fmt_tokens(c['expected'])} expected "
                 f"({why})")
    if s["unpriced"] and len(s["unpriced"]) == len(s["models"]):
        return text + f"; cost unknown: no price for {_models(s['unpriced'])}"
    if cost["high"] == 0 and not s["unpriced"]:
        return text + "; no cost"
    expected = "" if cost["expected"] is None else f", ≈ {fmt_usd(cost['expected'])} expected"
    if cost["high"] is None:
        text += f"; cost at least {fmt_usd(cost['low'])}, no upper bound{expected}"
    else:
        text += f"; cost {fmt_usd(cost['low'])} to {fmt_usd(cost['high'])}{expected}"
    if s["unpriced"]:
        text += f", plus the unknown cost of {_models(s['unpriced'])} (no price)"
    return text


def start_line(s: dict[str, Any], what: str, prices: str, cached: str = "") -> str:
    """The estimate a run says at its start: ``one_line`` for ``what`` ("this run", "the lines not yet read"),
    what the cache answers (``cached``), where the prices come from (unless nothing is to be paid) and, for a
    prompt estimated from its characters, how to have it counted."""
    text = f"estimate for {what}: {one_line(s)}{cached}."
    if not (s["cost_usd"]["high"] == 0 and not s["unpriced"]):  # (self-hosted: nothing to pay, nothing to say)
        text += f" Prices: {prices}."
        if s["prompt_tokens_counted"] != "endpoint":
            text += " `evalsup estimate --base-url URL` counts prompts with the endpoint's own tokenizer."
    return text
