"""What a cache entry must be to be served or imported (issue 39 items 1 and 7), without a process: an entry
becomes a hit only after an online answer's checks, `cache import` refuses a line that is not an entry in one
line naming file:line (exit 2) and leaves out what a run would not keep, `cache prune` and `--cache-max-gb`
refuse a size that is not one, `$EVALSUP_CACHE` is named when it is what blocks --batch-api, and the key holds
the non-secret --header values (never a secret's)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from evalsup.cache.keep import why_unfit
from evalsup.cache.key import KeyMaker, key_headers
from evalsup.cache.lookup import CacheReader, Hit
from evalsup.cache.store import BadEntry, Entry, Store, entry_from_json, entry_json
from evalsup.cli.main import main

CHAT = "/v1/chat/completions"
KEY = "ab" * 32


def answer(reason: str = "stop", content: str = "4") -> dict[str, Any]:
    return {"id": "c1", "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                     "finish_reason": reason}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


GOOD = orjson.dumps(answer())


# ----- an entry on its way out: the checks of an online answer

def test_only_an_answer_passes_the_checks() -> None:
    parsed, why = why_unfit(200, GOOD, CHAT)
    assert why is None and parsed == answer()
    assert why_unfit(500, GOOD, CHAT)[1] == "status 500"
    assert why_unfit(200, GOOD[:-3] + b"\x01\x01\x01", CHAT)[1] == "not JSON"
    assert why_unfit(200, b"null", CHAT)[1] == "null, not an answer"
    assert why_unfit(200, b"[]", CHAT)[1] == "a list, not an answer"
    assert why_unfit(200, b'{"error": {"message": "overloaded"}}', CHAT)[1] == "an error body"
    assert why_unfit(200, b'{"data": []}', CHAT)[1] == "no 'choices', not an answer for its route"
    assert why_unfit("200", GOOD, CHAT)[1] == "status: not a number"
    assert why_unfit(200, b'{"data": []}', "/v1/embeddings")[1] is None
    assert why_unfit(200, b'{"result": 1}', "/v1/rerank")[1] is None  # a route evalsup has no row for: an object
    assert why_unfit(200, orjson.dumps(answer("length")), CHAT)[1] == "cut (length)"
    assert why_unfit(200, orjson.dumps(answer("length")), CHAT, keep_length=True)[1] is None
    assert why_unfit(200, orjson.dumps(answer("content_filter")), CHAT, keep_length=True)[1] == "content_filter"


def reader_with(tmp_path: Path, kept: bytes, **sql: Any) -> CacheReader:
    s = Store(tmp_path / "c")
    s.put([Entry(bytes.fromhex(KEY), kept, 200, "r1", "m", CHAT, 3, 1)])
    for column, value in sql.items():  # a value of another kind, as a hand-edited file may hold
        s.conn.execute(f"UPDATE entries SET {column} = ?", (value,))
    s.close()
    return CacheReader(tmp_path / "c", "rw", None, (), "", keep_length=False)


def test_a_hit_is_one_line_of_json_whatever_the_file_holds(tmp_path: Path) -> None:
    pretty = orjson.dumps(answer(), option=orjson.OPT_INDENT_2)
    got = reader_with(tmp_path, pretty).lookup(bytes.fromhex(KEY), CHAT)
    assert isinstance(got, Hit) and b"\n" not in got.body and orjson.loads(got.body) == answer()
    got = reader_with(tmp_path / "exact", GOOD).lookup(bytes.fromhex(KEY), CHAT)
    assert isinstance(got, Hit) and got.body == GOOD  # one line already: the bytes kept, exactly
    assert reader_with(tmp_path / "none", GOOD).lookup(b"\0" * 32, CHAT) is None


@pytest.mark.parametrize(("column", "value", "why"), [
    ("body", "not json", "not JSON"),  # a TEXT value where a BLOB was written
    ("body", 7, "not JSON"),
    ("prompt_tokens", "twelve", "prompt_tokens: a whole number expected, got a string"),
    ("completion_tokens", 1.5, "completion_tokens: a whole number expected, got a fraction"),
    ("model", b"\xff", "model: a string or null expected, got bytes"),
    ("status", 429, "status 429"),
])
def test_an_entry_of_another_kind_is_a_miss_with_its_reason(tmp_path: Path, column: str, value: Any,
                                                             why: str) -> None:
    assert reader_with(tmp_path, GOOD, **{column: value}).lookup(bytes.fromhex(KEY), CHAT) == why


# ----- an entry on its way in: `cache import`

def line(**fields: Any) -> bytes:
    base: dict[str, Any] = {"key": KEY, "body": GOOD.decode(), "status": 200, "request_id": "r", "model": "m",
                            "path": CHAT, "prompt_tokens": 3, "completion_tokens": 1, "created": 1.0, "atime": 2.0}
    return orjson.dumps({**base, **fields}) + b"\n"


def test_an_import_line_is_stored_as_compact_json() -> None:
    e = entry_from_json(line(body=orjson.dumps(answer(), option=orjson.OPT_INDENT_2).decode()))
    assert e.body == orjson.dumps(answer()) and e.status == 200 and (e.created, e.atime) == (1.0, 2.0)
    spaced = entry_from_json(line(body='{"a": 1.50, "s": "\\u00e9"}'))
    assert spaced.body == '{"a":1.5,"s":"é"}'.encode()
    assert entry_from_json(entry_json(spaced)) == spaced  # an export of it comes back the same
    bare = entry_from_json(orjson.dumps({"key": KEY, "body": "{}"}), now=9.0)  # left out: the defaults
    assert (bare.status, bare.prompt_tokens, bare.created, bare.atime, bare.model) == (200, 0, 9.0, 9.0, None)


@pytest.mark.parametrize(("fields", "why"), [
    ({"prompt_tokens": {"n": 3}}, "prompt_tokens: a whole number expected, got an object"),
    ({"model": ["a"]}, "model: a string or null expected, got a list"),
    ({"status": {"code": 200}}, "status: a whole number expected, got an object"),
    ({"completion_tokens": 1 << 63}, "completion_tokens: 9223372036854775808 is out of range"),
    ({"completion_tokens": -1}, "completion_tokens: -1 is out of range"),
    ({"created": "nan"}, "created: a time in seconds expected, got a string"),
    ({"atime": True}, "atime: a time in seconds expected, got a boolean"),
    ({"key": "00"}, "key: 64 hex digits expected"),
    ({"body": {"choices": []}}, "body: the answer's JSON as a string expected, got an object"),
    ({"body": "{not json"}, "body: not JSON"),
])
def test_an_import_line_of_the_wrong_kind_says_which_field(fields: dict[str, Any], why: str) -> None:
    with pytest.raises(BadEntry) as got:
        entry_from_json(line(**fields))
    assert str(got.value).startswith(why)


def cache_cli(*args: str, stdin: bytes | None = None) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["cache", *args], input=stdin)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.exit_code, r.output


def test_import_refuses_a_bad_line_by_file_and_line_and_imports_nothing(tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    src.write_bytes(line() + line(key="cd" * 32).replace(b'"prompt_tokens":3', b'"prompt_tokens":%d' % (1 << 64)))
    code, out = cache_cli("import", str(tmp_path / "c"), str(src))
    assert code == 2 and "Traceback" not in out
    said = out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(f"evalsup: {src}:2: not a cache entry (prompt_tokens: ")
    with sqlite3.connect(tmp_path / "c" / "cache.sqlite") as c:
        assert c.execute("SELECT count(*) FROM entries").fetchall()[0][0] == 0  # nothing was imported


def test_import_bounds_a_line_without_holding_it(tmp_path: Path) -> None:
    src = tmp_path / "c.jsonl"
    src.write_bytes(line() + line(key="cd" * 32, body=orjson.dumps(answer(content="x" * 3_000_000)).decode()))
    code, out = cache_cli("import", str(tmp_path / "c"), str(src), "--max-line-mb", "1")
    assert code == 2 and out.strip() == f"evalsup: {src}:2: a line longer than 1 MiB (--max-line-mb); nothing " \
                                        "was imported"
    code, out = cache_cli("import", str(tmp_path / "c"), str(src), "--max-line-mb", "4")
    assert code == 0 and "2 entries added" in out


def test_import_leaves_out_what_a_run_would_not_keep_and_says_so(tmp_path: Path) -> None:
    keys = iter(f"{i:02x}" * 32 for i in range(10))
    src = tmp_path / "c.jsonl"
    cut = orjson.dumps(answer("length")).decode()
    src.write_bytes(line(key=next(keys)) + line(key=next(keys), status=500) + line(key=next(keys), body="null")
                    + line(key=next(keys), body="[]") + line(key=next(keys), body=cut)
                    + line(key=next(keys), status=503))
    code, out = cache_cli("import", str(tmp_path / "c"), "-", stdin=src.read_bytes())
    assert code == 0, out
    assert out.strip() == ("evalsup: 1 entries added to " + str(tmp_path / "c") + "; 5 not added (a run would not "
                           "keep them): 1 status 500 (first: stdin:2), 1 null, not an answer (first: stdin:3), 1 a "
                           "list, not an answer (first: stdin:4), 1 cut (length) (first: stdin:5), 1 status 503 "
                           "(first: stdin:6)")
    code, out = cache_cli("import", str(tmp_path / "c"), str(src), "--cache-length")
    assert code == 0 and out.startswith("evalsup: 1 entries added")  # the cut answer, kept as --cache-length would


@pytest.mark.parametrize("size", ["inf", "nan", "-1"])
def test_prune_refuses_a_size_that_is_not_one(tmp_path: Path, size: str) -> None:
    Store(tmp_path / "c").close()
    code, out = cache_cli("prune", str(tmp_path / "c"), "--max-gb", size)
    assert code == 2 and len(out.strip().splitlines()) == 1 and "--max-gb must be a number of GB" in out


@pytest.mark.parametrize("size", [float("inf"), float("nan"), -1.0])
def test_cache_max_gb_refuses_a_size_that_is_not_one(tmp_path: Path, size: float) -> None:
    from evalsup.config.run_config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"--cache-max-gb must be a (finite number|number of GB)"):
        build_config(tmp_path / "t.jsonl", {"base_url": ["http://127.0.0.1:9/v1"], "cache": str(tmp_path / "c"),
                                            "cache_max_gb": size})


def test_batch_api_names_the_cache_setting_where_it_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evalsup.config.run_config import ConfigError, build_config

    base = {"base_url": ["http://127.0.0.1:9/v1"], "batch_api": True}
    monkeypatch.setenv("EVALSUP_CACHE", str(tmp_path / "c"))
    with pytest.raises(ConfigError) as got:
        build_config(tmp_path / "t.jsonl", base)
    assert str(got.value).startswith("$EVALSUP_CACHE (a cache) cannot go with --batch-api: it works on requests "
                                     "sent one by one")
    assert "unset EVALSUP_CACHE, or give --cache off" in str(got.value)
    with pytest.raises(ConfigError, match=r"^--cache cannot go with --batch-api: it works on requests"):
        build_config(tmp_path / "t.jsonl", {**base, "cache": str(tmp_path / "c")})
    assert build_config(tmp_path / "t.jsonl", {**base, "cache": "off"}).worker.cache_dir is None


# ----- the key: the request's non-secret headers

def test_a_routing_header_changes_the_key_and_a_secret_never_enters_it() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    plain = KeyMaker().key(CHAT, body, "t")
    routed = key_headers(["X-Portkey-Provider: anthropic"])
    assert routed == (("x-portkey-provider", "anthropic"),)
    assert KeyMaker(headers=routed).key(CHAT, body, "t") != plain
    assert KeyMaker(headers=key_headers(["X-Portkey-Provider: openai"])).key(CHAT, body, "t") != \
        KeyMaker(headers=routed).key(CHAT, body, "t")
    # a name's case and the order of --header do not matter; the last of a name wins, as it is sent
    assert key_headers(["b: 2", "A: 1"]) == key_headers(["a: 1", "B: 2"]) == key_headers(["a: 0", "B: 2", "A: 1"])
    # secrets: by their source (env:, @file, never read here) or by their name: left out, the key as without them
    secret = ["Authorization: Bearer sk-live-123", "api-key: abcdef", "X-Api-Key: abcdef",
              "Ocp-Apim-Subscription-Key: abcdef", "X-Auth-Token: abcdef", "Cookie: s=abcdef",
              "X-Gateway-Tenant: env:TENANT_VAR", "X-Other: @/nonexistent/file"]
    assert key_headers(secret) == ()
    assert KeyMaker(headers=key_headers(secret)).key(CHAT, body, "t") == plain
    canonical = KeyMaker(headers=key_headers([*secret, "X-Route: a"])).canonical(CHAT, body, "t")
    assert b"abcdef" not in canonical and b"sk-live" not in canonical and b"x-route" in canonical


def test_the_summary_line_says_the_unusable_entries() -> None:
    from evalsup.cache.text import cache_text

    line = cache_text({"hits": 17, "misses": 3, "unusable": 3, "written": 3})
    assert line.startswith("17 answered from it, 3 sent (3 of them had an unusable entry); 3 answers kept")
    assert "unusable" not in cache_text({"hits": 17, "misses": 3, "written": 3})
