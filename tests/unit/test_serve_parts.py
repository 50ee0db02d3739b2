"""`evalsup serve`'s parts without a process or a socket: the OpenAI shapes against the SDK's types, list pages,
which queued batch starts next, the validation's errors by line, the output/error split, the keys file, and what
a crash leaves in the data directory cleaned at start."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from openai.types import Batch, FileObject
from openai.types.batch_usage import BatchUsage

from evalsup.serve import shapes
from evalsup.serve.auth import KeysError, owner_of, read_keys
from evalsup.serve.check import check_input
from evalsup.serve.fair import Queued, next_batch
from evalsup.serve.results import split
from evalsup.serve.store import BatchRec, Store


def line(cid: str, url: str = "/v1/chat/completions", **body: Any) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": url,
                         "body": {"model": "m", "messages": [{"role": "user", "content": "q"}], **body}}) + b"\n"


def test_objects_have_the_sdk_shape() -> None:
    f = shapes.file_object(shapes.new_file_id(), size=3, created_at=1, filename="a.jsonl", purpose="batch",
                           expires_at=9)
    assert FileObject.model_validate(f).status == "processed"
    b = shapes.batch_object(shapes.new_batch_id(), input_file_id=f["id"], endpoint="/v1/chat/completions",
                            completion_window="24h", created_at=1, expires_at=86401, metadata=None)
    moved = shapes.moved(shapes.moved(b, shapes.IN_PROGRESS, 5), shapes.IN_PROGRESS, 7)
    assert Batch.model_validate(moved).in_progress_at == 5  # a state's time is set once
    assert shapes.FILE_ID.match(f["id"]) and shapes.BATCH_ID.match(b["id"]) and not shapes.FILE_ID.match("../x")


def test_list_pages_walk_every_item_once() -> None:
    items = [{"id": f"b{i}"} for i in range(5)]
    seen, after = [], None
    while True:
        page = shapes.list_page(items, after, 2)
        assert page is not None
        seen += [x["id"] for x in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == [x["id"] for x in items]
    assert shapes.list_page(items, "nope", 2) is None
    assert shapes.window_seconds("24h") == 86400 and shapes.window_seconds("soon") is None


def test_keys_take_turns() -> None:
    q = [Queued("a1", "A", 1), Queued("a2", "A", 2), Queued("b1", "B", 3)]
    assert next_batch(q, {}) == "a1"
    assert next_batch(q[1:], {"A": 10}) == "b1"  # B never served: before A's second
    assert next_batch(q[1:], {"A": 10, "B": 11}) == "a2"
    assert next_batch([], {}) is None


def test_validation_names_each_bad_line(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    p.write_bytes(line("a") + b"{oops\n" + line("a") + line("b", "/v1/embeddings") + line("c", "/v1/x")
                  + line("d", stream=True) + b"\n" + orjson.dumps({"id": "e", "prompt": "x"}) + b"\n"
                  + line("f").replace(b'"f"', b"7"))
    got = check_input(p, "/v1/chat/completions")
    assert [(e["line"], e["code"]) for e in got.errors] == [
        (2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_endpoint"), (5, "invalid_url"),
        (6, "invalid_request"), (8, "missing_required_parameter"), (9, "invalid_request")]
    ok = tmp_path / "ok.jsonl"
    ok.write_bytes(line("a") + line("b"))
    assert check_input(ok, "/v1/chat/completions").errors == [] and check_input(ok, "/v1/chat/completions").total == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n")
    assert [e["code"] for e in check_input(empty, "/v1/chat/completions").errors] == ["empty_file"]


def record(cid: str, status: int | None, error: dict[str, Any] | None = None) -> bytes:
    resp = None if status is None else {"status_code": status, "request_id": "r", "body": {
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1}}}}
    return orjson.dumps({"id": f"batch_req_{cid}", "custom_id": cid, "response": resp, "error": error,
                         "metrics": {"latency_s": 1}}) + b"\n"


def test_split_into_output_and_errors_each_id_once(tmp_path: Path) -> None:
    results, inp = tmp_path / "results.jsonl", tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(line(c) for c in "abcde"))
    results.write_bytes(record("a", 200) + record("b", 400, {"code": "http_400", "message": "bad"})
                        + record("c", None, {"code": "timeout_read", "message": "slow"}) + record("a", 200)
                        + b'{"id": "torn')
    out, err = tmp_path / "out", tmp_path / "err"
    s = split(results, inp, out, err, expired=True)
    outs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    errs = [orjson.loads(x) for x in err.read_bytes().splitlines()]
    assert (s.answered, s.errors) == (1, 4)
    usage = BatchUsage.model_validate(s.usage())  # the answers' tokens only, each once
    assert (usage.input_tokens, usage.output_tokens, usage.input_tokens_details.cached_tokens) == (3, 5, 1)
    assert [x["custom_id"] for x in outs] == ["a"] and set(outs[0]) == {"id", "custom_id", "response", "error"}
    assert [(x["custom_id"], x["error"] and x["error"]["code"]) for x in errs] == [
        ("b", None), ("c", "timeout_read"), ("d", "batch_expired"), ("e", "batch_expired")]


def test_split_again_writes_the_same_bytes(tmp_path: Path) -> None:
    """A finalizing cut by a kill -9 is done again: the files it writes are the same, expired lines' ids too."""
    results, inp = tmp_path / "results.jsonl", tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(line(c) for c in "abcd"))
    results.write_bytes(record("a", 200) + record("b", 400, {"code": "http_400", "message": "bad"}))
    for i in (1, 2):
        s = split(results, inp, tmp_path / f"out{i}", tmp_path / f"err{i}", True, "batch_x")
        assert (s.answered, s.errors) == (1, 3)
    assert (tmp_path / "out1").read_bytes() == (tmp_path / "out2").read_bytes()
    assert (tmp_path / "err1").read_bytes() == (tmp_path / "err2").read_bytes()
    split(results, inp, tmp_path / "out3", tmp_path / "err3", True, "batch_y")  # another batch: other ids
    assert (tmp_path / "err1").read_bytes() != (tmp_path / "err3").read_bytes()


def test_keys_file_holds_keys_or_their_sha256(tmp_path: Path) -> None:
    p = tmp_path / "keys"
    p.write_text("# team\nkey-a\n\n" + hashlib.sha256(b"key-b").hexdigest().upper() + "\n")
    assert read_keys(p) == {owner_of("key-a"), owner_of("key-b")}
    p.write_text("# none\n")
    with pytest.raises(KeysError, match="no key"):
        read_keys(p)


def test_start_removes_what_a_crash_left_half_done(tmp_path: Path) -> None:
    s = Store(tmp_path)
    (s.tmp_dir / "upload-x").write_bytes(b"half")
    (s.files_dir / "file-000000000000000000000000.data").write_bytes(b"no record")
    (s.runs_dir / "batch_000000000000000000000000").mkdir()
    kept = shapes.batch_object("batch_111111111111111111111111", input_file_id="f", endpoint="/v1/embeddings",
                               completion_window="24h", created_at=1, expires_at=2, metadata=None)
    s.save_batch(kept["id"], BatchRec("o", kept))
    s.run_home(kept["id"]).mkdir()
    again = Store(tmp_path)
    assert len(again.load()) == 3
    assert list(again.batches) == [kept["id"]] and again.batches[kept["id"]].batch == kept
    assert [p.name for p in s.runs_dir.iterdir()] == [kept["id"]]
    assert not list(s.tmp_dir.iterdir()) and not list(s.files_dir.iterdir())


def test_a_key_without_a_slot_takes_one_from_the_key_holding_most() -> None:
    from evalsup.serve.fair import Running, preempt

    a1, a2, b1 = Running("a1", "A", 1), Running("a2", "A", 2), Running("b1", "B", 3)
    assert preempt([a1, a2], [Queued("c1", "C", 5)], 2) == "a2"  # A's newest yields
    assert preempt([a1, b1], [Queued("c1", "C", 5)], 2) is None  # nobody holds two
    assert preempt([a1, a2], [Queued("a3", "A", 5)], 2) is None  # A waits behind itself
    assert preempt([a1], [Queued("c1", "C", 5)], 2) is None  # a free slot: no one yields
