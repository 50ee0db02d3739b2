"""The run's budget (issues 30, 40): what has been spent, what the tasks out reserve, and whether the next task may
go without passing a cap (--max-cost, --max-completion-tokens-total, --max-total-tokens). A room: it decides and
holds figures, and the arbiter acts on what it says. Dispatch asks ``afford`` before it hands a task out (go, wait
for the tasks out to settle, or stop the run: the words said are made here); a result settles its task
(``settle_result``: the answer, the answers asked again, the hedge's second copy, the judge's call); a task handed
back unanswered releases its reservation (``release``). No I/O, no clock.

A task reserves everything it may cost before it is sent (``TaskCosts.worst``): its request (its prompt ≈ chars/4,
tasks.tokens, and max_tokens a choice, the model's largest answer without one), a hedge's second copy of it
(--hedge), the answers asked again for a JSON schema (at most --max-reasks, each with the conversation so far), and
the judge's call (--scorer judge: the template, the task's prompt and answer, the judge's max_tokens, at the judge's
price; a Claude judge's prompt at its input rate, as evalsup's own request marks no cache, unless the run learned
unasked writes); a request that asks for a service tier is reserved at the dearer of its tier's rates and the
standard ones; every prompt token at the dearest rate it may be billed at: input, or a 5-minute or a 1-hour cache
write where its provider may write. Anthropic writes only where the request marks it, so a Claude model's prompt
(``Price.writes_marked``) is at the write rates only when its line has a ``cache_control`` key or a Bedrock
``cachePoint`` block (the 1-hour rate only with a ``"ttl": "1h"``: ``cache_marks``), until an answer is billed
writes its reservation did not allow (a gateway marking requests itself): every later prompt at the dearest then
(``Learned.unasked_writes``, kept in the checkpoint's counters, which every later session reads back,
``unasked_in``, and writes again, a session with no cap too). A model that answered as another (``gpt-4o`` as
``gpt-4o-2024-08-06``) at the dearer of the two once one answer said so (the dearest snapshot when it
answered as several; a resume learns them from results.jsonl, ``learn``); before any answer of it came back
(``Learned.seen``), at the dearest of its own price and its snapshots' that a price source names
(``config.prices.PriceTable.snapshots``). That rule is what keeps a --batch-api run's first batch within the cap
(a first answer takes hours there: its tasks do not wait for one). Online it applies too, and costs little: under
--max-cost one task of a model goes alone until a result of it settles (``first_answer``, one round trip), so
only that task is reserved at the dearest snapshot, and the tasks that go after a first result that was a
failure (no answer named a snapshot) are covered too. Its result settles it: the reservation goes, the usage the worker
read (``ResultMeta`` pt/ct, rpt/rct, jpt/jct) is spent, priced as billed (``rundir.usage.answer_cost`` at
``billed_price``, the pricing a resume reads results.jsonl back with: the model the response names (md) when it
has a price, else the request's; the prompt tokens the provider's cache served (cr) and wrote (cw, w1 of them
for an hour) at their rates, the service tier the response named or the request asked (tr), a provider batch's
answer at the batch API's rates (bt)); a hedged task spends its answer's usage twice (the other copy's usage is
not read back: the same request, taken to use as much).

Invariants (tests/unit/test_budget.py drives random sequences against a plain model):
1. ``reserved`` is the sum of the open reservations, one per key at most; ``reservations`` their count.
2. ``spent`` only grows: by each settled result's usage, never by a reservation released.
3. ``would_exceed(a)`` names a cap that spent + reserved + a passes, and only then; with no cap it is None.
4. While every task's usage stays within its reservation, spent + reserved never passes a cap that dispatch
   respected: spent <= cap at any moment, and the overshoot of a cap is at most what the tasks out used beyond
   their reservations (after a kill -9: what was on the wire, whose answers no record holds).
5. ``afford`` says WAIT only while a reservation is open, and then ``waiting`` holds until a settle or a release
   (which say so: dispatch looks again); STOP only with none open; GO reserves.
6. With ``first_answer`` (under --max-cost), a model asked with a price and no result settled yet has at most one
   reservation open; its first result (any: a failure too) or that task handed back lets the next go.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from evalsup.config.caps import Caps
from evalsup.rundir.usage import MAX_MODELS, answer_cost, billed_price, keep, note_snapshot
from evalsup.scoring.judge import DEFAULT_TEMPLATE
from evalsup.tasks.billed import NOTHING, Billed, count, tier_of
from evalsup.tasks.requests import RequestDefaults, simple_body
from evalsup.tasks.response_schema import schema_of_request
from evalsup.tasks.tokens import CHARS_PER_TOKEN, DEFAULT_MAX_OUTPUT, PER_MESSAGE, figures, fmt_tokens, fmt_usd

__all__ = ["Amount", "Budget", "Decision", "Learned", "TaskCosts", "Verdict", "carried", "unasked_in"]

# A re-ask's user turn (worker.reask.REASK_PROMPT) with the validation error in it: its tokens beyond the answer it
# may quote (the answer itself is counted apart, twice: as the assistant's turn and in the error)
REASK_TURN = 256
# the budget's figures (summary.json) and the checkpoint's counters say so once an answer was billed cache writes
# its request did not ask for: every later session reads it back from the checkpoint (``unasked_in``) and writes
# it again, with a cap or without, so a session with no cap in between does not make the run forget it
UNASKED = "unasked_cache_writes"


# the cache writes a reservation allows every prompt token to be billed as (``most``): none (the input rate),
# the 5-minute kind (Anthropic's 1.25x), the 1-hour kind too (2x)
NO_WRITES, WRITES_5M, WRITES_1H = 0, 1, 2
# a mark's key in JSON text: Anthropic's ``cache_control`` or Bedrock Converse's ``cachePoint`` block (or a string
# that is one of them: a dearer reservation, never a cheaper one); one regex scan: 1.4-1.5 us on a 5 KB task, where
# the one ``in`` of ``cache_control`` took 1.0-1.4 and an ``in`` for each key takes 2.4-3.4
_MARK = re.compile(rb'"cache(?:_control|Point)"')
_HOUR = re.compile(rb'"ttl"\s*:\s*"1h"')


class Priced(Protocol):
    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0,
             written_tokens: float = 0.0, requests: float = 1.0, written_1h_tokens: float = 0.0) -> float: ...

    @property
    def max_output(self) -> int | None: ...

    @property
    def writes_marked(self) -> bool: ...  # (``config.prices.Price.writes_marked``: a Claude model's)


class Verdict(enum.Enum):
    """What dispatch does with the next task (``Budget.afford``)."""

    GO = "go"  # reserved: hand it out
    WAIT = "wait"  # it would pass a cap, but tasks are out: put it back first in line, look again as they settle
    STOP = "stop"  # it would pass a cap with nothing out: the run stops (exit 75, exit_reason budget)
    UNPRICED = "unpriced"  # its model has no price under --max-cost: the run stops (exit 2)


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    say: str = ""  # the line for a stop
    cap: str | None = None  # the cap it would pass ("cost", "completion_tokens", "total_tokens")


@dataclass(slots=True)
class Amount:
    """Tokens and dollars (``cost`` None: the model has no price). Treated as a value: never changed once made
    (not frozen only because a frozen dataclass costs twice as much to make, once a task). A reservation's
    ``writes`` says which cache writes its cost allows its answer (``most``): ``settle_result`` learns from an
    answer billed writes beyond them (``Learned.unasked_writes``)."""

    prompt: int = 0
    completion: int = 0
    cost: float | None = 0.0
    writes: int = WRITES_1H

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def __add__(self, o: Amount) -> Amount:
        cost = None if self.cost is None or o.cost is None else self.cost + o.cost
        return Amount(self.prompt + o.prompt, self.completion + o.completion, cost, min(self.writes, o.writes))


def most(price: Priced, prompt: int, completion: int, writes: int = WRITES_1H) -> float:
    """The most these tokens may cost at ``price``: every prompt token at the dearest of the plain input rate and
    the cache-write rates ``writes`` allows (a provider that writes the prompt to its cache bills it so:
    Anthropic's 1.25x for 5 minutes, 2x for an hour), which is what a result may settle at (``settle_result``
    prices its cache writes)."""
    out = price.cost(prompt, completion)
    if writes >= WRITES_5M:
        out = max(out, price.cost(prompt, completion, written_tokens=prompt))
    if writes >= WRITES_1H:
        out = max(out, price.cost(prompt, completion, written_tokens=prompt, written_1h_tokens=prompt))
    return out


def cache_marks(text: bytes) -> int:
    """The cache writes a request may cause at a provider that writes only where a request marks it (Anthropic's
    ``cache_control``, anywhere in the body: system, tools, a message, a content block; or Bedrock Converse's
    ``{"cachePoint": {"type": "default"}}`` block in system, tools or a message's content), read from its JSON text
    (a bytes search, no parse): ``WRITES_1H`` when a mark asks a ``"ttl": "1h"`` (either provider's spelling,
    Bedrock's ``ttl`` being "5m" or "1h"), ``WRITES_5M`` for any other mark, else ``NO_WRITES``. A key elsewhere
    in a task's line (a simple line's metadata) counts too: never cheaper than the request."""
    if _MARK.search(text) is None:
        return NO_WRITES
    return WRITES_1H if _HOUR.search(text) is not None else WRITES_5M


@dataclass(slots=True)
class Learned:
    """What the run's answers taught its reservations: ``Budget`` learns it as results settle (a resume from
    results.jsonl and its checkpoint: ``Budget.learn``), ``TaskCosts`` reads it for every task."""

    # {model asked: the dearest snapshot it answered as and was billed at}: reserved at the dearer of the two
    answered_as: dict[str, str] = field(default_factory=dict)
    # models asked whose answer came back (naming the model that billed it): before one, a model is reserved at
    # the dearest of its snapshots' prices (``TaskCosts``)
    seen: set[str] = field(default_factory=set)
    # an answer was billed cache writes its request did not ask for (a gateway adding marks): every prompt is
    # reserved at the dearest write rate from then on
    unasked_writes: bool = False


def carried(learned: Learned) -> dict[str, Any]:
    """What of ``learned`` a checkpoint's counters carry to the next session, whatever its caps: ``UNASKED`` once
    an answer was billed cache writes its request did not ask for (``unasked_in`` reads it back)."""
    return {UNASKED: True} if learned.unasked_writes else {}


def unasked_in(counters: Mapping[str, Any] | None) -> bool:
    """Whether a checkpoint's counters say an answer of the run was billed cache writes its request did not ask
    for (``Learned.unasked_writes``): their own ``UNASKED`` key, which every session writes once the run knows
    it, or the budget's figures, where a checkpoint written before that key kept it."""
    if not isinstance(counters, Mapping):
        return False
    figures = counters.get("budget")
    return counters.get(UNASKED) is True or (isinstance(figures, Mapping) and figures.get(UNASKED) is True)


def priced(prompt: int, completion: int, price: Priced | None, writes: int = WRITES_1H) -> Amount:
    """These tokens at their most at ``price`` with the cache writes ``writes`` allows (``most``); cost None without
    a price. The amount's own ``writes`` stays the widest: what it allows is said by the task's request alone."""
    return Amount(prompt, completion, None if price is None else most(price, prompt, completion, writes))


class TaskCosts:
    """The most one task may cost, all of it (see the module): what ``afford`` is asked with. Built once a run
    from its settings; ``worst(obj)`` is pure (it reads ``learned``, which the budget alone changes)."""

    def __init__(self, defaults: RequestDefaults, price_of: Callable[[str | None], Priced | None], *,
                 hedge: bool = False, max_reasks: int = 0, run_schema: bool = False, validate_schema: bool = True,
                 judge_price: Priced | None = None, judge: bool = False, judge_template: str | None = None,
                 judge_max_tokens: int | None = None, learned: Learned | None = None,
                 snapshots: Callable[[str], Iterable[str]] | None = None) -> None:
        self.defaults = defaults
        self.price_of = price_of
        # what the run's answers said (``Budget.learned``): the snapshot each model answered as, the models whose
        # answer came back, cache writes no request asked for
        self.learned = learned if learned is not None else Learned()
        # the names a model may be answered and billed as (``config.prices.PriceTable.snapshots``); None: none
        self.snapshots = snapshots
        self._before_answer: dict[str, tuple[Priced, ...]] = {}  # {model: its snapshots' prices, as billed}
        self.copies = 2 if hedge else 1  # a hedge's second copy (worker.race: the first request only)
        self.max_reasks = max_reasks if validate_schema else 0
        self.run_schema = run_schema
        self.judge = judge
        self.judge_price = judge_price
        self.judge_template_tokens = -(-len(judge_template or DEFAULT_TEMPLATE) // CHARS_PER_TOKEN) + PER_MESSAGE
        out = judge_price.max_output if judge_price is not None else None
        self.judge_completion = judge_max_tokens or out or DEFAULT_MAX_OUTPUT

    def worst(self, obj: dict[str, Any]) -> tuple[Amount, Priced | None, str | None]:
        """(the task's worst case, its model's price, its model's name). A Claude model's request is looked for
        cache marks (``cache_marks``) in ``obj`` serialized by orjson, which escapes no letter (a mark a line
        spells ``cache\\u005fcontrol`` is found), and costs less than searching the line as read (4.5 against
        7.8 us for this whole call on a 4.7 KB task)."""
        f = figures(obj, self.defaults)
        price = self.price_of(f.model)
        p, c = f.approx_prompt, f.max_completion(price.max_output if price is not None else None)
        prompt, completion = p * self.copies, c * self.copies
        body = obj.get("body") if "custom_id" in obj else simple_body(obj)  # what is sent (not the metadata)
        if self.max_reasks and (self.run_schema or schema_of_request(body) is not None):
            grow = 4 * c + REASK_TURN + 2 * PER_MESSAGE  # the answer as a turn, the error (which may quote it)
            for k in range(1, self.max_reasks + 1):
                prompt += p + k * grow
                completion += c
        a = Amount(prompt, completion, None)
        if price is not None:
            tier = tier_of(body) if "custom_id" in obj else None  # (a simple line's other keys are its metadata)
            writes = WRITES_1H
            if price.writes_marked and not self.learned.unasked_writes:  # writes only where the request asks
                writes = cache_marks(orjson.dumps(obj))
            costs = []
            for q in self._billed_as(f.model, price):
                w = writes if q.writes_marked else WRITES_1H
                costs.append(most(q, prompt, completion, w))
                variant = getattr(q, "variant", None)
                if tier is not None and variant is not None:  # its tier may be dearer (priority)
                    costs.append(most(variant(tier), prompt, completion, w))
            a = Amount(prompt, completion, max(costs), writes)
        if self.judge:  # the template with the task's prompt (as {prompt} and {messages}), its answer, expected
            expected = obj.get("expected")
            jp = self.judge_template_tokens + 2 * p + 2 * c + \
                (len(str(expected)) // CHARS_PER_TOKEN + 1 if expected is not None else 0)
            judge = self.judge_price
            # evalsup builds the judge's request itself (worker.judge: one user message) and marks no cache in it:
            # a Claude judge is reserved at the input rate until a gateway was seen writing what no one marked
            jw = NO_WRITES if judge is not None and judge.writes_marked and not self.learned.unasked_writes \
                else WRITES_1H
            a = a + priced(jp, self.judge_completion, judge, jw)
        return a, price, f.model

    def _billed_as(self, model: str | None, price: Priced) -> tuple[Priced, ...]:
        """The prices a task of ``model`` (priced ``price``) may be billed at: once an answer of it came back, its
        own and that of the dearest snapshot it answered as (``Learned.answered_as``); before, its own and each
        of its snapshots' that a source prices (``snapshots``), at what an answer naming it would be billed
        (``billed_price``: a price the user gave for the alias wins over another source's for a snapshot)."""
        if not model:
            return (price,)
        snapshot = self.learned.answered_as.get(model)
        if snapshot:
            dear = self.price_of(snapshot)  # billed as the snapshot that answers it
            return (price,) if dear is None else (price, dear)
        if model in self.learned.seen or self.snapshots is None:
            return (price,)
        got = self._before_answer.get(model)
        if got is None:
            out: list[Priced] = []
            for name in self.snapshots(model):
                q = billed_price(self.price_of, name, model)
                if q is not None and q != price and q not in out:
                    out.append(q)
            got = (price, *out)
            keep(self._before_answer, model, got)
        return got


class Budget:
    """Spent and reserved against the caps (``Caps``; a shard's share already taken)."""

    def __init__(self, caps: Caps, spent: Amount | None = None, unpriced: int = 0,
                 judge_price: Priced | None = None, price_of: Callable[[str | None], Priced | None] | None = None,
                 first_answer: bool = True, learned: Learned | None = None) -> None:
        self.caps = caps
        self.judge_price = judge_price  # the judge's tokens (--scorer judge) are spent at it
        # the run's prices: an answer whose response names another model than its request's is priced by it
        # (``billed_price``); without them (a test's budget), at its reservation's price
        self.price_of = price_of
        # what the answers said (a few names a run; bounded all the same): the dearest model each model asked
        # answered as and was billed at, the models whose answer came back, cache writes no request asked for;
        # ``TaskCosts`` reserves by it, a resume's read-back and checkpoint seed it (``learn``; the arbiter passes
        # its own, which it keeps with no cap too: the checkpoint carries its ``unasked_writes`` either way)
        self.learned = learned if learned is not None else Learned()
        # under --max-cost, one task of a model goes until a result of it settles (``first_answer``; not under
        # --batch-api, whose answers take hours): its answer names the snapshot that bills the tasks after it
        self.first_answer = first_answer and caps.cost is not None
        self.answered: set[str] = set()  # models asked whose result settled (this session or read back)
        self._first_out: dict[str, int] = {}  # {model asked: the key of its one task out before its first result}
        self.waiting = False  # the next task would pass a cap while tasks are out: dispatch waits for them
        self.first_pending = False  # ...or waits for a model's first answer, whose billed model sets its price
        self.spent_prompt = spent.prompt if spent else 0
        self.spent_completion = spent.completion if spent else 0
        self.spent_cost = (spent.cost or 0.0) if spent else 0.0
        self.unpriced = unpriced  # results whose cost is unknown (a model with no price): not in spent_cost
        self.settled = 0  # results settled this session (the projection's average is over them)
        self.session_prompt = self.session_completion = 0  # spent this session
        self.session_cost = 0.0
        self._open: dict[int, tuple[Amount, Priced | None, str | None]] = {}  # (worst, price, model asked)
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

    @property
    def answered_as(self) -> dict[str, str]:
        """{model asked: the dearest model it answered as and was billed at} (``Learned.answered_as``)."""
        return self.learned.answered_as

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

    def afford(self, key: int, worst: Amount, price: Priced | None, model: str | None) -> Decision:
        """May the task ``key`` go, reserving ``worst`` (``TaskCosts.worst``)? GO reserves it."""
        if price is None and self.caps.cost is not None:
            return Decision(Verdict.UNPRICED, f"--max-cost: no price for model {model!r}")
        first = self.first_answer and model is not None and model not in self.answered and \
            len(self.answered) < MAX_MODELS and price is not None and price.cost(1e6, 1e6) > 0
        over = self.would_exceed(worst)
        if over is None:
            if first and model in self._first_out and self._first_out[model] != key:
                self.waiting = self.first_pending = True  # its first task is out: the snapshot its answer
                return Decision(Verdict.WAIT)  # names may be dearer
            self.reserve(key, worst, price, model)
            if first and model is not None:
                self._first_out[model] = key
            return Decision(Verdict.GO)
        if self._open:
            self.waiting, self.first_pending = True, False  # the tasks out may settle below their worst case
            return Decision(Verdict.WAIT, cap=over)
        nxt = f"${worst.cost:,.4f}" if over == "cost" and worst.cost is not None else \
            f"{worst.completion if over == 'completion_tokens' else worst.total:,} tokens"
        return Decision(Verdict.STOP, f"budget: {self.cap_text(over)}; the next task could use up to {nxt}", over)

    def _look_again(self) -> bool:
        """After a settle or a release: True when dispatch was waiting on the budget (it looks again now)."""
        was, self.waiting, self.first_pending = self.waiting, False, False
        return was

    # ----- moves -----

    def reserve(self, key: int, a: Amount, price: Priced | None, model: str | None = None) -> None:
        """A request handed out (key: its task's key) reserves ``a``, its worst case (its model ``model``, priced
        at ``price``)."""
        if key in self._open:
            self.release(key)
        self._open[key] = (a, price, model)
        self.res_prompt += a.prompt
        self.res_completion += a.completion
        self.res_cost += a.cost or 0.0

    def release(self, key: int) -> bool:
        """A task handed back unanswered: its reservation goes, nothing is spent. True: dispatch looks again."""
        got = self._open.pop(key, None)
        if got is None:
            return self._look_again()
        if got[2] is not None and self._first_out.get(got[2]) == key:
            del self._first_out[got[2]]  # (the next task of its model goes alone in its place)
        self._unreserve(got[0])
        return self._look_again()

    def learn(self, answered_as: Mapping[str, str] | None = None, answered: Iterable[str] = (),
              unasked_writes: bool = False) -> None:
        """What a resume read back from results.jsonl (``rundir.usage.Usage``): the snapshots each model asked
        answered as and was billed at (its tasks reserve at the dearer), and the models that answered (their
        tasks go without waiting for a first answer, reserved at their own price, not their snapshots'); and from
        its checkpoint (``unasked_in``): that an answer was billed cache writes its request
        did not ask for (every prompt reserved at the dearest write rate)."""
        for asked, snapshot in (answered_as or {}).items():
            keep(self.answered_as, asked, snapshot)
        for model in answered:
            keep(self.answered, model)
            keep(self.learned.seen, model)
        self.learned.unasked_writes = self.learned.unasked_writes or unasked_writes

    def _unreserve(self, a: Amount) -> None:
        self.res_prompt -= a.prompt
        self.res_completion -= a.completion
        self.res_cost = max(0.0, self.res_cost - (a.cost or 0.0)) if self._open else 0.0

    def settle(self, key: int, prompt: int, completion: int, price: Priced | None = None,
               bill: Callable[[Priced], float] | None = None, answered: str | None = None) -> Amount:
        """A result's usage: its reservation goes and the usage is spent, priced as the reservation was (or at
        ``price`` for a result that had none), or at the model ``answered`` (the one its response names) when
        that has a price (``billed_price``): ``bill(price)`` when given (what the answers cost as billed:
        ``settle_result``), else the plain tokens at ``price``. Returns what was spent."""
        got = self._open.pop(key, None)
        prompt, completion = max(0, prompt), max(0, completion)
        if got is not None:
            price, asked = got[1], got[2]
            self._unreserve(got[0])
            if asked is not None:
                self._first_out.pop(asked, None)
                keep(self.answered, asked)
            if answered is not None and self.price_of is not None and answered != asked:
                used = billed_price(self.price_of, answered, asked)
                if used is not None and used != price:  # priced as the snapshot: its model's next tasks reserve
                    if asked is not None:  # at the dearer of the two (the dearest snapshot seen)
                        note_snapshot(self.answered_as, asked, answered, self.price_of, prompt, completion)
                    price = used
        cost = None if price is None else bill(price) if bill is not None else price.cost(prompt, completion)
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

    def spend(self, prompt: int, completion: int, price: Priced | None) -> Amount:
        """Usage beside a result's own, spent with it: the judge's tokens of a task (--scorer judge, at the
        judge's price; none: its tokens count, its cost is not known). Not a result: the projection's mean a task
        takes it in, the count of results does not."""
        prompt, completion = max(0, prompt), max(0, completion)
        cost = None if price is None else price.cost(prompt, completion)
        self.spent_prompt += prompt
        self.spent_completion += completion
        self.session_prompt += prompt
        self.session_completion += completion
        if cost is not None:
            self.spent_cost += cost
            self.session_cost += cost
        return Amount(prompt, completion, cost)

    def settle_result(self, key: int, meta: Mapping[str, Any]) -> bool:
        """A RESULT's meta settles task ``key``: its answer (none from the cache: it cost nothing) priced as
        billed (at the price of the model its response names, md, when it has one, else its request's; its
        prompt tokens read from the provider's cache, cr, and written to it, cw (w1 of them kept an hour), at
        their rates, and its service tier's, tr, or a provider batch's, bt), the answers asked again (rpt/rct),
        the hedge's other copy (hg: the same usage again), and the judge's call (jpt/jct, at the judge's price).
        The price is ``rundir.usage.answer_cost``, the read-back's own: the live spend is what a resume reads
        back. True: dispatch was waiting on the budget and looks again."""
        out = self._open.get(key)
        if out is not None:
            self._note_answer(out[0], out[2], meta)
        if meta.get("ca") == "h":
            answer, reasks, copies = NOTHING, NOTHING, 1
        else:
            answer = Billed(count(meta.get("pt")), count(meta.get("ct")), count(meta.get("cr")), count(meta.get("cw")),
                            count(meta.get("w1")))
            reasks = Billed(count(meta.get("rpt")), count(meta.get("rct")))
            copies = 2 if meta.get("hg") else 1
        tier = meta.get("tr")
        tier = tier if isinstance(tier, str) else None
        answered = meta.get("md")  # the model the response names, when not the request's
        batch = bool(meta.get("bt"))  # a provider batch's answer (--batch-api): at the batch API's rates
        self.settle(key, copies * answer.prompt + reasks.prompt, copies * answer.completion + reasks.completion,
                    bill=lambda p: answer_cost(p, answer, tier, batch, copies, reasks, count(meta.get("rk"))),
                    answered=answered if isinstance(answered, str) and answered else None)
        if "jpt" in meta or "jct" in meta:
            self.spend(int(meta.get("jpt") or 0), int(meta.get("jct") or 0), self.judge_price)
        return self._look_again()

    def _note_answer(self, worst: Amount, asked: str | None, meta: Mapping[str, Any]) -> None:
        """What a result of a task of ``asked`` reserved ``worst`` teaches: an answer came back (pt, ct or md:
        its model's tasks reserve at its own price from now on, and its snapshot's when md names one), and
        whether it was billed cache writes its reservation did not allow (cw at all, w1 beyond the 5-minute
        kind): then a gateway marks requests itself, and every later prompt is reserved at the dearest rate."""
        learned = self.learned
        if asked is not None and asked not in learned.seen and \
                (count(meta.get("pt")) or count(meta.get("ct")) or meta.get("md")):
            keep(learned.seen, asked)
        if not learned.unasked_writes and worst.writes < WRITES_1H and \
                (count(meta.get("w1")) or (worst.writes < WRITES_5M and count(meta.get("cw")))):
            learned.unasked_writes = True

    # ----- what a person sees -----

    def cap_text(self, over: str) -> str:
        """What was spent of the cap ``over`` names, for the line that stops the run."""
        c = self.caps
        if over == "cost":
            return f"spent ${self.spent_cost:,.4f} of --max-cost ${c.cost:,.4f}"
        if over == "completion_tokens":
            return f"{self.spent_completion:,} completion tokens of --max-completion-tokens-total " \
                f"{c.completion_tokens:,}"
        return f"{self.spent_prompt + self.spent_completion:,} tokens of --max-total-tokens {c.total_tokens:,}"

    def text(self) -> str:
        """Spent against each cap, one phrase (the start's line)."""
        c = self.caps
        parts = []
        if c.cost is not None:
            parts.append(f"{fmt_usd(self.spent_cost)} of {fmt_usd(c.cost)}")
        if c.completion_tokens is not None:
            parts.append(f"{fmt_tokens(self.spent_completion)} of {fmt_tokens(c.completion_tokens)} completion tokens")
        if c.total_tokens is not None:
            parts.append(f"{fmt_tokens(self.spent_prompt + self.spent_completion)} of {fmt_tokens(c.total_tokens)} "
                         "tokens")
        return "spent " + ", ".join(parts)

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
        } | ({UNASKED: True} if self.learned.unasked_writes else {})
