"""A kept answer becomes a record only after the checks an online answer passes (issue 39 item 1), with real
processes against the mock on 127.0.0.1: entries damaged in the SQLite file, or imported with a status 500, a
``null``, a ``length`` cut or an error body, are misses (sent again, counted, said once), never a line in
results.jsonl; an export whose bodies were pretty-printed imports as one line a task."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson

from evalsup.mock.server import MockThread
from tests.harness import assert_exactly_once, chat_requests, ids_of, run_args, run_cli, summary, write_tasks

N = 20


def cached_run(mock: MockThread, tasks: Path, cache: Path, out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache), "--out", str(out), *extra))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return summary(out), r.stderr


def valid_lines(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of results.jsonl parsed (a line that is not JSON fails the test), exactly once per task."""
    raw = (run_dir / "results.jsonl").read_bytes().splitlines()
    recs = [orjson.loads(x) for x in raw]
    assert len(recs) == N
    assert_exactly_once(run_dir, ids_of(N))
    return recs


def bodies_by_key(cache: Path) -> list[tuple[bytes, bytes]]:
    with sqlite3.connect(cache / "cache.sqlite") as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the main file, as after a finished run
        return [(bytes(k), bytes(b)) for k, b in c.execute("SELECT key, body FROM entries ORDER BY key")]


def test_damaged_or_unfit_entries_are_misses_sent_again(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", N, extra={"expected": "zzz"})
    cache = tmp_path / "cache"
    cached_run(mock, tasks, cache, tmp_path / "r1")
    kept = bodies_by_key(cache)
    assert len(kept) == N
    # 30 bytes of three bodies changed in place in the file (the SQLite file itself stays valid)
    db = cache / "cache.sqlite"
    data = bytearray(db.read_bytes())
    for _key, body in kept[:3]:
        at = data.index(body) + 10
        data[at:at + 30] = b"\x01" * 30
    db.write_bytes(bytes(data))
    # and entries that parse but are no answer: an error status, null, [], an error body, a cut answer
    cut = orjson.loads(kept[7][1])
    cut["choices"][0]["finish_reason"] = "length"
    with sqlite3.connect(db) as c:
        c.execute("UPDATE entries SET status = 500 WHERE key = ?", (kept[3][0],))
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (b"null", kept[4][0]))
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (b"[]", kept[5][0]))
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (b'{"error": {"message": "overloaded"}}', kept[6][0]))
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (orjson.dumps(cut), kept[7][0]))
        c.execute("UPDATE entries SET body = CAST(? AS TEXT) WHERE key = ?", (b'{"a":1}', kept[8][0]))  # a text value
    bad = 9

    mock.reset_stats()
    s, err = cached_run(mock, tasks, cache, tmp_path / "r2", "--scorer", "exact_match")  # a scorer reads each body
    recs = valid_lines(tmp_path / "r2")
    assert sum(r["metrics"].get("cache") == "hit" for r in recs) == N - bad
    assert chat_requests(mock) == bad  # each unfit entry asked again, as a miss
    assert all(r["error"] is None and r["scores"] == {"exact_match": 0.0} for r in recs) and s["succeeded"] == N
    assert s["cache"]["hits"] == N - bad and s["cache"]["misses"] == bad and s["cache"]["unusable"] == bad
    said = [x for x in err.splitlines() if "cache" in x and "unusable" in x]
    assert len(said) == 1, err  # said once for the run, not once an entry

    # their fresh answers replaced them: the next run is answered wholly from the cache
    mock.reset_stats()
    s, _ = cached_run(mock, tasks, cache, tmp_path / "r3")
    valid_lines(tmp_path / "r3")
    assert chat_requests(mock) == 0 and s["cache"]["hits"] == N and s["cache"].get("unusable", 0) == 0


def test_a_length_cut_entry_is_a_hit_with_cache_length(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", N)
    cache = tmp_path / "cache"
    cached_run(mock, tasks, cache, tmp_path / "r1")
    key, body = bodies_by_key(cache)[0]
    cut = orjson.loads(body)
    cut["choices"][0]["finish_reason"] = "length"
    with sqlite3.connect(cache / "cache.sqlite") as c:
        c.execute("UPDATE entries SET body = ? WHERE key = ?", (orjson.dumps(cut), key))
    mock.reset_stats()
    s, _ = cached_run(mock, tasks, cache, tmp_path / "r2", "--cache-length")
    valid_lines(tmp_path / "r2")
    assert chat_requests(mock) == 0 and s["cache"]["hits"] == N


def test_a_pretty_printed_export_imports_as_one_line_a_task(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", N)
    cache = tmp_path / "cache"
    cached_run(mock, tasks, cache, tmp_path / "r1")
    export = tmp_path / "c.jsonl"
    assert run_cli("cache", "export", str(cache), "-o", str(export)).returncode == 0
    pretty = []
    for line in export.read_bytes().splitlines():
        e = orjson.loads(line)
        e["body"] = orjson.dumps(orjson.loads(e["body"]), option=orjson.OPT_INDENT_2).decode()
        assert "\n" in e["body"]
        pretty.append(orjson.dumps(e) + b"\n")
    export.write_bytes(b"".join(pretty))
    r = run_cli("cache", "import", str(tmp_path / "c2"), str(export))
    assert r.returncode == 0, r.stderr
    mock.reset_stats()
    s, _ = cached_run(mock, tasks, tmp_path / "c2", tmp_path / "r2")
    recs = valid_lines(tmp_path / "r2")  # 20 lines for 20 tasks, each valid JSON
    assert chat_requests(mock) == 0 and s["cache"]["hits"] == N
    first = {r["custom_id"]: r["response"]["body"] for r in valid_lines(tmp_path / "r1")}
    assert {r["custom_id"]: r["response"]["body"] for r in recs} == first  # the same answers
