"""Logs that respect the reader, and recovery noticed fast (issue 28): ``--quiet`` prints the final line and
nothing else through an outage; a default run says an endpoint's outage once and its return once, never each
probe; the only endpoint down for 20 s is probed at most 5 s apart, the run resumes soon after it returns,
and the ETA says ``paused`` meanwhile instead of counting the wait. Real processes, real HTTP on 127.0.0.1
(the project's mock, set down and up at runtime), the outage timers at a fifth of their length
($EVALSUP_TEST_TIME_SCALE, evalsup/common/timescale.py: seconds of outage, not minutes); the rooms as units:
unit/test_log_gate.py."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, ids_of, mock_endpoints, wait_until, write_tasks

PACE = "200"  # requests a second: the run's length is known whatever the machine's load
# the outage timers (probe intervals, the log gate's repeat) at a fifth of their length (common/timescale.py):
# probes 0.2, 0.4, 0.8 s apart, at most 1 s while paused, so an outage of seconds shows what minutes would
FAST = {"EVALSUP_TEST_TIME_SCALE": "0.2"}


@pytest.fixture
def two() -> Iterator[list[MockThread]]:
    """Two replicas answering in ~40 ms: at the pace, ~8 requests are in flight, so both endpoints carry
    requests all the time (with 2 ms answers nearly every pick found both idle and took the first, and the
    dead replica could go on for seconds without the three failures that trip its breaker)."""
    yield from mock_endpoints(2, latency_ms=40, jitter_ms=5)


def events(run_dir: Path) -> list[dict[str, object]]:
    return [orjson.loads(x) for x in (run_dir / "events.jsonl").read_bytes().splitlines() if x]


def test_quiet_run_through_a_dead_replica_prints_only_the_final_line(
        tmp_path: Path, two: list[MockThread], start: Callable[..., Run]) -> None:
    n = 800
    tasks = write_tasks(tmp_path / "t.jsonl", n, form="prompt")
    run_dir = tmp_path / "t.run"
    p = start("run", "-q", "-w", "2", "-c", "16", "--max-requests-per-s", PACE, "--model", "mock-model",
              "--base-url", two[0].url, "--base-url", two[1].url, "--log-interval", "0.2", str(tasks), env=FAST)
    p.wait_results(run_dir, at_least=200)
    two[1].configure(down=True)  # dead for the rest of the run (~3 s: probed every 1 s, a line each before)
    assert p.finish() == 0, p.stderr
    assert p.stderr == "", p.stderr  # no "looks down", no "still down ... next probe in 5s", no progress
    out = p.stdout.splitlines()
    assert len(out) == 1 and out[0].startswith(f"evalsup: finished: {n:,} done ({n:,} ok, 0 failed)"), p.stdout
    assert_exactly_once(run_dir, ids_of(n))
    kinds = [e["event"] for e in events(run_dir)]  # the machine record keeps what the reader was spared
    assert kinds.count("endpoint_out") == 1 and "breaker_open" not in kinds, kinds


def test_quiet_run_that_stops_says_only_why(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 2000, extra={"mock": {"delay_s": 0.02}})
    p = start("run", "-q", "-w", "1", "-c", "8", "--max-wait-down", "3", "--model", "mock-model",
              "--base-url", mock.url, str(tasks))
    p.wait_results(tmp_path / "t.run", at_least=100)
    mock.configure(down=True)
    assert p.finish() == 75, p.stderr
    err = p.stderr.splitlines()
    assert len(err) == 1 and "down for more than --max-wait-down 3s" in err[0] and "rerun" in err[0], p.stderr
    assert len(p.stdout.splitlines()) == 1 and "stopped (" in p.stdout, p.stdout


def test_a_replica_down_is_said_down_once_and_back_once(
        tmp_path: Path, two: list[MockThread], start: Callable[..., Run]) -> None:
    n = 1300  # ~6.5 s at the pace: the run outlasts the outage and the rejoin
    tasks = write_tasks(tmp_path / "t.jsonl", n, form="prompt")
    run_dir = tmp_path / "t.run"
    p = start("run", "-w", "2", "-c", "16", "--max-requests-per-s", PACE, "--model", "mock-model",
              "--base-url", two[0].url, "--base-url", two[1].url, "--log-interval", "1", str(tasks), env=FAST)
    p.wait_results(run_dir, at_least=300)
    two[1].configure(down=True)
    wait_until(lambda: "looks down" in p.stderr, "endpoint 1 to be said down", proc=p)
    time.sleep(2.0)  # probed at 0, 0.2, 0.6, 1.4 s then every 1 s (scaled 1/5): each was a line before
    assert p.running(), "the run ended during the outage: give it more tasks"
    two[1].configure(down=False)
    wait_until(lambda: "it rejoins" in p.stderr, "endpoint 1 to rejoin", proc=p)
    assert p.finish() == 0, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "endpoint 1 (" in ln]
    assert len(said) == 2, said  # down, back: nothing per probe
    assert "looks down" in said[0] and "ejected" in said[0], said
    assert re.search(r"is back after [\d.]+s \(\d+ probes failed\); it rejoins", said[1]), said
    assert "still down" not in p.stderr and "next probe" not in p.stderr and "answers (" not in p.stderr
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("endpoint_out") == 1 and kinds.count("endpoint_back") == 1, kinds
    assert_exactly_once(run_dir, ids_of(n))


def eta_s(text: str) -> float:
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert m is not None, text
    h, mi, s = (int(x or 0) for x in m.groups())
    return h * 3600 + mi * 60 + s


PROGRESS = re.compile(r"evalsup: (running|waiting for endpoint): .* ([\d.]+) req/s, ETA (\S+),")


def test_the_only_endpoint_down_is_seen_back_soon_and_the_eta_waits(
        tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    n, down_s = 1000, 4.0  # 20 s of outage at the timers' full length (FAST: probes at most 1 s apart, not 5)
    tasks = write_tasks(tmp_path / "t.jsonl", n)
    run_dir = tmp_path / "t.run"
    p = start("run", "-w", "2", "-c", "16", "--max-requests-per-s", PACE, "--model", "mock-model",
              "--base-url", mock.url, "--log-interval", "0.5", str(tasks), env=FAST)
    p.wait_results(run_dir, at_least=400)
    t_down = time.time()
    mock.configure(down=True)
    wait_until(lambda: "endpoint looks down" in p.stderr, "the endpoint to be said down", proc=p)
    time.sleep(max(0.0, t_down + down_s - time.time()))
    t_up = time.time()
    mock.configure(down=False)
    wait_until(lambda: "endpoint is back" in p.stderr, "the endpoint to be seen back", proc=p)
    assert p.finish() == 0, p.stderr
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(r["error"] is None for r in recs)  # an outage fails no task
    err = p.stderr
    # what a person read: down once, back once, nothing per probe (every probe failed is in the count)
    assert err.count("endpoint looks down") == 1 and err.count("endpoint is back") == 1, err
    assert "still down" not in err and "next probe" not in err, err
    back = float(re.search(r"endpoint is back after ([\d.]+)s", err).group(1))  # type: ignore[union-attr]
    # the mock's view: probes while it was down, then the first request after it came back
    arrivals = sorted(mock.stats()["arrivals"])
    during = [a for a in arrivals if t_down + 0.5 < a < t_up]  # (the requests on the wire when it went, aside)
    gaps = [b - a for a, b in zip([t_down + 0.5, *during], [*during, t_up], strict=True)]
    first_after = min(a for a in arrivals if a >= t_up) - t_up
    print(f"\ndown {down_s:g}s: probes while down {len(during)}, widest gap {max(gaps):.2f}s; first request "
          f"{first_after:.2f}s after it came back; said back after {back:.1f}s")
    assert max(gaps) < 2.0, gaps  # every 1 s (5 s unscaled) at most while the run waits (was 8, then 16 s)
    assert first_after < 20.0, first_after  # a liveness bound; the seconds themselves are the report's
    # the ETA: "paused" while paused; after it, the rate is the running rate, not one diluted by the wait
    lines = [(m.group(1), float(m.group(2)), m.group(3)) for m in PROGRESS.finditer(err)]
    before_i = err.index("endpoint looks down")
    after_i = err.index("endpoint is back")
    waiting = [m.group(3) for m in PROGRESS.finditer(err) if m.group(1) == "waiting for endpoint"]
    assert waiting and set(waiting) == {"paused"}, waiting
    before = [float(m.group(2)) for m in PROGRESS.finditer(err) if m.start() < before_i and m.group(1) == "running"]
    after = [float(m.group(2)) for m in PROGRESS.finditer(err) if m.start() > after_i and m.group(1) == "running"]
    assert before and after, lines
    assert after[0] > before[-1] / 3, (before[-3:], after[:3])  # was ~1/6 over a 30 s window holding 25 s paused
