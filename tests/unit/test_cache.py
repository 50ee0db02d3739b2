"""The answer cache's parts without a process (issue 30 item 3): the canonical key, which answers are kept, the
network file system refusal, the SQLite store (budget, pruning, export), and the supervisor's feed writing only
what a checkpoint covers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.cache.feed import CacheFeed
from evalsup.cache.keep import why_not
from evalsup.cache.key import KeyMaker, sampled
from evalsup.cache.mounts import fs_type, network_problem
from evalsup.cache.store import ROW_BYTES, CacheError, Entry, Store, entry_from_json, entry_json

CHAT = "/v1/chat/completions"
K = KeyMaker()


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, **kw}


def test_key_ignores_key_order_and_number_format() -> None:
    a = {"model": "m", "temperature": 0.0, "max_tokens": 16, "messages": [{"content": "hi", "role": "user"}]}
    b = orjson.loads(b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":16.0,"temperature":0,"model":"m"}')
    assert K.key(CHAT, a, "t1") == K.key(CHAT, b, "t2")  # greedy: the task's id is not in the key
    assert K.key(CHAT, body(top_p=0.5), "t") == K.key(CHAT, body(top_p=0.50), "t")
    assert K.key(CHAT, body(top_p=0.5), "t") != K.key(CHAT, body(top_p=0.51), "t")


def test_key_leaves_out_stream_and_user_but_not_the_model_or_path() -> None:
    base = K.key(CHAT, body(), "t")
    assert K.key(CHAT, body(stream=True, stream_options={"include_usage": True}, user="u1"), "t") == base
    assert K.key(CHAT, body(model="other"), "t") != base
    assert K.key("/v1/completions", body(), "t") != base
    assert K.key(CHAT, body(max_tokens=5), "t") != base
    assert K.key(CHAT, body(seed=1), "t") != base


def test_sampled_requests_carry_the_task_and_greedy_ones_do_not() -> None:
    assert not sampled(CHAT, body())
    assert sampled(CHAT, body(temperature=0.7))
    assert sampled(CHAT, {"model": "m", "messages": []})  # no temperature: the server's default, 1
    assert sampled(CHAT, body(n=3))
    assert not sampled("/v1/embeddings", {"model": "e", "input": "x"})
    hot = body(temperature=0.7)
    assert K.key(CHAT, hot, "t1") != K.key(CHAT, hot, "t2")  # three repetitions: three samples
    assert K.key(CHAT, hot, "t1") == K.key(CHAT, dict(hot), "t1")  # a rerun: the same sample back
    assert K.key(CHAT, body(), "t1") == K.key(CHAT, body(), "t2")


def test_salt_and_model_identity() -> None:
    b = body()
    assert KeyMaker(salt="s1").key(CHAT, b, "t") != K.key(CHAT, b, "t")
    assert KeyMaker(salt="s1").key(CHAT, b, "t") == KeyMaker(salt="s1").key(CHAT, b, "t")
    named = KeyMaker(model_id="llama-3-8b")  # replicas under other names share entries
    assert named.key(CHAT, body(model="a"), "t") == named.key(CHAT, body(model="b"), "t")
    # a body without a model (an Azure deployment): its endpoints name it; a replica's host does not matter
    # when the body names the model
    nomodel = {"messages": [], "temperature": 0}
    assert KeyMaker(endpoints=("http://a/v1",)).key(CHAT, nomodel, "t") != \
        KeyMaker(endpoints=("http://b/v1",)).key(CHAT, nomodel, "t")
    assert KeyMaker(endpoints=("http://a/v1",)).key(CHAT, b, "t") == KeyMaker(endpoints=("http://b/v1",)).key(
        CHAT, b, "t")
    assert KeyMaker(endpoints=("http://u:secret@a/v1",)).canonical(CHAT, nomodel, "t").find(b"secret") == -1


def test_only_whole_answers_are_kept() -> None:
    def chat(reason: str) -> dict[str, Any]:
        return {"choices": [{"message": {"content": "x"}, "finish_reason": reason}], "usage": {}}

    assert why_not(chat("stop"), None) is None
    assert why_not(chat("length"), None) == "length"
    assert why_not(chat("length"), None, keep_length=True) is None
    assert why_not(chat("content_filter"), None, keep_length=True) == "content_filter"
    assert why_not({"output": [], "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
                   None) is not None
    # a large body checked but not built: its bytes are searched (a quote inside a string is escaped)
    raw = orjson.dumps(chat("length"))
    assert why_not({"usage": {}}, raw) == "length"
    said = orjson.dumps({"choices": [{"message": {"content": '"finish_reason":"length"'}, "finish_reason": "stop"}]})
    assert why_not({"usage": {}}, said) is None


MOUNTS = """proc /proc proc rw 0 0
/dev/sda1 / ext4 rw 0 0
server:/export /mnt/shared nfs4 rw 0 0
//nas/x /mnt/my\\040nas cifs rw 0 0
me@host:/ /home/me/remote fuse.sshfs rw 0 0
"""


def test_network_file_systems_are_told(tmp_path: Path) -> None:
    assert fs_type(Path("/mnt/shared/cache/new"), MOUNTS) == "nfs4"
    assert fs_type(Path("/mnt/my nas/c"), MOUNTS) == "cifs"
    assert fs_type(Path("/mnt/sharedx"), MOUNTS) == "ext4"
    assert network_problem(Path("/home/me/remote/c"), MOUNTS) is not None
    assert network_problem(Path("/var/cache/evalsup"), MOUNTS) is None
    with pytest.raises(CacheError, match="network file system"):
        Store(Path("/mnt/shared/cache"), mounts=MOUNTS)


def entry(i: int, size: int = 100) -> Entry:
    return Entry(bytes([i]) * 32, orjson.dumps({"n": i, "pad": "x" * size}), 200, f"req-{i}", "m", CHAT, 3, 5)


def test_store_round_trip_budget_and_lru(tmp_path: Path) -> None:
    s = Store(tmp_path / "c")
    assert s.conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    s.put([entry(i) for i in range(10)], now=1000.0)
    got = s.get(entry(3).key)
    assert got is not None and got.body == entry(3).body and got.request_id == "req-3"
    assert s.bytes_used() == sum(len(entry(i).body) + ROW_BYTES for i in range(10))
    s.put([entry(3, 500)], now=1001.0)  # replaced (refresh): the budget follows
    assert s.bytes_used() == sum(len(entry(i, 500 if i == 3 else 100).body) + ROW_BYTES for i in range(10))
    s.put([], touched=[entry(0).key], now=2000.0)  # a hit: 0 is now the most recent
    one = len(entry(1).body) + ROW_BYTES
    s.prune(4 * one, to=1.0)
    left = {e.key[0] for e in s.entries()}
    assert 0 in left and 1 not in left and len(left) <= 4
    assert s.bytes_used() <= 4 * one
    reader = Store(tmp_path / "c", readonly=True)
    assert reader.get(entry(0).key) is not None
    with pytest.raises(Exception):  # noqa: B017 - query_only: a reader never writes
        reader.put([entry(20)])


def test_export_lines_keep_the_bodies_exactly(tmp_path: Path) -> None:
    e = Entry(b"k" * 32, b'{"a":1.50,"s":"\\u00e9"}', 200, None, "m", CHAT, 1, 2, 5.0, 6.0)
    assert orjson.loads(entry_json(e))["body"].encode() == e.body  # the export: the exact text
    back = entry_from_json(entry_json(e))  # an import stores it as compact JSON (issue 39)
    assert back.body == '{"a":1.5,"s":"é"}'.encode() and orjson.loads(back.body) == orjson.loads(e.body)
    back.body = e.body
    assert back == e
    with pytest.raises(ValueError):
        entry_from_json(b'{"key": "00", "body": "{}"}')


def test_a_damaged_file_is_refused_in_one_line(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    (d / "cache.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match="cannot be read"):
        Store(d)


def test_the_feed_keeps_only_what_a_checkpoint_covers(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    bodies = [orjson.dumps({"answer": i}) for i in range(3)]
    lines = [b'{"head":' + b + b"}\n" for b in bodies]
    results.write_bytes(b"".join(lines))
    store = Store(tmp_path / "c")
    feed = CacheFeed(store, results, "rw", None, lambda msg, level="info": None)
    pos = 0
    for i, line in enumerate(lines):
        feed.note(pos, len(line), [(bytes([i]) * 32).hex(), 8, len(bodies[i]), None, "m", CHAT], 1, 2)
        pos += len(line)
    feed.committed(len(lines[0]) + len(lines[1]))  # the third line is not durable yet
    deadline = time.monotonic() + 10
    while feed.written < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert feed.written == 2
    assert store.get(bytes([2]) * 32) is None
    feed.close()
    reader = Store(tmp_path / "c", readonly=True)
    got = reader.get(bytes([1]) * 32)
    assert got is not None and got.body == bodies[1]


def test_a_read_only_feed_keeps_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    results.write_bytes(b'{"b":{}}\n')
    store = Store(tmp_path / "c")
    feed = CacheFeed(store, results, "ro", None, lambda msg, level="info": None)
    feed.note(0, 9, [(b"k" * 32).hex(), 5, 2, None, "m", CHAT], 1, 1)
    feed.touch((b"k" * 32).hex())
    feed.committed(9)
    feed.close()
    assert not feed.pending and feed.written == 0
    assert Store(tmp_path / "c", readonly=True).get(b"k" * 32) is None


def test_cache_settings_without_a_cache_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsup.config.run_config import ConfigError, build_config

    monkeypatch.delenv("EVALSUP_CACHE", raising=False)
    base = {"base_url": "http://127.0.0.1:9/v1"}
    with pytest.raises(ConfigError, match="--cache-salt without a cache"):
        build_config(tmp_path / "t.jsonl", {**base, "cache_salt": "x"})
    assert build_config(tmp_path / "t.jsonl", base).worker.cache_dir is None
    monkeypatch.setenv("EVALSUP_CACHE", str(tmp_path / "c"))
    cfg = build_config(tmp_path / "t.jsonl", {**base, "cache_max_gb": 0.5})
    assert cfg.worker.cache_dir == str(tmp_path / "c") and cfg.cache_max_bytes == 1 << 29
    assert build_config(tmp_path / "t.jsonl", {**base, "cache": "off"}).worker.cache_dir is None


@pytest.mark.parametrize("size", [10, 40_000])
def test_a_kept_answer_says_where_its_body_is_in_the_line(size: int) -> None:
    from evalsup.worker.client import Outcome
    from evalsup.worker.records import CacheNote, Extras, build

    raw = orjson.dumps({"choices": [{"message": {"content": "x" * size}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    oc = Outcome(200, orjson.Fragment(raw), len(raw), "req-1", None, 1, 0.5, parsed=orjson.loads(raw),
                 raw_json=raw)
    parts, info = build("t1", oc, 7, 0.0, 1, {"index": 0, "url": "u"}, {},
                        extras=Extras(cache=CacheNote("ab" * 32, False, ["req-1", "m", CHAT])))
    line = b"".join(parts)
    key, off, n, rid, model, path = info["ck"]
    assert line[off:off + n] == raw and (key, rid, model, path) == ("ab" * 32, "req-1", "m", CHAT)
    assert orjson.loads(line)["response"]["body"] == orjson.loads(raw) and info["ca"] == "m"
    # the hit: the same body bytes, no request
    hit = Outcome(200, orjson.Fragment(raw), len(raw), "req-1", None, 0, 0.0, parsed={"usage": {}}, raw_json=raw)
    parts, info = build("t1", hit, 8, 0.0, 1, None, {}, extras=Extras(cache=CacheNote("ab" * 32, True, model="m")))
    rec = orjson.loads(b"".join(parts))
    assert raw in b"".join(parts) and rec["metrics"]["cache"] == "hit" and rec["metrics"]["latency_s"] is None
    assert (info["ca"], info["ch"], info["cm"], info["rt"]) == ("h", "ab" * 32, "m", 0)


def test_a_run_refuses_a_network_cache_and_goes_on_without_a_damaged_one(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsup.config.run_config import build_config
    from evalsup.supervisor import run as run_module

    said: list[tuple[str, str]] = []
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": "http://127.0.0.1:9/v1", "cache": str(tmp_path / "c")})
    monkeypatch.setattr(run_module, "network_problem", lambda p: network_problem(p, MOUNTS.replace(
        "/mnt/shared", str(tmp_path))))
    _, refused = run_module._open_cache(cfg, lambda m, level="info": said.append((level, m)))
    assert isinstance(refused, str) and "network file system (nfs4)" in refused
    monkeypatch.undo()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "cache.sqlite").write_bytes(b"garbage" * 1000)
    new, feed = run_module._open_cache(cfg, lambda m, level="info": said.append((level, m)))
    assert feed is None and new.worker.cache_dir is None
    assert [lvl for lvl, _ in said] == ["warning"]
