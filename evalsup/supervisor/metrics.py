"""Prometheus metrics (--metrics-port): served from a thread by prometheus-client, fed by the supervisor loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from evalsup.common.states import EndpointState
from evalsup.ipc.messages import ResultMeta
from evalsup.scoring.groups import GroupedScores
from evalsup.scoring.scorers import ScoreStats
from evalsup.supervisor.limits import EndpointLoad
from evalsup.supervisor.policies import RecycleCause

TOP_GROUPS = 50  # --group-by: the groups with the most tasks get a label each; the rest are "(other)"
ALL = "(all)"  # the group label of the run's overall score
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.tasks = Counter("evalsup_tasks_total", "Tasks written to results.jsonl, by outcome", ["outcome"],
                             registry=r)
        # requests on the wire, as the server counts them (the workers' heartbeats), not tasks queued in workers
        self.inflight = Gauge("evalsup_tasks_in_flight", "Requests on the wire (sent, not yet answered)", registry=r)
        self.latency = Histogram("evalsup_request_latency_seconds", "Task latency, first attempt to last byte",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("evalsup_ttft_seconds", "Time to first token of streamed responses",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.retries = Counter("evalsup_retries_total", "Retried attempts", registry=r)
        # --hedge (issue 28): tasks whose request got a second copy, and those whose record is the copy's answer
        self.hedges = Counter("evalsup_hedges_total", "Tasks whose request was sent twice (--hedge)", registry=r)
        self.hedges_won = Counter("evalsup_hedges_won_total", "Hedged tasks whose record is the second copy's "
                                  "answer", registry=r)
        self.restarts = Counter("evalsup_worker_restarts_total", "Unplanned worker restarts, by cause", ["cause"],
                                registry=r)
        self.recycles = Counter("evalsup_worker_recycles_total", "Planned worker recycles, by cause", ["cause"],
                                registry=r)
        self.throttled = Gauge("evalsup_throttled", "1 while dispatch is paused for memory", registry=r)
        self.endpoint_down = Gauge("evalsup_endpoint_down", "1 while the circuit breaker is open", registry=r)
        self.worker_rss = Gauge("evalsup_worker_rss_bytes", "Resident memory of each worker", ["slot"], registry=r)
        self.supervisor_rss = Gauge("evalsup_supervisor_rss_bytes", "Resident memory of the supervisor", registry=r)
        self.cgroup_usage = Gauge("evalsup_cgroup_working_set_bytes", "Container working set", registry=r)
        self.concurrency_limit = Gauge("evalsup_concurrency_limit", "Requests the workers may have in flight now "
                                       "(the adaptive limit, or --concurrency)", registry=r)  # issue 21
        # issue 21: each endpoint (label: its public URL, no credentials)
        self.ep_limit = Gauge("evalsup_endpoint_concurrency_limit", "Requests the workers may send this endpoint now",
                              ["endpoint"], registry=r)
        self.ep_inflight = Gauge("evalsup_endpoint_in_flight", "Requests on the wire to this endpoint", ["endpoint"],
                                 registry=r)
        self.ep_up = Gauge("evalsup_endpoint_up", "1 while the endpoint takes requests (0: ejected or left out)",
                           ["endpoint"], registry=r)
        # scores (the run's, group "(all)"; with --group-by each of the TOP_GROUPS largest groups and "(other)")
        self.score_mean = Gauge("evalsup_score_mean", "Mean score of the tasks scored, by scorer and group",
                                ["scorer", "group"], registry=r)
        self.score_count = Gauge("evalsup_score_count", "Tasks scored, by scorer and group", ["scorer", "group"],
                                 registry=r)
        self.score_errors = Gauge("evalsup_score_errors", "Tasks the scorer failed on, by scorer and group",
                                  ["scorer", "group"], registry=r)
        self.cgroup_limit = Gauge("evalsup_cgroup_limit_bytes", "Effective memory limit (0: none)", registry=r)
        # issue 30, with a cap: spent, reserved by the requests out, projected for the whole run, and the caps
        self.budget_usd = Gauge("evalsup_budget_usd", "US dollars: spent, reserved, projected, cap (with a cap)",
                                ["what"], registry=r)
        self.budget_tokens = Gauge("evalsup_budget_tokens", "Tokens (with a cap) by what (spent, reserved, "
                                   "projected, cap) and kind (prompt, completion, total)", ["what", "kind"], registry=r)
        # --cache (issue 30): answers from the cache, and requests sent with it on (a miss each)
        self.cache_hits = Counter("evalsup_cache_hits", "Tasks answered from the cache (--cache)", registry=r)
        self.cache_misses = Counter("evalsup_cache_misses", "Requests sent with the cache on (--cache)", registry=r)
        self.cache_unusable = Counter("evalsup_cache_unusable", "Of the misses: an entry kept failed an answer's "
                                      "checks (damaged, no answer) and was asked again (--cache)", registry=r)
        for outcome in ("succeeded", "failed"):
            self.tasks.labels(outcome)
        for cause in ("crashed", "hung"):
            self.restarts.labels(cause)
        for cause in RecycleCause:
            self.recycles.labels(cause)

    def serve(self, host: str, port: int) -> Any:
        return start_http_server(port, addr=host, registry=self.registry)

    def on_result(self, meta: ResultMeta) -> None:
        """One record written (its RESULT frame's meta): counted, its latency observed unless it was answered
        from the cache (no request: the summary and the report skip it too); its ``hg`` (1: hedged, the first
        copy answered; 2: the second)."""
        self.tasks.labels("succeeded" if meta["ok"] else "failed").inc()
        hedge = meta.get("hg")
        if hedge:
            self.hedges.inc()
            if hedge == 2:
                self.hedges_won.inc()
        if meta.get("ca") != "h":
            self.latency.observe(float(meta["lat"]))
        if "cu" in meta:  # (a miss: on_cache counts it with the others)
            self.cache_unusable.inc()
        ttft = meta.get("ttft")
        retries = int(meta["rt"])
        if ttft is not None:
            self.ttft.observe(ttft)
        if retries:
            self.retries.inc(retries)

    def scores(self, overall: ScoreStats, groups: GroupedScores | None) -> None:
        """The score gauges, every monitor tick: at most (TOP_GROUPS + 2) x scorers label sets."""
        for g in (self.score_mean, self.score_count, self.score_errors):
            g.clear()
        views = [(ALL, overall)]
        if groups is not None:
            views += [(name, grp.scores) for name, grp in groups.top(TOP_GROUPS).items()]
        for group, st in views:
            for scorer, n in st.n.items():
                self.score_mean.labels(scorer, group).set(st.total.get(scorer, 0.0) / n if n else 0.0)
                self.score_count.labels(scorer, group).set(n)
            for scorer, n in st.errors.items():
                self.score_errors.labels(scorer, group).set(n)

    def on_cache(self, cache: str | None) -> None:
        """A result with the cache on: its RESULT's ``ca`` ("h" answered from the cache, "m" sent)."""
        if cache == "h":
            self.cache_hits.inc()
        elif cache == "m":
            self.cache_misses.inc()

    def update_budget(self, b: dict[str, Any]) -> None:
        """The budget's gauges from ``Budget.to_json``."""
        for what in ("spent", "reserved", "projected"):
            fig = b.get(what)
            if fig is None:
                continue
            self.budget_usd.labels(what).set(fig["cost_usd"])
            self.budget_tokens.labels(what, "prompt").set(fig["prompt_tokens"])
            self.budget_tokens.labels(what, "completion").set(fig["completion_tokens"])
        caps = b["caps"]
        if caps.get("cost") is not None:
            self.budget_usd.labels("cap").set(caps["cost"])
        if caps.get("completion_tokens") is not None:
            self.budget_tokens.labels("cap", "completion").set(caps["completion_tokens"])
        if caps.get("total_tokens") is not None:
            self.budget_tokens.labels("cap", "total").set(caps["total_tokens"])

    def update(self, inflight: int, throttled: bool, down: bool, worker_rss: dict[int, int], supervisor_rss: int,
               working_set: int, limit: int | None, concurrency_limit: int,
               endpoints: Sequence[EndpointLoad] = ()) -> None:
        """The gauges, every monitor tick: ``worker_rss`` maps a worker's slot to its RSS (0: not sampled)."""
        self.inflight.set(inflight)
        self.throttled.set(1 if throttled else 0)
        self.endpoint_down.set(1 if down else 0)
        self.worker_rss.clear()
        for slot, rss in worker_rss.items():
            if rss:
                self.worker_rss.labels(str(slot)).set(rss)
        self.supervisor_rss.set(supervisor_rss)
        self.cgroup_usage.set(working_set)
        self.cgroup_limit.set(limit or 0)
        self.concurrency_limit.set(concurrency_limit)
        for e in endpoints:
            self.ep_limit.labels(e["url"]).set(e["limit"])
            self.ep_inflight.labels(e["url"]).set(e["in_flight"])
            self.ep_up.labels(e["url"]).set(1 if e["state"] == EndpointState.UP else 0)
