"""The one line a run says at its start (issue 44): the endpoint, the model, the tasks, workers x limit and, when
priced, the cost estimate, in at most ~120 characters. The endpoint check's line, the whole estimate and the
sizing line are said instead with -v (--verbose). Pure: built from the config and the pre-scan's estimate."""

from __future__ import annotations

from typing import Any

from evalsup.config.run_config import RunConfig
from evalsup.tasks.requests import public_url
from evalsup.tasks.tokens import fmt_usd

__all__ = ["MAX_WIDTH", "first_line"]

MAX_WIDTH = 120  # the line's aim: an endpoint URL longer than it leaves room for is shortened to its host


def first_line(cfg: RunConfig, estimate: dict[str, Any] | None, hits: int | None = None,
               endpoints: tuple[str, ...] | None = None, resumed: bool = False) -> str:
    """``estimate``: the pre-scan's ``Tally.summary`` (None when there is none); ``hits``: requests the cache
    answers; ``endpoints``: those that passed the check (default: every one of the run's). A resume counts the
    lines not yet read ("unread"); the tasks it redoes are said by its "resuming:" line."""
    urls = [public_url(u) for u in (endpoints if endpoints is not None else cfg.worker.endpoints)]
    parts = [_model(cfg, estimate)]
    if estimate is not None:
        n = int(estimate.get("requests") or 0) + (hits or 0)
        parts.append(f"{n:,} {'unread' if resumed else 'task' + ('s' if n != 1 else '')}"
                     + ("" if not hits else " (all from the cache)" if hits == n else f" ({hits:,} from the cache)"))
    parts.append(_sizing(cfg))
    cost = _cost(estimate)
    if cost:
        parts.append(cost)
    rest = ", ".join(p for p in parts if p)
    more = f" (+{len(urls) - 1})" if len(urls) > 1 else ""
    url = urls[0] if urls else "?"
    room = MAX_WIDTH - len("evalsup: ") - len(more) - len(rest) - 2
    if len(url) > room:  # a long URL gives way to the figures: its scheme and host are what one recognises
        head = url.split("/", 3)
        url = "/".join(head[:3]) + ("/…" if len(head) > 3 else "")
    return f"{url}{more}: {rest}"


def _model(cfg: RunConfig, estimate: dict[str, Any] | None) -> str:
    if cfg.worker.model:
        return cfg.worker.model
    names = [str(m) for m in (estimate or {}).get("models", {}) if m != "(no model)"]
    if not names:
        return ""
    return names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "")


def _sizing(cfg: RunConfig) -> str:
    """Workers x each one's limit: "4 workers x 16" (fixed), "1-4 workers, 64 in flight" (workers added while
    CPU-bound), "1-4 workers, adaptive ≤256" (in flight in all)."""
    if cfg.worker.batch is not None:
        return "provider batches"
    count = f"1-{cfg.workers} workers" if cfg.autoscale else f"{cfg.workers} worker{'s' if cfg.workers > 1 else ''}"
    if cfg.adaptive:
        return f"{count}, adaptive ≤{cfg.concurrency:,}"
    if cfg.autoscale:  # the limit is split among the workers as they are added
        return f"{count}, {cfg.concurrency:,} in flight"
    return f"{count} x {cfg.per_worker_concurrency()[0]:,}"


def _cost(s: dict[str, Any] | None) -> str:
    """The estimate's cost, short: "no cost", "≈ $1.20 (max $3.40)", "cost unknown (no price)"."""
    if s is None or not s.get("requests"):
        return ""
    cost, unpriced = s["cost_usd"], s.get("unpriced") or []
    if unpriced and len(unpriced) == len(s["models"]):
        return "cost unknown (no price)"
    if cost["high"] == 0 and not unpriced:
        return "no cost"
    low, exp, high = cost["low"], cost["expected"], cost["high"]
    text = f"≈ {fmt_usd(exp)}" if exp is not None else f"at least {fmt_usd(low)}"
    if high is None:
        text += ", no upper bound"
    elif exp is not None:
        text += f" (max {fmt_usd(high)})"
    else:
        text = f"max {fmt_usd(high)}"
    return text + (" + unpriced models" if unpriced else "")
