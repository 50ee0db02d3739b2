"""`evalsup estimate --cache DIR` and a run's start line counted a damaged cache entry as a hit: they looked up
keys only, while the run checks each entry as it checks an online answer (cache.keep.why_unfit) and sends again
one that fails. With 3 of 20 entries damaged the estimate said 20 free requests and the start line "(20 from the
cache)", and the run then sent 3. Now both apply the run's check: 17 hits, 3 requests counted (and priced), the
damaged entries counted apart; the run then sends exactly those 3."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from evalsup.mock.server import MockThread
from tests.harness import chat_requests, run_args, run_cli, summary, write_tasks

N = 20
BAD = 3


def test_estimate_and_start_line_count_damaged_entries_as_misses(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", N, extra={"max_tokens": 50})
    cache = tmp_path / "cache"
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache), "--out", str(tmp_path / "r1")))
    assert r.returncode == 0, r.stderr
    with sqlite3.connect(cache / "cache.sqlite") as c:
        keys = [bytes(k) for (k,) in c.execute("SELECT key FROM entries ORDER BY key")]
        assert len(keys) == N
        # three ways an entry stops being an answer: bytes changed (not JSON), an error status, an error body
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (b'{"choices": [\x01\x01\x01', keys[0]))
        c.execute("UPDATE entries SET status = 500 WHERE key = ?", (keys[1],))
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (b'{"error": {"message": "overloaded"}}', keys[2]))

    est = run_cli("estimate", str(tasks), "--model", "mock-model", "--self-hosted", "--cache", str(cache),
                  "--out", str(tmp_path / "r2"), "--json")
    assert est.returncode == 0, est.stderr
    e = orjson.loads(est.stdout)
    assert (e["cache"]["hits"], e["requests"], e["total_requests"]) == (N - BAD, BAD, N), e
    assert e["cache"]["unusable"] == BAD, e["cache"]
    text = run_cli("estimate", str(tasks), "--model", "mock-model", "--self-hosted", "--cache", str(cache),
                   "--out", str(tmp_path / "r2"))
    assert text.returncode == 0, text.stderr
    assert f"{N - BAD:,} of {N:,} requests would be answered from it" in text.stdout, text.stdout
    assert f"{BAD} kept answers unusable" in text.stdout, text.stdout

    mock.reset_stats()
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache), "--out", str(tmp_path / "r2")))
    assert r.returncode == 0, r.stderr
    assert f"{N} tasks ({N - BAD} from the cache)" in r.stderr, r.stderr  # the start line
    assert chat_requests(mock) == BAD  # what the estimate counted is what was sent
    assert summary(tmp_path / "r2")["cache"]["hits"] == N - BAD
