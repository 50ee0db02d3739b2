"""Issue 21: --header (values from the environment or a file for secrets, never printed) and the User-Agent."""

from __future__ import annotations

from pathlib import Path

import orjson

from evalsup import __version__
from evalsup.mock.server import MockConfig, MockThread
from tests.harness import read_results, run_cli, write_tasks


def test_a_bad_header_stops_the_run_in_one_line_without_its_value(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 3)
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--header", "api-key: @/no/such/file",
                "--header", "Bad Name: sk-literal-secret-value", str(tasks))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "api-key" in r.stderr and "/no/such/file" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "t.run" / "results.jsonl").exists()


def test_headers_reach_the_endpoint_and_secret_values_never_reach_a_file(tmp_path: Path) -> None:
    secret = "gw-secret-0123456789abcdef"
    with MockThread(MockConfig(echo_headers_in_errors=True)) as m:
        objs = [{"id": f"e{i}", "prompt": "x", "mock": {"status": 400}} for i in range(3)]
        objs += [{"id": f"o{i}", "prompt": "x"} for i in range(3)]
        tasks = tmp_path / "t.jsonl"
        tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
        r = run_cli("run", "--model", "mock-model", "--base-url", m.url, "--header", "api-key: env:GW_KEY",
                    "--header", "X-Route: blue", str(tasks), env={"GW_KEY": secret})
        assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    for f in (tmp_path / "t.run").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    echoed = [x for x in read_results(tmp_path / "t.run") if x["error"]]
    assert len(echoed) == 3
    for rec in echoed:  # the mock echoed what it got: every header arrived, the secret one scrubbed
        seen = {k.lower(): v for k, v in rec["response"]["body"]["error"]["request_headers"].items()}
        assert seen["api-key"] == "[redacted]" and seen["x-route"] == "blue"
        assert seen["user-agent"] == f"evalsup/{__version__}"
