"""What a run on Ray does, decided without Ray: each shard's options, what a shard's exit means, the progress line.

Pure functions of their arguments (no I/O, no Ray), so the rules are unit-tested; evalsup.ray.driver carries
them out.

* **Options of shard K.** A shard is `evalsup run TASKS --shard K/N --out OUT/shard-K-of-N` with the run's own
  options, except those only the driver acts on (``DRIVER_ONLY``: --ray, --shards, --ray-retries, --out, --fresh,
  --json). Limits are shared, not multiplied: ``--concurrency``, ``--max-concurrency`` (when given) and each
  ``--max-requests-per-s`` / ``--max-tokens-per-min`` value (``N`` or ``URL=N``) are divided evenly among the N
  shards (a shard gets at least 1 request in flight; rates are kept as fractions), and so is the judge's
  ``--judge-concurrency`` (its default of 16 too, when the run has a judge: else each shard would take all of it).
  The split is fixed at the start: a shard that finishes early does not hand its share on, so the whole never goes
  faster than the limit, and may go slower at its end. ``--metrics-port P`` becomes P+K, so shards on one node do
  not collide. (Cost caps, where a run has them, are split by ``--shard`` itself.)
* **A shard's exit.** 0 done; 2 bad input or settings: the whole stops with the shard's line (a retry meets it
  again); 73 the shard's directory is still held (the process of a previous attempt draining after its Ray worker
  died): wait and start again; 75 with ``exit_reason`` ``budget`` (a cost or token cap reached) is final for this
  run: a retry would stop again at once, so the whole ends 75 and a rerun with a higher cap resumes; anything else
  (75, killed, 1) is unfinished: Ray retries it, and the retry resumes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

from evalsup.config.exitcodes import BAD_INPUT, LOCKED, OK, RESUMABLE
from evalsup.config.options import DEFAULTS

# Options the driver acts on itself and never passes to a shard. --fresh above all: a retried shard given
# --fresh would move its own progress aside.
DRIVER_ONLY = frozenset({"ray", "shards", "ray_retries", "out", "fresh", "json_summary", "shard"})
SPLIT_INT = ("concurrency", "max_concurrency", "judge_concurrency")
SPLIT_RATE = ("max_requests_per_s", "max_tokens_per_min")


class ShardUnfinished(Exception):
    """A shard's attempt ended before every task of it had its record; raised in its Ray task so Ray retries it."""

    def __init__(self, shard: int, code: int, message: str) -> None:
        super().__init__(shard, code, message)
        self.shard, self.code, self.message = shard, code, message

    def __str__(self) -> str:
        return f"shard {self.shard} ended unfinished (exit {self.code}){': ' + self.message if self.message else ''}"


class Exit(enum.Enum):
    DONE = "done"  # every task of the shard has its record
    BAD = "bad"  # bad input or settings: stop the whole, a retry would meet it again
    HELD = "held"  # the shard's directory is held by a previous attempt still draining: wait, then start again
    BUDGET = "budget"  # a cap stopped it (resumable with a higher cap): not retried, a retry would stop at once
    UNFINISHED = "unfinished"  # stopped resumably, killed, or failed otherwise: Ray retries it


def exit_of(code: int, reason: str | None = None) -> Exit:
    """What shard's exit ``code`` (and its summary's ``exit_reason``, when it printed one) means."""
    if code == RESUMABLE and reason == "budget":
        return Exit.BUDGET
    if code == OK:
        return Exit.DONE
    if code == BAD_INPUT:
        return Exit.BAD
    if code == LOCKED:
        return Exit.HELD
    return Exit.UNFINISHED


def _share(value: str, n: int) -> str:
    """``N`` or ``URL=N`` with N divided by ``n`` (kept exact: 10/4 is 2.5)."""
    key, eq, num = value.rpartition("=")
    share = float(num) / n
    text = str(int(share)) if share == int(share) else f"{share:.6g}"
    return f"{key}{eq}{text}"


def shard_options(given: Mapping[str, Any], k: int, n: int) -> dict[str, Any]:
    """The options shard ``k`` of ``n`` runs with, from the options the user gave (evalsup.run's keywords)."""
    out = {name: v for name, v in given.items() if name not in DRIVER_ONLY and v is not None}
    scorers = out.get("scorers") or ()
    judged = "judge" in ((scorers,) if isinstance(scorers, str) else tuple(scorers)) or out.get("judge_base_url")
    if out.get("judge_concurrency") is None and judged:
        out["judge_concurrency"] = DEFAULTS["judge_concurrency"]  # the run's limit in all, not each shard's
    for name in SPLIT_INT:
        if out.get(name) is not None:
            out[name] = max(1, math.floor(int(out[name]) / n))
    for name in SPLIT_RATE:
        values = out.get(name)
        if values:
            items = [values] if isinstance(values, str | int | float) else list(values)
            out[name] = tuple(_share(str(v), n) for v in items)
    if out.get("metrics_port"):
        out["metrics_port"] = int(out["metrics_port"]) + k
    return out


def progress_line(groups: list[dict[str, Any]], n: int, attempts: int) -> str:
    """One line over every shard, from evalsup.tools.status.shards_status's groups for the run's shard count."""
    g = next((g for g in groups if g["shards"] == n), None)
    if g is None:
        return f"ray: {n} shards starting"
    t = g["total"]
    total = t.get("total")
    done = f"{t['done']:,}/{total:,} done ({100 * t['done'] / total:.1f} %)" if total else f"{t['done']:,} done"
    rate = f", {t['rate']:,.0f} req/s" if t.get("rate") else ""
    retried = f", {attempts} retried" if attempts else ""
    return (f"ray: {t['finished']}/{n} shards finished, {t['running']} running{retried}; {done}, "
            f"{t['failed']:,} failed{rate}")
