"""`evalsup cache export` of a cache whose entries were damaged in the SQLite file itself: a body (or a text
column) rewritten as TEXT holding bytes that are not UTF-8 raised from the database driver, a traceback, and
nothing after it was exported. Now each such entry is left out and counted, the first one's key named, as
export leaves out an entry no run would serve, and the rest are exported (exit 0); a run counts the same
entries unusable and sends them again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from evalsup.mock.server import MockThread
from tests.harness import chat_requests, run_args, run_cli, summary, write_tasks

N = 20


def test_export_leaves_out_entries_whose_text_is_not_utf8_and_names_the_first(tmp_path: Path,
                                                                               mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", N)
    cache = tmp_path / "cache"
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache), "--out", str(tmp_path / "r1")))
    assert r.returncode == 0, r.stderr
    db = cache / "cache.sqlite"
    with sqlite3.connect(db) as c:
        keys = [bytes(k) for (k,) in c.execute("SELECT key FROM entries ORDER BY atime, rowid")]
        assert len(keys) == N
        # the export's order is the oldest use first: make the damaged ones the first three it meets
        for i, k in enumerate(keys):
            c.execute("UPDATE entries SET atime = ? WHERE key = ?", (1000.0 + i, k))
        c.execute("UPDATE entries SET body = CAST(? AS TEXT) WHERE key = ?", (b'{"id":"\xff\xfe"}', keys[0]))
        c.execute("UPDATE entries SET body = CAST(? AS TEXT) WHERE key = ?", (b"\xc3(", keys[1]))
        c.execute("UPDATE entries SET model = CAST(? AS TEXT) WHERE key = ?", (b"mock-\xff", keys[2]))

    out = tmp_path / "c.jsonl"
    r = run_cli("cache", "export", str(cache), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    said = r.stderr.strip().splitlines()
    assert len(said) == 1, r.stderr
    assert said[0].startswith(f"evalsup: {N - 3:,} entries exported; 3 left out: "), said
    assert f"(first: key {keys[0].hex()[:12]})" in said[0], said
    assert f"key {keys[2].hex()[:12]}" in said[0], said  # the damaged model: a reason of its own
    exported = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert sorted(e["key"] for e in exported) == sorted(k.hex() for k in keys[3:])

    # the export imports into a new cache whole: what was left out never travels
    r = run_cli("cache", "import", str(tmp_path / "c2"), str(out))
    assert r.returncode == 0, r.stderr
    assert f"{N - 3:,} entries added" in r.stdout, r.stdout

    # the same export to stdout: the lines on stdout, the count on stderr
    r = run_cli("cache", "export", str(cache))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stdout.splitlines()) == N - 3
    r = run_cli("cache", "stats", str(cache), "--json")
    assert r.returncode == 0 and orjson.loads(r.stdout)["entries"] == N, r.stderr

    # a run agrees: the three are unusable, sent again (they were a silent miss, a read said to be busy)
    mock.reset_stats()
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--cache", str(cache), "--out", str(tmp_path / "r2")))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert chat_requests(mock) == 3
    c = summary(tmp_path / "r2")["cache"]
    assert (c["hits"], c["unusable"]) == (N - 3, 3), c
