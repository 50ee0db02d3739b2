"""Many endpoints (issue 21 item 1): requests spread over several --base-url; one that goes down is ejected,
probed on its own and rejoins, and no task fails while another is up; one that fails the connection check is
left out. Real processes, real HTTP on 127.0.0.1 (three mock endpoints); the choice rule as a unit is in
unit/test_endpoints.py."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from evalsup.mock.server import MockThread
from evalsup.tools.report import write_report
from evalsup.tools.status import status_text
from tests.harness import (
    Run,
    assert_exactly_once,
    ids_of,
    mock_endpoints,
    read_results,
    summary,
    wait_until,
    write_tasks,
)


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


# ----------------------------------------------------------------------------------------- the rooms
