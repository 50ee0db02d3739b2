"""A JSON schema's references are followed only inside the schema (issue 39): a remote `$ref` (in a task's
`response_format` or in --response-schema) or one that points nowhere is refused before any request, with one
line naming the task's line or the file, and nothing is ever fetched: a server on 127.0.0.1 that would serve
the referenced schema counts every hit, and sees none."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import lines, read_results, run_args, run_cli

VALID = '{"answer": "B"}'
FIX = "(fix that line and rerun, or rerun with --on-invalid skip to record bad lines in invalid.jsonl and go on)"


class Counted:
    """An HTTP server on 127.0.0.1 that serves a JSON schema for any path and counts the requests it gets."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                body = b'{"type": "string"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.hits = hits
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)


@pytest.fixture
def counted() -> Iterator[Counted]:
    c = Counted()
    c.thread.start()
    try:
        yield c
    finally:
        c.server.shutdown()
        c.server.server_close()


def _schema(answer: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"answer": answer}, "required": ["answer"], **more}


def _tasks(path: Path, n: int, own: dict[int, dict[str, Any]]) -> Path:
    """``n`` chat tasks in the batch form, each with its own response_format schema (``own[i]`` for task i,
    else a good one with a local reference)."""
    good = _schema({"$ref": "#/$defs/answer"}, **{"$defs": {"answer": {"type": "string"}}})
    return lines(path, [{"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}],
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "pick", "schema": own.get(i, good)}},
                                  "mock": {"text": VALID}}} for i in range(n)])


def test_a_tasks_remote_ref_is_refused_naming_its_line_and_nothing_is_fetched(tmp_path: Path, mock: MockThread,
                                                                                counted: Counted) -> None:
    ref = f"{counted.url}/answer.json"
    tasks = _tasks(tmp_path / "t.jsonl", 20, {6: _schema({"$ref": ref})})
    r = run_cli(*run_args(mock, tasks, "-w", "2"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"evalsup: {tasks}:7: the task's response_format json_schema: $ref {ref!r} at properties/answer is outside "
        f"the schema: references are followed only inside it, nothing is fetched  {FIX}"]
    assert counted.hits == [] and mock.stats()["requests"] == 0


def test_a_response_schema_files_remote_ref_is_refused_naming_the_file(tmp_path: Path, mock: MockThread,
                                                                       counted: Counted) -> None:
    ref = f"{counted.url}/answer.json"
    for where in ("answer.json", "file:///etc/hostname"):  # http:// or file://: neither is read
        target = ref if where == "answer.json" else where
        schema = tmp_path / "schema.json"
        schema.write_bytes(orjson.dumps(_schema({"$ref": target})))
        tasks = lines(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q", "mock": {"text": VALID}}])
        r = run_cli(*run_args(mock, tasks, "--response-schema", str(schema)))
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [
            f"evalsup: --response-schema {schema}: $ref {target!r} at properties/answer is outside the schema: "
            "references are followed only inside it, nothing is fetched"]
    assert counted.hits == [] and mock.stats()["requests"] == 0


def test_a_broken_local_ref_is_refused_before_any_paid_request(tmp_path: Path, mock: MockThread) -> None:
    """Before: the workers crash-looped on it (exit 75, 88 paid requests and no result each attempt)."""
    broken = _schema({"$ref": "#/definitions/missing"})
    tasks = _tasks(tmp_path / "t.jsonl", 20, {2: broken})
    r = run_cli(*run_args(mock, tasks, "-w", "2"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"evalsup: {tasks}:3: the task's response_format json_schema: $ref '#/definitions/missing' at "
        f"properties/answer points nowhere in the schema  {FIX}"]
    assert mock.stats()["requests"] == 0
    # --on-invalid skip: the line goes to invalid.jsonl as the run reads it; the others are validated, their
    # local references followed
    r = run_cli(*run_args(mock, tasks, "-w", "2", "--on-invalid", "skip"))
    assert r.returncode == 0, r.stderr
    recs = read_results(tmp_path / "t.run")
    assert sorted(x["custom_id"] for x in recs) == sorted(f"t{i}" for i in range(20) if i != 2)
    assert all(x["error"] is None and x["metrics"]["reasks"] == 0 for x in recs)
    invalid = [orjson.loads(x) for x in (tmp_path / "t.run" / "invalid.jsonl").read_bytes().splitlines()]
    assert [(x["line"], "points nowhere in the schema" in x["error"]) for x in invalid] == [(3, True)]
    assert mock.stats()["by_path"]["/v1/chat/completions"] == 19


def test_with_validation_off_a_tasks_schema_is_only_sent(tmp_path: Path, mock: MockThread, counted: Counted) -> None:
    """--no-validate-schema: evalsup reads no answer against the schema, so it has nothing to follow or refuse;
    the schema goes to the endpoint as written (the provider's to judge)."""
    tasks = _tasks(tmp_path / "t.jsonl", 5, {1: _schema({"$ref": f"{counted.url}/answer.json"})})
    r = run_cli(*run_args(mock, tasks, "--no-validate-schema"))
    assert r.returncode == 0, r.stderr
    assert len(read_results(tmp_path / "t.run")) == 5 and counted.hits == []
