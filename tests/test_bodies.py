"""Large response bodies checked without being built (worker.bodies): the same answers as a whole parse, the
same records, and the whole body still there for scorers and plugins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import ROOT, assert_exactly_once, read_results, run_cli

from evalsup.mock.server import MockThread
from evalsup.worker.bodies import HAVE_SIMDJSON, LARGE, BodyParser, UsageOnly, one_line

PAD = "x" * (2 * LARGE + 100)  # still LARGE when cut in half
USAGE = {"prompt_tokens": 3, "completion_tokens": 70_000, "total_tokens": 70_003}


def _big(extra: bytes = b"") -> bytes:
    return b'{"choices":[{"message":{"content":"%s"}}]%s,"usage":%s}' % (PAD.encode(), extra, orjson.dumps(USAGE))


# (body, is JSON): each refused one must be refused by the check as by orjson, whatever simdjson thinks
BODIES = {
    "valid": (_big(), True),
    "cut in half": (_big()[: len(_big()) // 2], False),
    "trailing garbage": (_big() + b" x", False),
    "NaN": (_big(b',"n":NaN'), False),
    "invalid UTF-8": (_big(b',"s":"\xff"'), False),
    "lone surrogate": (_big(b',"s":"\\ud800"'), False),
    "control character": (_big(b',"s":"\x01"'), False),
    "byte order mark": (b"\xef\xbb\xbf" + _big(), False),  # simdjson skips it; in a JSONL line it is garbage
    "NUL after": (_big() + b"\x00", False),
    "integer past 64 bits": (_big(b',"n":123456789012345678901234567890'), True),  # simdjson refuses, orjson not
    "an array": (b'["%s"]' % PAD.encode(), True),
    "too deep": (b"[" * 2000 + b"1" + b"]" * 2000 + b" " * LARGE, False),
    # simdjson's get() takes the first "usage", orjson (and a reader of the line) the last: built whole
    "two usage keys": (_big(b',"usage":{"total_tokens":1}'), True),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_checked_body_is_json_exactly_when_orjson_says_so(name: str) -> None:
    raw, is_json = BODIES[name]
    assert len(raw) >= LARGE
    p = BodyParser(whole=False)
    if not is_json:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
        with pytest.raises(orjson.JSONDecodeError):
            p.parse(raw, one_line(raw))
        return
    got = p.parse(raw, one_line(raw))
    full = orjson.loads(raw)
    if isinstance(got, UsageOnly):  # only what evalsup reads is taken out
        assert got == ({"usage": full["usage"]} if isinstance(full, dict) else {})
    else:
        assert got == full
    assert isinstance(got, UsageOnly) == (name in ("valid", "an array")), "checked, or built when in doubt"


@pytest.mark.skipif(not HAVE_SIMDJSON, reason="pysimdjson is a dependency; without it every body is whole")
def test_only_large_one_line_bodies_are_checked_without_being_built() -> None:
    p = BodyParser(whole=False)
    got = p.parse(_big(), True)
    assert isinstance(got, UsageOnly) and got == {"usage": USAGE}
    small = b'{"choices":[],"usage":{"total_tokens":1}}'
    got = p.parse(small, True)  # small: orjson's whole parse is as cheap
    assert not isinstance(got, UsageOnly) and got == orjson.loads(small)
    pretty = orjson.dumps(orjson.loads(_big()), option=orjson.OPT_INDENT_2)
    # several lines: re-encoded into the record, so built whole
    assert not one_line(pretty)
    got = p.parse(pretty, False)
    assert not isinstance(got, UsageOnly) and got == orjson.loads(pretty)
    for _ in range(3):  # the parser is used again and again (its document's views are gone each time)
        assert p.parse(_big(), True) == {"usage": USAGE}
    held = p._parser.parse(_big())  # a view of the kept parser's document left alive: it cannot parse again
    got = p.parse(_big(), True)
    assert not isinstance(got, UsageOnly) and got == orjson.loads(_big())  # orjson answered instead
    assert isinstance(p.parse(_big(), True), UsageOnly)  # and the next body has a parser of its own
    del held
    got = BodyParser(whole=True).parse(_big(), True)
    assert not isinstance(got, UsageOnly) and got == orjson.loads(_big())


def _tasks(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_large_bodies_are_written_and_counted_as_the_endpoint_sent_them(tmp_path: Path, mock: MockThread) -> None:
    rows: list[dict[str, Any]] = [{"id": f"t{i}", "prompt": f"q{i}", "mock": {"kb": 300 if i % 2 else 100}}
                                  for i in range(40)]
    rows.append({"id": "bad-once", "prompt": "x", "mock": {"kb": 200, "malformed": True, "times": 1}})
    rows.append({"id": "bad", "prompt": "x", "mock": {"kb": 200, "malformed": True}})
    tasks = _tasks(tmp_path / "big.jsonl", rows)
    r = run_cli("run", "-w", "2", "-c", "8", "--model", "mock-model", "--base-url", mock.url, "--max-attempts", "2",
                str(tasks))
    assert r.returncode in (0, 1), r.stderr  # one task fails for good
    recs = {x["custom_id"]: x for x in assert_exactly_once(tmp_path / "big.run", {x["id"] for x in rows})}
    # a body cut in half is refused as not JSON on every attempt (and retried), never written as a body
    assert recs["bad"]["error"]["code"] == "invalid_json" and recs["bad"]["response"] is None
    assert recs["bad-once"]["error"] is None and recs["bad-once"]["metrics"]["attempts"] == 2
    ok = [x for k, x in recs.items() if k != "bad"]
    for x in ok:
        body = x["response"]["body"]
        assert len(body["choices"][0]["message"]["content"]) > 60_000
    # the tokens in the summary are the sum of the bodies' usage, read without building the bodies
    s = orjson.loads((tmp_path / "big.run" / "summary.json").read_bytes())
    assert s["large_bodies_checked"] == len(ok)  # each answer checked, none built (no scorer, no plugin)
    assert s["tokens"]["completion"] == sum(x["response"]["body"]["usage"]["completion_tokens"] for x in ok)
    assert s["tokens"]["prompt"] == sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in ok)


def test_scorers_see_a_large_body_whole(tmp_path: Path, mock: MockThread) -> None:
    plugin = ROOT / "tests" / "plugins" / "score_user.py"
    rows = [{"id": f"t{i}", "prompt": f"q{i}", "expected": "zzz-not-there", "mock": {"kb": 200}} for i in range(10)]
    tasks = _tasks(tmp_path / "sc.jsonl", rows)
    r = run_cli("run", "-w", "1", "--model", "mock-model", "--base-url", mock.url, "--scorer",
                f"{plugin}:length_and_hit", str(tasks))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "sc.run")
    assert len(recs) == 10
    for x in recs:
        assert x["scores"]["length"] == len(x["response"]["body"]["choices"][0]["message"]["content"]) > 150_000
    assert orjson.loads((tmp_path / "sc.run" / "summary.json").read_bytes())["large_bodies_checked"] == 0


def test_a_worker_plugin_sees_a_large_body_whole(tmp_path: Path, mock: MockThread) -> None:
    plugin = ROOT / "tests" / "plugins" / "whole_body.py"
    rows = [{"id": f"t{i}", "prompt": f"q{i}", "mock": {"kb": 200}} for i in range(10)]
    tasks = _tasks(tmp_path / "pl.jsonl", rows)
    r = run_cli("run", "-w", "1", "--model", "mock-model", "--base-url", mock.url, "--worker-plugin",
                f"{plugin}:needs_text", "--max-task-crashes", "1", str(tasks))
    assert r.returncode == 0, r.stderr  # the plugin raises (and its task is worker_crashed) on a usage-only body
    recs = assert_exactly_once(tmp_path / "pl.run", {x["id"] for x in rows})
    assert all(x["error"] is None for x in recs), [x["error"] for x in recs if x["error"]][:2]
    assert orjson.loads((tmp_path / "pl.run" / "summary.json").read_bytes())["large_bodies_checked"] == 0
