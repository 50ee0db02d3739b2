"""Many endpoints (issue 21 item 1), the choice rule as a unit: --base-url forms, credentials kept out of
what is shown, pick by load against each endpoint's own limit, parked requests, and the breakers. (Real runs
against several mock endpoints: integration/test_endpoints_runs.py.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from evalsup.config.run_config import ConfigError, build_config, resolve_base_urls
from evalsup.supervisor.endpoints import Endpoints
from evalsup.tasks.requests import public_url
from evalsup.worker.adaptive import AdaptiveLimit, AdaptiveSettings
from evalsup.worker.endpoints import EndpointPool

# ----------------------------------------------------------------------------------------- real processes


# ----------------------------------------------------------------------------------------- settings

def test_base_urls_from_flags_or_a_comma_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://a:1/v1, http://b:2/v1/")
    assert resolve_base_urls(None) == ("http://a:1/v1", "http://b:2/v1")
    assert resolve_base_urls(["http://c/v1"]) == ("http://c/v1",)
    assert resolve_base_urls("http://c/v1") == ("http://c/v1",)
    with pytest.raises(ConfigError, match="given twice"):
        resolve_base_urls(["http://c/v1", "http://c/v1/"])
    with pytest.raises(ConfigError, match="http:// or https://"):
        resolve_base_urls(["c:80"])
    cfg = build_config(Path("t.jsonl"), {"base_url": ["http://a/v1", "http://b/v1"], "concurrency": 8})
    assert cfg.worker.endpoints == ("http://a/v1", "http://b/v1") and cfg.worker.base_url == "http://a/v1"
    with pytest.raises(ConfigError, match="--server-metrics"):
        build_config(Path("t.jsonl"), {"base_url": ["http://a/v1", "http://b/v1"], "server_metrics": "http://m/"})


def test_public_url_drops_credentials() -> None:
    assert public_url("https://user:secret@h.example:8443/v1?api-key=k") == "https://h.example:8443/v1"
    assert public_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


# ----------------------------------------------------------------------------------------- the rooms

def test_pick_goes_to_the_least_loaded_relative_to_its_limit() -> None:
    pool = EndpointPool(["http://a/v1", "http://b/v1", "http://c/v1"])
    chosen = []
    for _ in range(9):  # fixed limits: fewest on the wire, so an even spread
        ep = pool.pick(12)
        assert ep is not None
        ep.on_wire += 1
        chosen.append(ep.index)
    assert Counter(chosen) == {0: 3, 1: 3, 2: 3}
    pool.set_open(1, True)  # ejected: gets nothing
    for _ in range(4):
        ep = pool.pick(12)
        assert ep is not None and ep.index != 1
        ep.on_wire += 1
    pool.set_open(1, False)
    ep = pool.pick(12)
    assert ep is not None and ep.index == 1  # back, and the least loaded
    pool.set_open(0, True, out=True)
    pool.set_open(0, False)  # left out for good: a close does not bring it back
    assert not pool.all[0].up


def test_a_request_asked_to_wait_goes_to_another_with_room() -> None:
    pool = EndpointPool(["http://a/v1", "http://b/v1", "http://c/v1"])
    a, b, c = pool.all
    c.out = True
    assert pool.pick(4, avoid=a, now=1.0) is b and pool.room_elsewhere(a, 4, now=1.0)
    b.on_wire = 4
    assert not pool.room_elsewhere(a, 4, 1.0)  # b is full: the request waits as the server asked
    assert pool.pick(4, avoid=a, now=1.0) is b  # (a request moved anyway still tries another first)
    b.on_wire = 0
    b.cool_until = 6.0  # b asked for a wait too (a 429 storm on both): no bouncing between them meanwhile
    assert not pool.room_elsewhere(a, 4, 1.0) and pool.room_elsewhere(a, 4, 6.0)
    a.cool_until = 5.0
    assert pool.pick(4, now=1.0) is a and pool.pick(4, now=5.5) is a  # both asked: the least loaded, the first
    a.on_wire = 1
    assert pool.pick(4, now=5.5) is a  # b's wait still runs: it comes last, even with less on the wire
    assert pool.pick(4, now=6.5) is b and pool.pick(4, now=1.0) is b  # none (or both) waiting: the least loaded
    pool.set_open(1, True)
    assert pool.pick(4, avoid=a, now=9.0) is a and not pool.room_elsewhere(a, 4, 9.0)  # the only one up


def test_pick_weighs_each_endpoint_by_its_own_adaptive_limit() -> None:
    limits = iter([4, 16])

    def ctl() -> AdaptiveLimit:
        return AdaptiveLimit(AdaptiveSettings(max_limit=64, initial=next(limits)))

    pool = EndpointPool(["http://slow/v1", "http://fast/v1"], ctl)
    for _ in range(20):
        ep = pool.pick(64)
        assert ep is not None
        ep.on_wire += 1
    assert [ep.on_wire for ep in pool.all] == [4, 16]  # in proportion to the limits
    assert pool.limit(64) == 20 and pool.limit(10) == 10


def test_parked_requests_wait_for_any_endpoint_and_learn_if_it_was_down() -> None:
    async def go() -> tuple[bool, bool]:
        pool = EndpointPool(["http://a/v1", "http://b/v1"])
        pool.set_open(0, True)
        assert await pool.wait_up() is False  # b is up: nothing to wait for
        pool.set_open(1, True)
        assert pool.pick(4) is None and not pool.any_up()
        waiter = asyncio.ensure_future(pool.wait_up())
        await asyncio.sleep(0)
        pool.set_open(1, False, was_down=True)
        first = await waiter
        pool.set_open(1, True)
        waiter = asyncio.ensure_future(pool.wait_up())
        await asyncio.sleep(0)
        pool.set_open(0, False, was_down=False)  # a false alarm: the attempt counts
        return first, await waiter

    assert asyncio.run(go()) == (True, False)


def test_the_run_pauses_only_when_every_endpoint_is_down() -> None:
    eps = Endpoints(["http://a/v1", "http://b/v1", "http://c/v1"], max_down_s=60.0)
    eps.leave_out(2, "cannot reach", 0.0)
    assert not eps.trip(2, 0.0, "x")  # left out: never ejected, never probed
    assert eps.trip(0, 1.0, "reset") and not eps.open
    assert not eps.trip(0, 1.5, "again")  # already ejected
    assert eps.probes_due(1.0) == [0]
    eps.probe_sent(0, 1.0)
    assert not eps.probe_result(0, False, 1.1)  # still down: probed again later
    t = 1.1
    for _ in range(8):  # growing intervals, but never more than 5 s apart while others serve
        t = next(x / 10 for x in range(int(t * 10), int(t * 10) + 60) if eps.probes_due(x / 10))
        eps.probe_sent(0, t)
        eps.probe_result(0, False, t)
    assert eps.probes_due(t + 5.0) == [0] and eps.breakers[0].interval == 5.0
    assert eps.trip(1, 50.0, "reset") and eps.open and eps.opened == 1  # the last one up went down
    assert not eps.down_too_long(109.0) and eps.down_too_long(111.0)  # counted from the last one down
    assert eps.probe_result(1, True, 55.0) and not eps.open and eps.total_down_s(55.0) == 5.0
    assert eps.open_frames() == [{"e": 0}, {"e": 2, "out": True}]
    s = eps.summary(55.0, {1: 7})
    assert [e["results"] for e in s] == [0, 7, 0] and s[0]["ejected"] == 1 and s[2]["left_out"] == "cannot reach"


def test_an_endpoint_left_out_mid_run_while_the_others_are_down() -> None:
    eps = Endpoints(["http://a/v1", "http://b/v1"], max_down_s=60.0)
    assert eps.trip(1, 1.0, "reset") and not eps.open
    eps.probe_sent(0, 2.0)  # (say a probe of 0 is out when 0 is left out)
    eps.leave_out(0, "it refused the API key", 2.0)  # the one serving is left out; 1 is ejected
    assert eps.open and eps.reason == "reset" and eps.opened == 1  # the run waits for 1, as for any outage
    assert not eps.probe_result(0, True, 2.5) and eps.open  # the left-out one's late answer changes nothing
    assert eps.probes_due(3.0) == [1] and not eps.down_too_long(61.0) and eps.down_too_long(63.0)
    assert eps.probe_result(1, True, 4.0) and not eps.open


def test_one_endpoint_behaves_as_the_single_breaker() -> None:
    eps = Endpoints(["http://a/v1"], max_down_s=10.0)
    assert eps.name(0) == "endpoint"
    assert eps.trip(0, 0.0, "refused") and eps.open
    assert eps.down_too_long(10.5)
    assert eps.probe_result(0, True, 11.0) and not eps.open and eps.breakers[0].false_alarms == 1
