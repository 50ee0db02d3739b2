"""Large response bodies checked without being built (worker.bodies): the same answers as a whole parse, the
same records, and the whole body still there for scorers and plugins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from evalsup.mock.server import MockThread
from tests.harness import ROOT, assert_exactly_once, read_results, run_cli

# (body, is JSON): each refused one must be refused by the check as by orjson, whatever simdjson thinks


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
        text = x["response"]["body"]["choices"][0]["message"]["content"]
        assert x["scores"]["length_and_hit.length"] == len(text) > 150_000
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
