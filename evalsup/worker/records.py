"""The finished output line of one task, built from its ``Outcome``, and the RESULT frame's meta beside it.

The line is what ``results.jsonl`` will hold (``tasks.records``: id, status, response, error, metrics, metadata,
scores); the supervisor never parses it, it reads only the meta (``ipc.messages.ResultMeta``: ok, latency,
attempts, tokens, error code...; what the answer was billed for, ``tasks.billed``: its tokens, ``cr``/``cw`` the
prompt tokens the provider's cache served and wrote (``w1`` of them kept an hour), ``tr`` its service tier, ``md``
the model its response names when not the request's, so the budget prices it as billed).
A large response body (``BIG_BODY`` and up) that is the endpoint's own bytes goes out between the record's head
and tail, never copied into a line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from evalsup.scoring.scorers import Scored
from evalsup.tasks.billed import billed, tier_of
from evalsup.tasks.records import output_line, output_line_around
from evalsup.tasks.secrets import Scrubber
from evalsup.worker.bodies import UsageOnly
from evalsup.worker.client import Outcome

BIG_BODY = 1 << 14  # a response body this large is written around, not copied into its output line


@dataclass(frozen=True, slots=True)
class CacheNote:
    """The cache's word on one task (issue 30): its key (hex); ``hit``: answered from the cache; ``keep``: the
    answer is to be kept, with [request id, model, path] (the supervisor writes it once the record is committed)."""

    key: str
    hit: bool
    keep: list[Any] | None = None
    model: str | None = None  # a hit's model, as kept (the summary's tokens saved, by model)
    unfit: str | None = None  # a miss because the entry kept failed an answer's checks: why (issue 39)


@dataclass(frozen=True, slots=True)
class Extras:
    """What a task's record may carry beyond its answer, each part from one feature (None: not used).

    ``hedge``: whether the second copy's answer is the record (--hedge; meta ``hg``); ``judge_tokens``: the
    judge's (prompt, completion) tokens, counted apart from the answer's (--scorer judge; meta ``jpt``, ``jct``);
    ``group``: its group under --group-by (meta ``g``); ``reasks``: the times its answer was asked again for its
    JSON schema (``metrics.reasks``); ``reask_usage``: the (prompt, completion) tokens of the answers asked
    again, paid beside the record's own (``metrics.reask_usage``; meta ``rpt``, ``rct``: the caps spend them);
    ``cache``: the cache's word (a hit is marked ``metrics.cache: "hit"``; an answer to keep is written as head,
    body, tail, and the meta's ``ck`` says where its body is in the line); ``tier``: the ``service_tier`` its
    request asked (an answer is priced at the tier its response names, else at this one: meta ``tr``, and
    ``metrics.service_tier`` when the response named none, so a resume's read-back prices it alike); ``model``:
    the model its request asked, and ``own_model`` whether the task named it (not the run's --model): an answer is
    priced by the model its response names, else by this one (meta ``md`` when the response names another;
    ``metrics.model`` for a task's own model, so a resume's read-back knows it)."""

    hedge: bool | None = None
    judge_tokens: tuple[int, int] | None = None
    group: str | None = None
    reasks: int | None = None
    reask_usage: tuple[int, int] | None = None
    cache: CacheNote | None = None
    tier: str | None = None
    model: str | None = None
    own_model: bool = False


NONE = Extras()


def build(tid: str, oc: Outcome, key: int, waited_s: float, pid: int, endpoint: dict[str, Any] | None,
          metadata: dict[str, Any], scored: Scored | None = None,
          extras: Extras = NONE, scrub: Scrubber | None = None) -> tuple[list[bytes], dict[str, Any]]:
    """Task ``tid`` (its key ``key``): its output line (as parts to write one after the other) and the RESULT
    meta. ``waited_s``: the time it waited in this worker's queue; ``endpoint``: the index and public URL of its
    last attempt's endpoint (``endpoint_of``; None for an answer from the cache); ``scored``: its scores, when
    the run scores (a scorer that left it unscored is absent from the record's scores and named in the meta's
    ``us``); ``extras``: what the features that touched it add (``Extras``)."""
    hedge, judge_tokens, group = extras.hedge, extras.judge_tokens, extras.group
    reasks, reask_usage, cache = extras.reasks, extras.reask_usage, extras.cache
    # latency_s is the server's (the last attempt, request written to last byte); queue_s the time it waited
    # here (a slot under the limit, the pacer); total_s from the first attempt's start to the end
    metrics: dict[str, Any] = {"latency_s": round(oc.server_s, 6), "queue_s": round(waited_s + oc.queue_s, 6),
                               "total_s": round(oc.latency_s, 6), "attempts": oc.attempts, "worker": pid,
                               "endpoint": endpoint}
    if hedge is not None:  # a second copy was sent (issue 28): which one answered
        metrics["hedged"] = True
        metrics["hedge_won"] = hedge
    if oc.ttft_s is not None:
        metrics["ttft_s"] = round(oc.ttft_s, 6)
    if oc.itl_s is not None:
        metrics["itl_s"] = round(oc.itl_s, 6)
    if reasks is not None:
        metrics["reasks"] = reasks
    if reask_usage is not None:
        metrics["reask_usage"] = {"prompt_tokens": reask_usage[0], "completion_tokens": reask_usage[1]}
    if cache is not None and cache.hit:  # no request: no time at a server (the report's latencies skip it)
        metrics["latency_s"] = None
        metrics["cache"] = "hit"
    # what the answer was billed for (issue 40): its tokens, those the provider's prompt cache served and wrote,
    # and its service tier (the response's, else the request's), in the meta so the budget prices it as billed
    usage = oc.parsed.get("usage") if isinstance(oc.parsed, dict) else None
    bill = billed(usage)
    tier = tier_of(oc.parsed)
    if tier is None and extras.tier is not None and isinstance(usage, dict):
        tier = metrics["service_tier"] = extras.tier  # the response named none: the read-back finds it here
    # the model the answer is priced by (rundir.usage.billed_price): the response's when it has a price, else
    # the request's; the read-back knows the run's --model, and a task's own from here
    answered = oc.parsed.get("model") if isinstance(oc.parsed, dict) else None
    if extras.own_model and extras.model is not None and isinstance(usage, dict):
        metrics["model"] = extras.model
    fields: dict[str, Any] = {"status": oc.status, "request_id": oc.request_id, "error": _clean(scrub, oc.error),
                              "metrics": metrics, "metadata": metadata or None,
                              "scores": None if scored is None else scored.scores,
                              "score_errors": None if scored is None else _clean(scrub, scored.errors),
                              "score_detail": None if scored is None else _clean(scrub, scored.detail)}
    ck: list[Any] | None = None
    if cache is not None and cache.keep is not None:  # the body's place in the line: the cache reads it there
        body = oc.raw_json if oc.raw_json is not None else orjson.dumps(oc.body)
        head, tail = output_line_around(tid, **fields)
        out = [head, body, tail] if len(body) >= BIG_BODY else [head + body + tail]
        ck = [cache.key, len(head), len(body), *cache.keep]
    elif oc.raw_json is not None and len(oc.raw_json) >= BIG_BODY:  # raw_json: the body is the endpoint's bytes
        # the endpoint's own bytes go out between the record's head and tail: never copied into a line
        head, tail = output_line_around(tid, **fields)
        out = [head, oc.raw_json, tail]
    else:
        out = [output_line(tid, body=oc.body, **fields)]
    info: dict[str, Any] = {"k": key, "ok": oc.error is None, "lat": oc.server_s, "att": oc.attempts, "rb": oc.raw_len,
                            "ec": oc.error["code"] if oc.error else None, "ttft": oc.ttft_s, "rt": oc.sent - 1,
                            "pt": bill.prompt, "ct": bill.completion,
                            "sc": None if scored is None else scored.scores, "ep": oc.endpoint}
    if bill.cached:
        info["cr"] = bill.cached
    if bill.written:
        info["cw"] = bill.written
    if bill.written_1h:
        info["w1"] = bill.written_1h
    if tier is not None and isinstance(usage, dict):
        info["tr"] = tier
    if isinstance(answered, str) and answered and answered != extras.model and isinstance(usage, dict):
        info["md"] = answered
    if scored is not None and scored.unscored:
        info["us"] = scored.unscored
    if group is not None:
        info["g"] = group
    if reasks:
        info["rk"] = reasks
    if reask_usage is not None:
        info["rpt"], info["rct"] = reask_usage
    if judge_tokens is not None:  # the judge was asked: its tokens: never added to the answer's (summary judge_usage)
        info["jpt"], info["jct"] = judge_tokens
    if oc.stalled:
        info["st"] = oc.stalled  # attempts abandoned as stalled (timeout_stall), for the summary
    if hedge is not None:
        info["hg"] = 2 if hedge else 1  # hedged: 1, the first copy answered; 2, the second did
    if isinstance(oc.parsed, UsageOnly):
        info["chk"] = 1  # checked by simdjson, not built (counted in the summary)
    if cache is not None:
        info["ca"] = "h" if cache.hit else "m"
        if cache.hit:
            info["ch"] = cache.key
            info["cm"] = cache.model
        if ck is not None:
            info["ck"] = ck
        if cache.unfit is not None:
            info["cu"] = cache.unfit
    return out, info


def _clean(scrub: Scrubber | None, value: Any) -> Any:
    return value if scrub is None or not value else scrub.json(value)

