"""Many endpoints (issue 21 item 1): requests spread over several --base-url; one that goes down is ejected,
probed on its own and rejoins, and no task fails while another is up; one that fails the connection check is
left out. Real processes, real HTTP on 127.0.0.1 (three mock endpoints), and the choice rule as a unit."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest
from conftest import (
    Run,
    assert_exactly_once,
    ids_of,
    mock_endpoints,
    read_results,
    summary,
    wait_until,
    write_tasks,
)

from evalsup.config.run_config import ConfigError, build_config, resolve_base_urls
from evalsup.mock.server import MockThread
from evalsup.supervisor.endpoints import Endpoints
from evalsup.tasks.requests import public_url
from evalsup.tools.report import write_report
from evalsup.tools.status import status_text
from evalsup.worker.adaptive import AdaptiveLimit, AdaptiveSettings
from evalsup.worker.endpoints import EndpointPool


@pytest.fixture
def mocks() -> Iterator[list[MockThread]]:
    yield from mock_endpoints(3)


def served_by(run_dir: Path) -> Counter[int]:
    if not (run_dir / "results.jsonl").exists():
        return Counter()
    return Counter(r["metrics"]["endpoint"]["index"] for r in read_results(run_dir))


# ----------------------------------------------------------------------------------------- real processes

def test_one_endpoint_down_mid_run_is_ejected_and_rejoins_and_nothing_fails(
        tmp_path: Path, mocks: list[MockThread], start: Callable[..., Run]) -> None:
    n = 4000
    tasks = write_tasks(tmp_path / "t.jsonl", n, form="prompt", extra={"mock": {"delay_s": 0.04}})
    run_dir = tmp_path / "t.run"
    urls = [a for m in mocks for a in ("--base-url", m.url)]
    p = start("run", "-w", "2", "-c", "24", "--max-attempts", "3", "--model", "mock-model", *urls,
              "--log-interval", "0.2", "--monitor-interval", "0.2", str(tasks))
    p.wait_results(run_dir, at_least=300)
    hosts = [urlsplit(m.url).netloc for m in mocks]
    # each endpoint's requests on the wire and limit, in the progress line and `evalsup status`
    wait_until(lambda: re.search(rf"endpoints: {hosts[0]} \d+/24, {hosts[1]} \d+/24, {hosts[2]} \d+/24", p.stderr),
               "the progress line to show each endpoint", proc=p)
    wait_until(lambda: status_text(run_dir).count("  endpoint    ") == 3, "status to show each endpoint", proc=p)
    mocks[1].configure(down=True)
    wait_until(lambda: "endpoint 1 (" in p.stderr and "looks down" in p.stderr, "endpoint 1 to be ejected", proc=p)
    wait_until(lambda: f"{hosts[1]} down" in p.stderr.rsplit("looks down", 1)[1], "the progress line to say so",
               proc=p)
    wait_until(lambda: f"{mocks[1].url}: down (ejected" in status_text(run_dir), "status to say so", proc=p)
    during = served_by(run_dir)
    time.sleep(2.0)  # down for a while: the others carry the run
    assert p.running(), "the run ended before the endpoint came back: give it more tasks"
    assert served_by(run_dir)[0] > during[0] and served_by(run_dir)[2] > during[2], "the others stopped"
    mocks[1].configure(down=False)
    wait_until(lambda: "endpoint 1 (" in p.stderr and "it rejoins" in p.stderr, "endpoint 1 to rejoin", proc=p)
    back = served_by(run_dir)[1]
    assert p.finish() == 0, p.stderr
    recs = assert_exactly_once(run_dir, {f"t{i}" for i in range(n)})
    assert [r for r in recs if r["error"] is not None] == []
    assert all(r["metrics"]["attempts"] <= 3 for r in recs)
    final = served_by(run_dir)
    assert final[1] > back, "the endpoint that came back served nothing more"
    assert set(final) == {0, 1, 2}
    s = summary(run_dir)
    assert s["failed"] == 0 and s["breaker"]["opened"] == 0  # the run never paused for it
    assert "pausing dispatch" not in p.stderr
    eps = s["endpoints"]
    assert [e["url"] for e in eps] == [m.url for m in mocks]
    assert eps[1]["ejected"] >= 1 and eps[1]["down_s"] > 0 and eps[0]["ejected"] == eps[2]["ejected"] == 0
    assert sum(e["results"] for e in eps) == n
    assert {r["metrics"]["endpoint"]["url"] for r in recs} == {m.url for m in mocks}
    # memory.jsonl keeps each endpoint's load over time: the report draws each one's limit
    samples = [orjson.loads(ln) for ln in (run_dir / "memory.jsonl").read_bytes().splitlines()]
    states = [[e["state"] for e in s["endpoints"]] for s in samples]
    assert ["up", "down", "up"] in states and ["up", "up", "up"] in states
    assert all(e["url"] == m.url for s in samples for e, m in zip(s["endpoints"], mocks, strict=True))
    assert any(e["in_flight"] > 0 for s in samples for e in s["endpoints"])
    html = write_report(run_dir).read_text()
    assert all(f"limit of {m.url}" in html for m in mocks)


def test_an_endpoint_that_fails_the_check_is_left_out(tmp_path: Path, mocks: list[MockThread],
                                                      start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 300, form="prompt")
    dead = "http://127.0.0.1:9/v1"
    p = start("run", "-w", "1", "--model", "mock-model", "--base-url", mocks[0].url, "--base-url", dead,
              "--base-url", mocks[2].url, str(tasks))
    assert p.finish() == 0, p.stderr
    left = [ln for ln in p.stderr.splitlines() if "left out" in ln]
    assert len(left) == 1 and f"endpoint 1 ({dead})" in left[0] and "cannot reach" in left[0], p.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(300))
    assert set(served_by(tmp_path / "t.run")) == {0, 2}
    eps = summary(tmp_path / "t.run")["endpoints"]
    assert "cannot reach" in eps[1]["left_out"] and eps[1]["results"] == 0


def test_an_endpoint_that_refuses_the_key_is_left_out_and_the_others_finish(
        tmp_path: Path, mocks: list[MockThread], start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 600, form="prompt")
    mocks[1].configure(revoke_after=30)  # a replica that stops taking the key (rotated there, a gateway's rule)
    p = start("run", "-w", "2", "--model", "mock-model", *(a for m in mocks for a in ("--base-url", m.url)),
              str(tasks))
    assert p.finish() == 0, p.stderr
    left = [ln for ln in p.stderr.splitlines() if "left out" in ln]
    assert len(left) == 1 and f"endpoint 1 ({mocks[1].url})" in left[0] and "refused the API key" in left[0], \
        p.stderr
    recs = assert_exactly_once(tmp_path / "t.run", ids_of(600))
    assert all(x["error"] is None for x in recs), [x["error"] for x in recs if x["error"]][:3]
    by = served_by(tmp_path / "t.run")
    assert set(by) == {0, 1, 2} and by[1] < 30, by  # it served until it refused, then the others took all
    assert "refused the API key" in summary(tmp_path / "t.run")["endpoints"][1]["left_out"]


def test_every_endpoint_refusing_the_key_stops_resumably(tmp_path: Path, mocks: list[MockThread],
                                                         start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 600, form="prompt")
    args = ("run", "-w", "2", "--model", "mock-model", "--base-url", mocks[0].url, "--base-url", mocks[1].url,
            str(tasks))
    for m in mocks[:2]:
        m.configure(revoke_after=40)
    p = start(*args)
    assert p.finish() == 75, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "no endpoint left in the run takes the API key" in last and last.count("rerun") == 1, p.stderr
    done = read_results(tmp_path / "t.run")
    assert done and all(x["error"] is None for x in done)  # no task failed for it
    for m in mocks[:2]:
        m.configure(revoke_after=None)
    r = start(*args)
    assert r.finish() == 0, r.stderr
    assert all(x["error"] is None for x in assert_exactly_once(tmp_path / "t.run", ids_of(600)))


def test_a_replica_that_answers_only_429_holds_no_task_back(tmp_path: Path, mocks: list[MockThread],
                                                            start: Callable[..., Run]) -> None:
    # an overloaded replica says "wait 30 s": while the others have room its requests go to them at once (as
    # LiteLLM's router moves a request off a deployment in cooldown); before, a task waited the 30 s, and again
    mocks[2].configure(fail_429=1.0, retry_after_s=30.0)
    tasks = write_tasks(tmp_path / "t.jsonl", 600, form="prompt")
    p = start("run", "-w", "2", "--model", "mock-model", *(a for m in mocks for a in ("--base-url", m.url)),
              str(tasks))
    assert p.finish() == 0, p.stderr
    recs = assert_exactly_once(tmp_path / "t.run", ids_of(600))
    assert all(x["error"] is None for x in recs)
    assert set(served_by(tmp_path / "t.run")) == {0, 1}
    asked = int(mocks[2].stats()["statuses"].get("429", 0))
    assert asked > 0, "the replica was never tried"
    assert max(x["metrics"]["total_s"] for x in recs) < 30.0  # no task sat out a Retry-After


def test_a_429_storm_on_every_endpoint_is_waited_out_not_bounced(tmp_path: Path, mocks: list[MockThread],
                                                                  start: Callable[..., Run]) -> None:
    # both replicas say "wait 2 s": a request may try the other once, then it waits as asked; it must not go
    # back and forth, sending many times what the servers asked for
    for m in mocks[:2]:
        m.configure(fail_429=1.0, retry_after_s=2.0)
    tasks = write_tasks(tmp_path / "t.jsonl", 20, form="prompt")
    p = start("run", "-w", "1", "-c", "20", "--model", "mock-model", "--base-url", mocks[0].url, "--base-url",
              mocks[1].url, str(tasks))
    wait_until(lambda: sum(int(m.stats()["statuses"].get("429", 0)) for m in mocks[:2]) >= 20, "the storm's answers")
    time.sleep(1.0)  # well inside the 2 s asked for
    during = sum(int(m.stats()["statuses"].get("429", 0)) for m in mocks[:2])
    for m in mocks[:2]:
        m.configure(fail_429=0.0)
    assert p.finish() == 0, p.stderr
    assert during <= 2 * 20, f"{during} requests answered 429 for 20 tasks within one Retry-After"
    assert all(x["error"] is None for x in assert_exactly_once(tmp_path / "t.run", ids_of(20)))


def test_every_endpoint_failing_the_check_stops_the_run(tmp_path: Path, start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 5, form="prompt")
    p = start("run", "--model", "mock-model", "--base-url", "http://127.0.0.1:9/v1", "--base-url",
              "http://127.0.0.1:7/v1", str(tasks))
    assert p.finish() == 2
    assert "no endpoint passed the connection check" in p.stderr.strip().splitlines()[-1]


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
