"""The tail of a run is visible and bounded (issue 28): `evalsup status` names the requests longest on the wire,
and a run whose only requests left hang is not held by them: after --stall-after with no result they are
abandoned (timeout_stall) and retried, each task written once. Real processes, real HTTP against the mock,
which holds a `mock.hang` request until the client gives up on it (with `times`, only its first attempts)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from evalsup.mock.server import MockThread
from tests.harness import Run, assert_exactly_once, lines, run_cli, summary, wait_until


def status_json(path: Path) -> dict[str, Any]:
    r = run_cli("status", "--json", str(path))
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = orjson.loads(r.stdout)
    return out


def test_a_hung_first_attempt_is_abandoned_and_retried_once_the_run_stalls(tmp_path: Path, mock: MockThread) -> None:
    rows = [{"id": f"ok{i}", "prompt": f"q{i}"} for i in range(40)]
    rows.insert(7, {"id": "hung", "prompt": "p", "mock": {"hang": True, "times": 1}})  # its first attempt only
    tasks = lines(tmp_path / "t.jsonl", rows)
    t0 = time.monotonic()
    r = run_cli("run", "-w", "2", "-c", "8", "--model", "mock-model", "--base-url", mock.url, "--stall-after", "2",
                str(tasks), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "t.run"
    recs = {x["custom_id"]: x for x in assert_exactly_once(run_dir, {str(o["id"]) for o in rows})}
    hung = recs["hung"]
    assert hung["error"] is None and hung["metrics"]["attempts"] >= 2, hung  # the stall used an attempt
    assert all(recs[f"ok{i}"]["error"] is None for i in range(40))
    s = summary(run_dir)
    assert s["timeout_stall"] >= 1 and s["succeeded"] == 41 and s["failed"] == 0, s
    # one line says what was abandoned: the task's id, its endpoint, its age
    line = next((x for x in r.stderr.splitlines() if "stalled: no result" in x), None)
    assert line is not None and "'hung'" in line and mock.url in line and "timeout_stall" in line, r.stderr
    assert re.search(r"'hung' at \S+, \d+s, attempt 1", line), line
    stall_events = [e for e in map(orjson.loads, (run_dir / "events.jsonl").read_bytes().splitlines())
                    if e.get("event") == "stall"]
    assert stall_events and stall_events[0]["requests"][0]["id"] == "hung", stall_events
    assert mock.stats()["faults"].get("hang") == 1  # hung once, answered on the retry
    assert took < 60, f"took {took:.0f}s"  # a liveness bound: --read-timeout (120 s) never had to act


def test_a_request_that_always_hangs_uses_up_its_attempts_and_gets_its_record(tmp_path: Path,
                                                                             mock: MockThread) -> None:
    rows = [{"id": "ok0", "prompt": "q"}, {"id": "stuck", "prompt": "p", "mock": {"hang": True}}]
    tasks = lines(tmp_path / "t.jsonl", rows)
    r = run_cli("run", "-w", "1", "-c", "4", "--max-attempts", "2", "--model", "mock-model", "--base-url", mock.url,
                "--stall-after", "1", str(tasks), timeout=120)
    assert r.returncode == 0, r.stderr
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "t.run", {"ok0", "stuck"})}
    stuck = recs["stuck"]
    # bounded by --max-attempts: a stall is an attempt used, never a loop
    assert stuck["error"]["code"] == "timeout_stall" and stuck["metrics"]["attempts"] == 2, stuck
    assert summary(tmp_path / "t.run")["timeout_stall"] == 2


def test_status_lists_the_oldest_requests_on_the_wire(tmp_path: Path, mock: MockThread,
                                                      start: Callable[..., Run]) -> None:
    rows = [{"id": f"ok{i}", "prompt": f"q{i}"} for i in range(10)]
    rows += [{"id": f"hung{i}", "prompt": f"p{i}", "mock": {"hang": True}} for i in range(3)]
    tasks = lines(tmp_path / "t.jsonl", rows)
    run_dir = tmp_path / "t.run"
    proc = start("run", "-w", "1", "-c", "8", "--model", "mock-model", "--base-url", mock.url, "--stall-after", "0",
                 "--monitor-interval", "0.2", "--quiet", str(tasks))
    try:
        def listed() -> bool:
            if not (run_dir / "checkpoint.json").exists():
                return False
            s = status_json(run_dir)
            return len([o for o in s.get("oldest") or () if str(o.get("id")).startswith("hung")]) == 3
        wait_until(listed, "status to list the three hung requests", 60, proc)
        time.sleep(1.5)  # they age
        s = status_json(run_dir)
        assert s["state"] == "running", s
        oldest = s["oldest"]
        assert {o["id"] for o in oldest} == {"hung0", "hung1", "hung2"}, oldest  # the others are done
        for o in oldest:
            assert o["endpoint"] == mock.url and o["attempt"] == 1 and o["bytes"] == 0 and o["age_s"] >= 1, o
        assert [o["age_s"] for o in oldest] == sorted((o["age_s"] for o in oldest), reverse=True)  # oldest first
        text = run_cli("status", str(run_dir)).stdout
        assert re.search(r"oldest\s+'hung\d' at \S+: \d+s on the wire, attempt 1, 0 bytes received", text), text
        assert text.count("on the wire, attempt") == 3, text
        assert proc.running()  # --stall-after 0: nothing abandoned them
    finally:
        proc.interrupt()
