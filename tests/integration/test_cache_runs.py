"""The answer cache across runs (issue 30 item 3), with real processes against the mock on 127.0.0.1: a second
run sends nothing and writes the same bodies byte for byte, two runs share one cache at once, a kill -9 leaves
a readable cache, sampled tasks keep a sample each, a damaged cache file is one warning, a --header that may
route elsewhere keys its own answers."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from evalsup.mock.server import MockThread
from tests.harness import (
    Run,
    chat_requests,
    complete_lines,
    lines,
    quiesce,
    run_args,
    run_cli,
    summary,
    wait_until,
    write_tasks,
)


def bodies(run_dir: Path) -> dict[str, bytes]:
    """Each task's response body as the bytes results.jsonl holds (not parsed and dumped again)."""
    out = {}
    for line in (run_dir / "results.jsonl").read_bytes().splitlines():
        rec = orjson.loads(line)
        start = line.index(b'"body":') + len(b'"body":')
        out[rec["custom_id"]] = line[start:line.rindex(b'},"error":')]
    return out


def entries(cache: Path) -> int:
    """Answers kept in the cache, as `evalsup cache stats` says."""
    r = run_cli("cache", "stats", str(cache), "--json")
    assert r.returncode == 0, r.stderr
    return int(orjson.loads(r.stdout)["entries"])


def kept(cache: Path) -> int:
    """Answers kept, read directly (a reader beside the runs, as a worker is)."""
    try:
        with sqlite3.connect(cache / "cache.sqlite", timeout=5) as c:
            return int(c.execute("SELECT count(*) FROM entries").fetchall()[0][0])
    except sqlite3.Error:
        return 0


def cached_run(mock: MockThread, tasks: Path, cache: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache), "--out", str(out), *extra))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return summary(out)


def test_second_run_sends_nothing_and_writes_the_same_bodies(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 60)
    cache = tmp_path / "cache"
    s1 = cached_run(mock, tasks, cache, tmp_path / "r1")
    assert chat_requests(mock) == 60 and s1["cache"]["misses"] == 60 and s1["cache"]["written"] == 60
    mock.reset_stats()
    s2 = cached_run(mock, tasks, cache, tmp_path / "r2")
    assert chat_requests(mock) == 0  # every answer from the cache: no request at all
    assert s2["cache"]["hits"] == 60 and s2["succeeded"] == 60
    assert s2["cache"]["tokens_saved"]["completion"] == s1["tokens"]["completion"] > 0
    assert bodies(tmp_path / "r2") == bodies(tmp_path / "r1")
    recs = [orjson.loads(x) for x in (tmp_path / "r2" / "results.jsonl").read_bytes().splitlines()]
    assert {r["metrics"].get("cache") for r in recs} == {"hit"}
    # export and import carry every entry, bodies exact
    export = tmp_path / "c.jsonl"
    assert run_cli("cache", "export", str(cache), "-o", str(export)).returncode == 0
    r = run_cli("cache", "import", str(tmp_path / "copy"), str(export))
    assert r.returncode == 0, r.stderr
    again = tmp_path / "again.jsonl"
    assert run_cli("cache", "export", str(tmp_path / "copy"), "-o", str(again)).returncode == 0
    assert sorted(again.read_bytes().splitlines()) == sorted(export.read_bytes().splitlines())
    assert {orjson.loads(x)["body"].encode() for x in export.read_bytes().splitlines()} == \
        set(bodies(tmp_path / "r1").values())


def test_two_runs_share_one_cache_at_once(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    mock.configure(latency_ms=20, jitter_ms=5)
    cache = tmp_path / "cache"
    a = write_tasks(tmp_path / "a.jsonl", 300)
    b = write_tasks(tmp_path / "b.jsonl", 300, start=1000)
    runs = [start(*run_args(mock, t, "-w", "2", "-c", "16", "--cache", str(cache), "-q")) for t in (a, b)]
    for p in runs:
        assert p.finish() == 0, p.stderr
        assert "locked" not in p.stderr and "warning" not in p.stderr, p.stderr
    assert kept(cache) == 600  # every answer of both runs


def test_kill_9_while_keeping_leaves_a_readable_cache(tmp_path: Path, mock: MockThread,
                                                      start: Callable[..., Run]) -> None:
    n = 1000
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    cache = tmp_path / "cache"
    run_dir = tmp_path / "tasks.run"
    mock.configure(latency_ms=100, jitter_ms=20)
    p = start(*run_args(mock, tasks, "-w", "3", "-c", "16", "--cache", str(cache)))
    wait_until(lambda: kept(cache) > 0, "answers kept", proc=p)
    p.kill_group()  # somewhere between two batches of the cache, or inside one
    assert p.wait_workers_gone() == []
    assert complete_lines(run_dir / "results.jsonl") < n, "the run finished before it could be killed"
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    left = entries(cache)
    assert left > 0
    mock.reset_stats()
    s = cached_run(mock, tasks, cache, tmp_path / "other")  # another run over the same tasks
    assert s["cache"]["hits"] == left and chat_requests(mock) == n - left


def test_sampled_tasks_keep_a_sample_each(tmp_path: Path, mock: MockThread) -> None:
    def task(tid: str, content: str, temperature: float) -> dict[str, Any]:
        return {"custom_id": tid, "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "mock-model", "messages": [{"role": "user", "content": content}],
                         "temperature": temperature}}

    tasks = lines(tmp_path / "tasks.jsonl", [task(f"poem{i}", "write a poem", 0.8) for i in range(3)]
                  + [task(f"sum{i}", "2+2?", 0) for i in range(2)])
    cache = tmp_path / "cache"
    cached_run(mock, tasks, cache, tmp_path / "r1")
    assert chat_requests(mock) == 5
    # three repetitions of a sampled task: three entries; the two greedy ones share one
    assert kept(cache) == 4
    mock.reset_stats()
    cached_run(mock, tasks, cache, tmp_path / "r2")
    assert chat_requests(mock) == 0
    first, second = bodies(tmp_path / "r1"), bodies(tmp_path / "r2")
    poems = [f"poem{i}" for i in range(3)]
    assert [second[t] for t in poems] == [first[t] for t in poems]  # each repetition its own sample back
    assert len({first[t] for t in poems}) == 3  # three samples (the mock's ids differ)
    assert second["sum0"] == second["sum1"] in (first["sum0"], first["sum1"])  # one greedy answer for both
    s = cached_run(mock, tasks, cache, tmp_path / "r3", "--cache-salt", "fresh")  # new samples asked for
    assert chat_requests(mock) == 5 and s["cache"]["hits"] == 0


def test_a_damaged_cache_file_is_one_warning(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 20)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cache.sqlite").write_bytes(b"not a database at all\n" * 500)
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache)))
    assert r.returncode == 0, r.stderr
    said = [x for x in r.stderr.splitlines() if "cache" in x and "warning" in x]
    assert len(said) == 1, r.stderr
    assert "Traceback" not in r.stderr and chat_requests(mock) == 20
    assert "cache" not in summary(tmp_path / "tasks.run")


def test_a_routing_header_keeps_answers_of_its_own(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 10)
    cache = tmp_path / "cache"
    routed = ("--header", "X-Route-To: other-provider", "--header", "X-Api-Key: env:ROUTE_KEY")
    r = run_cli(*run_args(mock, tasks, "-w", "1", "--cache", str(cache), "--out", str(tmp_path / "r1"), *routed),
                env={"ROUTE_KEY": "sekrit-route-key"})
    assert r.returncode == 0, r.stderr
    mock.reset_stats()
    s = cached_run(mock, tasks, cache, tmp_path / "r2")  # the plain endpoint: not the routed one's answers
    assert chat_requests(mock) == 10 and s["cache"]["hits"] == 0
    mock.reset_stats()  # the same header again (its secret changed: the key does not hold it) is answered
    r = run_cli(*run_args(mock, tasks, "-w", "1", "--cache", str(cache), "--out", str(tmp_path / "r3"), *routed),
                env={"ROUTE_KEY": "another-key"})
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == 0 and summary(tmp_path / "r3")["cache"]["hits"] == 10
    assert b"sekrit-route-key" not in (cache / "cache.sqlite").read_bytes()
