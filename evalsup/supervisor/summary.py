"""The run's summary: summary.json and the table printed at the end."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from rich.console import Console

from evalsup.cache.text import cache_text
from evalsup.config import exitcodes
from evalsup.config.caps import budget_text
from evalsup.rundir.run_json import recorded_settings
from evalsup.supervisor.view import RunView

MB = 1 << 20


class Priced(Protocol):
    def cost(self, prompt_tokens: float, completion_tokens: float, cached_tokens: float = 0.0) -> float: ...


# a model's price (config.prices.PriceTable.lookup: anything with ``cost(prompt, completion)``), or None
PriceOf = Callable[[str], Priced | None]


def money_saved(tokens: dict[str, list[int]], price: PriceOf | None = None) -> tuple[float | None, list[str]]:
    """What the cache's hits would have cost (USD), from their tokens by model at ``price``, and the models with
    no price (their hits are left out of the sum, and named: a model without a price is never counted as free).
    The sum is None with no price table, or when no model of the hits has a price."""
    if price is None:
        return None, sorted(tokens)
    total, priced, unpriced = 0.0, 0, []
    for model, (pt, ct) in tokens.items():
        p = price(model) if model not in ("?", "other") else None
        if p is None:
            unpriced.append(model)
            continue
        total += p.cost(pt, ct)
        priced += 1
    return (round(total, 6) if priced or not tokens else None), sorted(unpriced)


def cache_summary(run: RunView, price: PriceOf | None = None) -> dict[str, Any]:
    """summary.json's ``cache``: hits, misses (requests sent with the cache on; ``unusable``: of them, entries
    found but failing an answer's checks, issue 39), answers kept and pruned this
    session, the tokens the hits saved (by model) and what they would have cost at the run's prices
    (``saved_usd``; ``saved_usd_no_price``: the models whose hits it leaves out, having no price)."""
    st = run.stats
    saved = st.saved_tokens
    usd, unpriced = money_saved(saved, price)
    return {"hits": st.cache_hits, "misses": st.cache_misses, "unusable": st.cache_unusable, **(run.cache or {}),
            "tokens_saved": {"prompt": sum(t[0] for t in saved.values()),
                             "completion": sum(t[1] for t in saved.values())},
            "tokens_saved_by_model": {m: {"prompt": t[0], "completion": t[1]} for m, t in saved.items()},
            "saved_usd": usd, **({"saved_usd_no_price": unpriced} if unpriced else {})}


def build_summary(run: RunView, wall_s: float) -> dict[str, Any]:
    """summary.json: the counts, the latency, the workers, the memory and the endpoints of a run
    (``Supervisor.view``) that took ``wall_s`` seconds this session."""
    st = run.stats
    total = st.done
    return {
        "total": total,
        "succeeded": st.succeeded,
        "failed": st.failed,
        "invalid": st.invalid,
        "this_session": st.session_done,
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(st.session_done / wall_s, 2) if wall_s > 0 else None,
        "latency_s": st.latency.summary(),
        **({"ttft_s": st.ttft.summary()} if st.ttft.n else {}),
        "workers": run.active,  # at the end; with autoscale, 1 plus those added
        **({"workers_added": run.active - run.first_workers, "max_workers": run.max_workers}
           if run.autoscale else {}),
        "concurrency": run.concurrency,
        "adaptive": run.adaptive,  # issue 21: concurrency is then the most the adaptive limit may reach
        "tokens": {"prompt": st.prompt_tokens, "completion": st.completion_tokens,
                   "per_s": round((st.prompt_tokens + st.completion_tokens) / wall_s, 1) if wall_s > 0 else None},
        "errors": dict(st.errors),
        **({"budget": run.budget} if run.budget is not None else {}),  # issue 30: caps, spent, reserved, projected
        # issue 40: the price sources in the order asked, and which one priced each model of the run (with its date)
        **({"prices": run.prices} if run.prices is not None else {}),
        **({"scores": st.scores.summary()} if st.scores else {}),
        # --group-by: per group (at most 10,000, then "(other)"), its tasks, failures and the same score figures
        **({"groups": st.groups.summary()} if st.groups else {}),
        # a resumed run's scores count this session's records only (the report and `evalsup score` read all)
        **({"scores_this_session_only": True} if (st.scores or st.groups) and st.session_done < total else {}),
        # --response-schema (or a task's own json_schema): answers asked again, and still invalid after them
        **({"structured": {"reasks": st.reasks, "schema_invalid": st.schema_invalid}}
           if st.reasks or st.schema_invalid else {}),
        # the judge's tokens (--scorer judge), apart from the answers' "tokens": what grading cost
        **({"judge_usage": {"prompt": st.judge_prompt_tokens, "completion": st.judge_completion_tokens,
                            "requests": st.judged}} if st.judged else {}),
        "retries": st.retries,
        "timeout_stall": st.stalled,  # attempts abandoned because the run had stalled on them, and retried
        # --hedge: tasks whose request got a second copy in the run's tail, and those the second copy answered
        "hedges": {"sent": st.hedged, "won": st.hedge_wins},
        # the run paused for every endpoint down; and per endpoint (issue 21): results, ejections, time out
        "breaker": {"opened": run.endpoints.opened, "down_s": round(run.endpoints.total_down_s(time.monotonic()), 2)},
        # (with several --base-url only: one endpoint's figures are the run's, and its URL stays out of reports)
        **({"endpoints": run.endpoints.summary(time.monotonic(), st.by_endpoint)} if run.endpoints.many else {}),
        "worker_restarts": sum(st.restarts.values()),
        "worker_restarts_by_cause": dict(st.restarts),
        "recycles": dict(st.recycles),
        "poisoned": list(st.poisoned),
        # sampled every --monitor-interval: a run shorter than that has no figure (null), not 0 MB
        "peak_rss_mb": {k: round(v / MB, 1) if st.peak_rss["total"] else None for k, v in st.peak_rss.items()},
        "results_via_ring": st.ring_results,  # large lines passed in shared memory (EVALSUP_RING_MB), this session
        # large answers checked to be JSON by simdjson without being built (no scorer or plugin reads them)
        "large_bodies_checked": st.bodies_checked,
        **(run.memory.summary() if run.memory is not None else {}),
        # --cache (issue 30): hits, misses, and the money saved at the run's prices
        **({"cache": cache_summary(run, run.price_of)} if run.cache is not None else {}),
        "finished": run.finished,
        "stopped": run.stop_message or None,
        "settings": recorded_settings(run.run_dir),  # the request settings of run.json (evalsup.rundir.run_json)
        "run_dir": str(run.run_dir),
    }


def priced_by(prices: dict[str, Any] | None) -> str:
    """Which source priced which models (summary.json's ``prices``), for the final table: "genai-prices 0.2.3
    (latest price change 2026-12-01): gpt-4o; no price: mock-model"."""
    by: dict[str, list[str]] = {}
    for model, source in ((prices or {}).get("by_model") or {}).items():
        by.setdefault(str(source), []).append(str(model))
    return "; ".join(f"{source}: {', '.join(models[:5])}" + (f" and {len(models) - 5} more" if len(models) > 5 else "")
                     for source, models in by.items())


def stopped_how(s: dict[str, Any]) -> str:
    """Why an unfinished run stopped and what to do: a resume, unless the input or settings were bad (exit 2:
    the same command would meet them again; the reason names what to fix)."""
    why = s.get("stop_reason") or s.get("stopped") or "unfinished"
    if s.get("exit_reason") == "budget":  # a cap stopped it (issue 30)
        return f"{why}; rerun with a higher cap to resume"
    return why if s.get("exit_code") == exitcodes.BAD_INPUT else f"{why}; rerun the same command to resume"


def summary_line(s: dict[str, Any]) -> str:
    """The whole summary in one line (--quiet)."""
    state = "finished" if s.get("finished") else f"stopped ({stopped_how(s)})"
    invalid = f", {s['invalid']:,} invalid" if s.get("invalid") else ""
    return (f"evalsup: {state}: {s['total']:,} done ({s['succeeded']:,} ok, {s['failed']:,} failed{invalid}), "
            f"{s['this_session']:,} this session in {s['wall_s']:,.1f}s ({s['requests_per_s'] or 0:,.1f} req/s) "
            f"-> {s['run_dir']}/results.jsonl")


def print_summary(summary: dict[str, Any], console: Console) -> None:
    from rich.table import Table  # here: a --json run never loads rich

    t = Table(title="evalsup run", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    lat = summary["latency_s"]
    rss = summary["peak_rss_mb"]
    rows = [
        *([] if summary.get("finished") else [("stopped", stopped_how(summary))]),
        ("tasks", f"{summary['total']:,} done: {summary['succeeded']:,} ok, {summary['failed']:,} failed"
                  + (f", {summary['invalid']:,} invalid lines skipped" if summary["invalid"] else "")),
        ("this session", f"{summary['this_session']:,} in {summary['wall_s']:.1f}s "
                         f"({summary['requests_per_s'] or 0:,.1f} req/s)"),
        ("latency", "  ".join(f"{k} {v:.3f}s" for k, v in lat.items() if v is not None) or "-"),
        ("workers", f"{summary['workers']}"
                    + (f" (automatic: {summary['workers_added']} added while all were CPU-bound, at most "
                       f"{summary['max_workers']})" if "max_workers" in summary else "")
                    + f" x concurrency {'adaptive, up to ' if summary.get('adaptive') else ''}"
                      f"{summary['concurrency']} total; "
                    f"restarts {summary['worker_restarts']} "
                    + ", ".join(f"{k} {v}" for k, v in summary["worker_restarts_by_cause"].items() if v)),
        ("peak RSS", f"supervisor {rss['supervisor']:.0f} MB, largest worker {rss['worker_max']:.0f} MB, "
                     f"all {rss['total']:.0f} MB" if rss["total"] else
                     "not sampled (the run ended before the first sample)"),
        ("results", summary["run_dir"] + "/results.jsonl"),
    ]
    eps = summary.get("endpoints") or []
    if len(eps) > 1:  # many endpoints (issue 21): results each, and how often it was ejected
        rows.insert(-1, ("endpoints", "; ".join(
            f"{e['index']}: " + ("left out" if "left_out" in e else f"{e['results']:,} results"
                                 + (f", ejected {e['ejected']}x ({e['down_s']:.1f}s)" if e["ejected"] else ""))
            for e in eps)))
    if summary.get("budget"):
        rows.insert(-1, ("budget", budget_text(summary["budget"])))
        said = priced_by(summary.get("prices"))
        if said:
            rows.insert(-1, ("priced by", said))
    if summary.get("timeout_stall"):
        rows.insert(-1, ("stalls", f"{summary['timeout_stall']:,} attempt(s) abandoned and retried (timeout_stall: "
                                   "no result in the run for --stall-after while they were on the wire)"))
    hedges = summary.get("hedges") or {}
    if hedges.get("sent"):
        rows.insert(-1, ("hedges", f"{hedges['sent']:,} request(s) sent twice (--hedge), {hedges['won']:,} "
                                   "answered first by the second copy (the other copy cancelled)"))
    c = summary.get("cache")
    if c is not None:
        rows.insert(-1, ("cache", cache_text(c)))
    rows.extend(score_rows(summary.get("scores", {})))
    if summary.get("scores_this_session_only"):
        rows.append(("scores of", "this session's tasks only (the run was resumed): evalsup report or evalsup score "
                                  "count every record"))
    structured = summary.get("structured")
    if structured:
        rows.append(("structured", f"{structured['reasks']:,} re-ask(s) for the JSON schema, "
                                   f"{structured['schema_invalid']:,} answer(s) still invalid (schema_invalid)"))
    rows.extend(judge_rows(summary.get("judge_usage")))
    if summary["poisoned"]:
        rows.append(("poisoned", ", ".join(summary["poisoned"][:10])))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if summary.get("groups"):
        print_groups(summary["groups"], console)


SHOW_GROUPS = 50  # groups printed in the final table (the largest); summary.json has them all


def _score_cells(sc: dict[str, Any]) -> list[str]:
    """n, accuracy or mean, its 95 % interval (Wilson, 0/1 scores only), unscored, errors."""
    if sc.get("accuracy") is not None:
        lo, hi = sc["ci95"]
        value, ci = f"{sc['accuracy']:.3f}", f"{lo:.3f}-{hi:.3f}"
    else:
        value, ci = ("-" if sc.get("mean") is None else f"{sc['mean']:.4f}"), ""
    return [f"{sc['count']:,}", value, ci, f"{sc.get('unscored', 0):,}", f"{sc['errors']:,}"]


def group_rows(groups: dict[str, Any], show: int = SHOW_GROUPS) -> tuple[list[list[str]], int]:
    """The rows of the per-group table (group, scorer, tasks, n, accuracy/mean, 95 % CI, unscored, errors):
    the ``show`` largest groups in name order, one row a scorer; and how many groups were left out."""
    items = groups.get("groups") or {}
    shown = sorted(sorted(items, key=lambda g: -int(items[g].get("tasks", 0)))[:show])
    rows = []
    for g in shown:
        grp = items[g]
        scores = grp.get("scores") or {}
        for i, (name, sc) in enumerate(scores.items()):
            rows.append([g if i == 0 else "", name, f"{grp['tasks']:,}" if i == 0 else "", *_score_cells(sc)])
        if not scores:
            rows.append([g, "-", f"{grp['tasks']:,}", "0", "-", "", "0", "0"])
    return rows, len(items) - len(shown)


def print_groups(groups: dict[str, Any], console: Console) -> None:
    from rich import box
    from rich.table import Table

    rows, hidden = group_rows(groups)
    t = Table(title=f"scores by {groups.get('by')}", title_justify="left", box=box.SIMPLE_HEAD,
              caption="score: accuracy of 0/1 scores, with its 95% Wilson interval; else the mean",
              caption_justify="left")
    for col in ("group", "scorer", "tasks", "n", "score", "95% CI", "unscored", "errors"):
        t.add_column(col, justify="left" if col in ("group", "scorer") else "right",
                     no_wrap=col not in ("group", "scorer"))
    for r in rows:
        t.add_row(*r)
    console.print(t)
    over = groups.get("overflowed")
    if hidden or over:
        console.print((f"{hidden:,} smaller group(s) not shown (summary.json has them all)" if hidden else "")
                      + ("; " if hidden and over else "")
                      + (f"more than {over['max_groups']:,} groups: {over['tasks']:,} task(s) counted in (other)"
                         if over else ""))


def score_rows(scores: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for name, sc in scores.items():
        # unscored tasks (no 'expected') are neither wrong nor errors: counted apart, outside n
        errs = (f", {sc['unscored']:,} unscored" if sc.get("unscored") else "") + (
            f", {sc['errors']:,} errors" if sc["errors"] else "") + (
            f" (read by {sc['implementation']})" if sc.get("implementation") else "")
        if sc.get("accuracy") is not None:
            lo, hi = sc["ci95"]
            rows.append((f"score {name}", f"accuracy {sc['accuracy']:.3f} (95% CI {lo:.3f}-{hi:.3f}), "
                                          f"n={sc['count']:,}{errs}"))
        elif sc.get("mean") is not None:
            rows.append((f"score {name}", f"mean {sc['mean']:.4f}, n={sc['count']:,}{errs}"))
        else:
            rows.append((f"score {name}", f"no score (n=0){errs}"))
    return rows


def judge_rows(usage: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The judge's tokens (--scorer judge), apart from the answers'."""
    if not usage:
        return []
    return [("judge tokens", f"{usage['prompt']:,} prompt + {usage['completion']:,} completion over "
                             f"{usage['requests']:,} judged answers (not in the answers' tokens)")]


def print_scores(scores: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    t = Table(title="scores", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    for k, v in score_rows(scores):
        t.add_row(k, v)
    console.print(t)
