"""The run's summary: summary.json and the table printed at the end."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

from evalsup.config import exitcodes
from evalsup.config.caps import budget_text
from evalsup.rundir.run_json import recorded_settings
from evalsup.supervisor.view import RunView

MB = 1 << 20


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
        **({"scores": st.scores.summary()} if st.scores else {}),
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
        "finished": run.finished,
        "stopped": run.stop_message or None,
        "settings": recorded_settings(run.run_dir),  # the request settings of run.json (evalsup.rundir.run_json)
        "run_dir": str(run.run_dir),
    }


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
    if summary.get("timeout_stall"):
        rows.insert(-1, ("stalls", f"{summary['timeout_stall']:,} attempt(s) abandoned and retried (timeout_stall: "
                                   "no result in the run for --stall-after while they were on the wire)"))
    hedges = summary.get("hedges") or {}
    if hedges.get("sent"):
        rows.insert(-1, ("hedges", f"{hedges['sent']:,} request(s) sent twice (--hedge), {hedges['won']:,} "
                                   "answered first by the second copy (the other copy cancelled)"))
    rows.extend(score_rows(summary.get("scores", {})))
    rows.extend(judge_rows(summary.get("judge_usage")))
    if summary["poisoned"]:
        rows.append(("poisoned", ", ".join(summary["poisoned"][:10])))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)


def score_rows(scores: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for name, sc in scores.items():
        # unscored tasks (no 'expected') are neither wrong nor errors: counted apart, outside n
        errs = (f", {sc['unscored']:,} unscored" if sc.get("unscored") else "") + (
            f", {sc['errors']:,} errors" if sc["errors"] else "")
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
