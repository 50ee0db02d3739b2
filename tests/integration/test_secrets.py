"""Every secret a run knows stays out of everything it writes (issue 39 item 4): a base URL's query value
(``?api-key=...``), echoed back by the endpoint in its error bodies and messages as gateways do, is in no file of
the run directory, not in the report, nor in what the commands print."""

from __future__ import annotations

from pathlib import Path

import orjson

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import assert_exactly_once, ids_of, run_cli

SECRET = "SECRET123"


def assert_nowhere(secret: str, run_dir: Path, *outputs: str) -> None:
    for out in outputs:
        assert secret not in out, f"{secret!r} was printed: {out[-2000:]}"
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f"{secret!r} is in {f}"


def test_a_query_credential_echoed_by_the_endpoint_is_written_nowhere(tmp_path: Path) -> None:
    objs = [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(10)]
    objs += [{"id": f"e{i}", "prompt": "x", "mock": {"status": 400}} for i in range(2)]  # echoed, recorded
    objs += [{"id": "r0", "prompt": "x", "mock": {"status": 500, "times": 1}}]  # echoed, retried
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
    with MockThread(MockConfig(echo_headers_in_errors=True)) as m:
        base = f"{m.url}?api-key={SECRET}"
        r = run_cli("run", "--model", "mock-model", "--base-url", base, "--log-format", "json", str(tasks))
        assert r.returncode == 0, r.stderr
        assert m.stats()["statuses"].get("400", 0) == 2
    run_dir = tmp_path / "t.run"
    recs = {x["custom_id"]: x for x in assert_exactly_once(run_dir, ids_of(10) | {"e0", "e1", "r0"})}
    echoed = recs["e0"]["response"]["body"]["error"]["message"]
    assert "?api-key=[redacted]" in echoed  # the endpoint did echo it: scrubbed where it was
    report = run_cli("report", str(run_dir))
    status = run_cli("status", str(run_dir))
    assert report.returncode == 0 and status.returncode == 0, report.stderr + status.stderr
    assert_nowhere(SECRET, run_dir, r.stdout, r.stderr, report.stdout, report.stderr, status.stdout, status.stderr)


def test_the_judges_query_credential_echoed_in_its_errors_is_written_nowhere(tmp_path: Path) -> None:
    """The judge's endpoint (a URL of its own, with ``?code=...``) refuses each grading request with an error that
    echoes the URL: the records' ``score_errors`` say so without it, in the run and in `evalsup score`."""
    secret = "JUDGE-SECRET-77"
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps({"id": f"t{i}", "prompt": "x", "expected": "Paris"}) + b"\n"
                               for i in range(4)))
    with MockThread(MockConfig()) as m, MockThread(MockConfig(echo_headers_in_errors=True)) as j:
        judge = ("--scorer", "judge", "--judge-base-url", f"{j.url}?code={secret}", "--judge-model", "not-served")
        r = run_cli("run", "--model", "mock-model", "--base-url", m.url, "--no-check", *judge, str(tasks))
        assert r.returncode == 0, r.stderr
        run_dir = tmp_path / "t.run"
        s = run_cli("score", str(run_dir), "--no-check", *judge)
    assert s.returncode == 0, s.stderr
    said = [x["score_errors"]["judge"] for x in assert_exactly_once(run_dir, ids_of(4))]
    rescored = [orjson.loads(x) for x in (run_dir / "results.scored.jsonl").read_bytes().splitlines()]
    said += [x["score_errors"]["judge"] for x in rescored]
    assert len(said) == 8 and all("?code=[redacted]" in e for e in said), said  # echoed, scrubbed where it was
    assert_nowhere(secret, run_dir, r.stdout, r.stderr, s.stdout, s.stderr)
