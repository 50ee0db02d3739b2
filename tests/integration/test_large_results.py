"""Large results (through the workers' shared-memory rings, or read from a pipe straight into one buffer each;
written by the journal's thread): exactly once, whole lines, also when workers are killed in the middle of
sending them."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import FAULTS_PLUGIN, assert_exactly_once, run_cli, summary, write_tasks


@pytest.mark.parametrize("ring_mb", ["16", "0"])
def test_large_results_are_written_whole(tmp_path: Path, mock: MockThread, ring_mb: str) -> None:
    # mixed sizes, so that large lines (in the workers' shared-memory rings, or with EVALSUP_RING_MB=0 read from
    # the pipe into buffers of their own) and runs of small ones (many to a read) follow each other
    n = 240
    tasks = tmp_path / "t.jsonl"
    with open(tasks, "wb") as f:
        for i in range(n):
            kb = 700 if i % 3 == 0 else (90 if i % 3 == 1 else 0)
            f.write(orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
                                  "mock": {"kb": kb}}) + b"\n")
    r = run_cli("run", "-w", "2", "-c", "16", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                env={"EVALSUP_RING_MB": ring_mb})
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(n)})
    via_ring = summary(tmp_path / "t.run")["results_via_ring"]
    assert via_ring == 0 if ring_mb == "0" else 0 < via_ring <= n // 3, via_ring  # only the lines past 256 KiB
    for rec in recs:
        body = rec["response"]["body"]
        i = int(rec["custom_id"][1:])
        size = len(orjson.dumps(body))
        assert body["choices"][0]["message"]["content"]
        assert size > 600_000 if i % 3 == 0 else (60_000 < size < 200_000 if i % 3 == 1 else size < 10_000), (i, size)
    # the records are the endpoint's own bytes: the same request in a second run gives the same bodies
    r = run_cli("run", "-w", "1", "-c", "4", "--model", "mock-model", "--base-url", mock.url, "--out",
                str(tmp_path / "again"), str(tasks))
    assert r.returncode == 0, r.stderr
    again = {x["custom_id"]: x["response"]["body"] for x in assert_exactly_once(tmp_path / "again",
                                                                                {f"t{i}" for i in range(n)})}
    assert all(again[x["custom_id"]]["choices"] == x["response"]["body"]["choices"] for x in recs)


def test_results_waiting_for_the_disk_hold_reading_and_nothing_is_lost(tmp_path: Path, mock: MockThread) -> None:
    # a 0.1 MiB backlog: nearly every 300 KB result holds the reading of every pipe until the journal's writer
    # has caught up; the run must neither stall nor lose or repeat a line
    n = 150
    tasks = write_tasks(tmp_path / "t.jsonl", n, extra={"mock": {"kb": 300}})
    r = run_cli("run", "-w", "3", "-c", "24", "--model", "mock-model", "--base-url", mock.url, str(tasks),
                env={"EVALSUP_BACKLOG_MB": "0.1"})
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(n)})
    assert all(len(orjson.dumps(x["response"]["body"])) > 250_000 for x in recs)
    events = [orjson.loads(line) for line in (tmp_path / "t.run" / "events.jsonl").read_bytes().splitlines()]
    assert any(e.get("event") == "disk_behind" for e in events), "reading was never held"


def test_a_worker_naming_a_ring_place_it_never_wrote_is_replaced_and_its_task_redone(tmp_path: Path,
                                                                                      mock: MockThread) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    n = 40
    tasks = tmp_path / "t.jsonl"
    with open(tasks, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
                                  "mock": {"kb": 400}, **({"bad_ring": True} if i == 5 else {})}) + b"\n")
    plugin = FAULTS_PLUGIN
    r = run_cli("run", "-w", "2", "-c", "8", "--model", "mock-model", "--base-url", mock.url,
                "--worker-plugin", f"{plugin}:bad_ring_reference", str(tasks), env={"EVALSUP_TEST_MARKS": str(marks)})
    assert r.returncode == 0, r.stderr
    assert "bad ring reference" in r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(n)})
    assert all(x["error"] is None for x in recs)
    s = summary(tmp_path / "t.run")
    assert s["worker_restarts"] >= 1 and s["results_via_ring"] > 0
