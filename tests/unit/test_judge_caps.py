"""tools.judge_caps: the caps of `evalsup score --scorer judge`, driven by random sequences against a plain model.
No process, no socket."""

from __future__ import annotations

import random

from evalsup.config.prices import Price
from evalsup.tools.judge_caps import UNBOUNDED_COMPLETION, JudgeCaps, Need


def test_spent_plus_held_never_passes_a_cap_and_the_bill_stays_under_it() -> None:
    rng = random.Random(7)
    for _ in range(200):
        price = Price(input=rng.uniform(0.1, 5), output=rng.uniform(0.5, 20))
        cost_cap = rng.choice([None, rng.uniform(0.001, 0.05)])
        token_cap = rng.choice([None, rng.randint(200, 20_000)])
        caps = JudgeCaps(cost_cap, token_cap, price, rng.choice([None, 64]))
        out: list[Need] = []
        billed_tokens, billed_usd = 0, 0.0
        for _ in range(60):
            if out and rng.random() < 0.5:  # one comes back, having used at most its reservation
                n = out.pop(rng.randrange(len(out)))
                p, c = rng.randint(0, n.prompt), rng.randint(0, n.completion)
                caps.settle(n, p, c)
                billed_tokens += p + c
                billed_usd += price.cost(p, c)
                continue
            n = caps.need(rng.randint(50, 4000), 300)
            if caps.affords(n):
                caps.reserve(n)
                out.append(n)
        for n in out:
            caps.settle(n, n.prompt, n.completion)
            billed_tokens += n.prompt + n.completion
            billed_usd += price.cost(n.prompt, n.completion)
        assert token_cap is None or billed_tokens <= token_cap
        assert cost_cap is None or billed_usd <= cost_cap + 1e-12
        assert caps.spent_tokens == billed_tokens


def test_a_request_is_reserved_at_its_worst_case() -> None:
    caps = JudgeCaps(None, 10_000, None, None)
    assert caps.need(1000, 200).completion == UNBOUNDED_COMPLETION
    assert JudgeCaps(None, 1, Price(1, 1, max_output=512), None).need(10, 10).completion == 512
    assert JudgeCaps(None, 1, None, 16).need(10, 10) == Need(11, 16)
