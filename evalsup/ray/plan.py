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
  (75, killed, 1) is unfinished: Ray retries it, and the retry resumes, which the driver says in one line
  (``retry_line``).
* **The shards' environment** (``shard_env``). A shard runs in a Ray worker's environment, not the driver's: the
  endpoint settings of the driver's (``OPENAI_BASE_URL``, the API key's variable, the judge's, each variable a
  ``--header NAME: env:VAR`` names, ``EVALSUP_*``) go to every shard in Ray's ``runtime_env`` ``env_vars``, never in
  its arguments. A ``--base-url`` holding a credential (user:password@, a query value) goes the same way, as
  ``OPENAI_BASE_URL``; a ``--judge-base-url`` holding one has no such way and is refused (``CredentialInArgs``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

from evalsup.config.exitcodes import BAD_INPUT, LOCKED, OK, RESUMABLE
from evalsup.config.options import DEFAULTS
from evalsup.config.shards import shard_dir_name
from evalsup.tasks.requests import public_url
from evalsup.tasks.secrets import url_secrets

# Options the driver acts on itself and never passes to a shard. --fresh above all: a retried shard given
# --fresh would move its own progress aside.
DRIVER_ONLY = frozenset({"ray", "shards", "ray_retries", "out", "fresh", "json_summary", "shard"})
SPLIT_INT = ("concurrency", "max_concurrency", "judge_concurrency")
SPLIT_RATE = ("max_requests_per_s", "max_tokens_per_min")
BASE_URL_VAR = "OPENAI_BASE_URL"
KEY_VARS = ("OPENAI_API_KEY",)
# EVALSUP_* variables that describe the driver's own machine or submission, not the run: never sent to a shard
NODE_ONLY = frozenset({"EVALSUP_SHARDS", "EVALSUP_CGROUP_ROOT"})


class CredentialInArgs(ValueError):
    """A setting holding a credential that would travel in Ray's task arguments and has no other way; the message
    says what to set instead."""


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


def _header_vars(specs: Any) -> list[str]:
    """The variables ``--header 'NAME: env:VAR'`` specs read."""
    out = []
    for spec in ((specs,) if isinstance(specs, str) else tuple(specs or ())):
        value = str(spec).partition(":")[2].strip()
        if value.startswith("env:"):
            out.append(value[4:].strip())
    return out


def _public_rates(values: Any) -> Any:
    """``--max-requests-per-s URL=N`` values with a URL holding a credential given by its public form (which
    names the endpoint as well, config.ratelimits), so the credential stays out of the shards' arguments."""
    items = [values] if isinstance(values, str | int | float) else list(values)
    out = []
    for v in map(str, items):
        url, eq, num = v.rpartition("=")
        out.append(f"{public_url(url)}={num}" if eq and url_secrets(url) else v)
    return tuple(out)


def shard_env(given: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the options every shard gets, the variables every shard's environment gets: Ray's runtime_env
    ``env_vars``). The variables are those of the driver's environment the run reads (the endpoint, the keys'
    variables, the --header env:VAR ones, EVALSUP_* but ``NODE_ONLY``), set there; a --base-url holding a
    credential is taken out of the options and given as OPENAI_BASE_URL. Raises CredentialInArgs."""
    judge = given.get("judge_base_url")
    if isinstance(judge, str) and url_secrets(judge):
        raise CredentialInArgs("--ray: the --judge-base-url holds a credential (user:password@ or a query value) "
                               "that would travel in Ray's task arguments (kept by its GCS, shown on its "
                               "dashboard): give the judge's key with --judge-api-key-env VAR instead")
    names = [BASE_URL_VAR, *KEY_VARS, *_header_vars(given.get("headers"))]
    names += [str(given[k]) for k in ("api_key_env", "judge_api_key_env") if given.get(k)]
    names += [k for k in environ if k.startswith("EVALSUP_") and k not in NODE_ONLY]
    env = {k: environ[k] for k in dict.fromkeys(names) if k in environ}
    given = {**given, **{k: _public_rates(given[k]) for k in SPLIT_RATE if given.get(k)}}
    urls = given.get("base_url") or ()
    urls = [urls] if isinstance(urls, str) else list(urls)
    if not any(url_secrets(u) for u in urls):
        return dict(given), env
    if any("," in u for u in urls):  # OPENAI_BASE_URL is a comma-separated list
        raise CredentialInArgs("--ray: a --base-url holding a credential goes to the shards as OPENAI_BASE_URL, a "
                               "comma-separated list, and this one holds a comma: percent-encode it (%2C)")
    return {**given, "base_url": None}, {**env, BASE_URL_VAR: ",".join(urls)}


def retry_line(k: int, n: int, attempt: int, last_exit: int | None) -> str:
    """The one line the driver says when Ray starts attempt ``attempt`` (2, 3...) of shard ``k``: how the last
    one ended (its exit code, when its process got to write one; else its Ray worker died with it)."""
    if last_exit is None:
        how = "its Ray worker died"
    elif last_exit < 0:
        how = f"killed by signal {-last_exit}"
    else:
        how = f"exit {last_exit}"
    return f"ray: {shard_dir_name(k, n)}: attempt {attempt - 1} ended unfinished ({how}); Ray retries it, " \
        "resuming from its checkpoint"
