"""Endpoints as users write them (issue 34), over real HTTP on 127.0.0.1 against the mock: credentials in the
URL (HTTP basic auth), a query string in the base URL (Azure OpenAI's api-version), Azure's deployment path and
api-key header, and a request that cannot be sent at all. Each run finishes with every task exactly once, or is
refused at once with one line; none waits for an endpoint; the password is nowhere to be seen."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import (
    LIVENESS_S,
    assert_exactly_once,
    env_for,
    ids_of,
    read_results,
    run_cli,
    summary,
    write_tasks,
)

PASSWORD = "pw-7f3a9c2e51b4"
TOKEN = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
API_VERSION = "api-version=2024-02-01"


def with_auth(url: str, userinfo: str = f"alice:{PASSWORD}") -> str:
    return url.replace("http://", f"http://{userinfo}@", 1)


def assert_nowhere(secrets: list[str], run_dir: Path, *outputs: str) -> None:
    """None of ``secrets`` in any file of the run directory or in any of ``outputs``."""
    for s in secrets:
        assert all(s not in out for out in outputs), f"{s!r} was printed"
        for f in run_dir.rglob("*"):
            if f.is_file():
                assert s.encode() not in f.read_bytes(), f"{s!r} is in {f}"


def test_credentials_in_the_url_are_basic_auth_and_never_shown(tmp_path: Path) -> None:
    with MockThread(MockConfig(basic_auth=f"alice:{PASSWORD}", echo_headers_in_errors=True)) as m:
        tasks = write_tasks(tmp_path / "t.jsonl", 20)
        with open(tasks, "ab") as f:  # two tasks whose error bodies echo the request's headers
            f.writelines(orjson.dumps({"id": f"e{i}", "prompt": "x", "mock": {"status": 400}}) + b"\n"
                         for i in range(2))
        r = run_cli("run", "--model", "mock-model", "--base-url", with_auth(m.url), "-c", "8", str(tasks))
        assert r.returncode == 0, r.stderr
        assert m.stats()["statuses"].get("401", 0) == 0  # every request carried it, the check's too
    run_dir = tmp_path / "t.run"
    recs = {x["custom_id"]: x for x in assert_exactly_once(run_dir, ids_of(20) | {"e0", "e1"})}
    assert all(recs[f"t{i}"]["error"] is None for i in range(20))
    assert {x["metrics"]["endpoint"]["url"] for x in recs.values()} == {m.url}
    echoed = {k.lower(): v for k, v in recs["e0"]["response"]["body"]["error"]["request_headers"].items()}
    assert echoed["authorization"] == "Basic [redacted]"
    status = run_cli("status", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert_nowhere([PASSWORD, TOKEN], run_dir, r.stdout, r.stderr, status.stdout, status.stderr)


def test_a_wrong_password_is_refused_by_the_check_in_one_line(tmp_path: Path) -> None:
    with MockThread(MockConfig(basic_auth=f"alice:{PASSWORD}")) as m:
        tasks = write_tasks(tmp_path / "t.jsonl", 5)
        r = run_cli("run", "--model", "mock-model", "--base-url", with_auth(m.url, "alice:wrong-pass-123"),
                    str(tasks))
        assert m.stats()["by_path"].get("/v1/chat/completions", 0) == 0
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "user:password in --base-url" in r.stderr
    assert "wrong-pass-123" not in r.stdout + r.stderr


@pytest.mark.parametrize("key", ["env", "header"])
def test_basic_auth_and_a_key_both_in_authorization_are_refused_before_any_request(
        tmp_path: Path, mock: MockThread, key: str) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 5)
    if key == "env":
        r = run_cli("run", "--model", "mock-model", "--base-url", with_auth(mock.url), str(tasks),
                    env={"OPENAI_API_KEY": "sk-test-0123456789"})
        assert "the API key ($OPENAI_API_KEY)" in r.stderr and "--header 'api-key: env:VAR'" in r.stderr
    else:
        r = run_cli("run", "--model", "mock-model", "--base-url", with_auth(mock.url), "--header",
                    "Authorization: env:TOK", str(tasks), env={"TOK": "Token t-0123456789"})
        assert "--header Authorization" in r.stderr
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert mock.stats()["requests"] == 0  # refused before the connection check
    assert PASSWORD not in r.stdout + r.stderr and "sk-test" not in r.stdout + r.stderr


def test_a_query_in_the_base_url_is_sent_on_every_request(tmp_path: Path) -> None:
    # the first tasks' connections are reset: the breaker trips and its probe asks the endpoint (with the query)
    objs = [{"id": f"r{i}", "prompt": "x", "mock": {"reset": True, "times": 1}} for i in range(4)]
    objs += [{"id": f"t{i}", "prompt": f"q{i}"} for i in range(30)]
    with MockThread(MockConfig(require_query=API_VERSION)) as m:
        tasks = tmp_path / "t.jsonl"
        tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
        r = run_cli("run", "--model", "mock-model", "--base-url", f"{m.url}?{API_VERSION}", "-c", "4", "--stream",
                    str(tasks))
        assert r.returncode == 0, r.stderr
        stats = m.stats()
        assert stats["statuses"].get("404", 0) == 0  # not one request, probe or check without it
        # without the query the check leaves it out at once, in one line
        left = run_cli("run", "--model", "mock-model", "--base-url", m.url, str(write_tasks(tmp_path / "u.jsonl", 3)))
    assert left.returncode == 2 and "HTTP 404" in left.stderr and left.stderr.strip().count("\n") == 0
    run_dir = tmp_path / "t.run"
    recs = assert_exactly_once(run_dir, {o["id"] for o in objs})
    assert all(x["error"] is None for x in recs)
    assert {x["metrics"]["endpoint"]["url"] for x in recs} == {m.url}  # shown without the query
    assert summary(run_dir)["settings"]["endpoint_path"] == "/v1"


def test_azure_openai_deployment_path_api_version_and_api_key_header(tmp_path: Path) -> None:
    key = "az-key-5be9d1c04f"
    with MockThread(MockConfig(api_key=key, api_key_header="api-key", require_query=API_VERSION)) as m:
        base = f"http://127.0.0.1:{m.port}/openai/deployments/mock-model?{API_VERSION}"
        tasks = write_tasks(tmp_path / "t.jsonl", 12)
        r = run_cli("run", "--base-url", base, "--header", "api-key: env:AZURE_OPENAI_API_KEY", str(tasks),
                    env={"AZURE_OPENAI_API_KEY": key})
        assert r.returncode == 0, r.stderr
        by_path = m.stats()["by_path"]
    assert by_path.get("/openai/deployments/*/chat/completions", 0) == 12
    recs = assert_exactly_once(tmp_path / "t.run", ids_of(12))
    assert all(x["error"] is None and x["response"]["body"]["model"] == "mock-model" for x in recs)
    shown = {x["metrics"]["endpoint"]["url"] for x in recs}
    assert shown == {f"http://127.0.0.1:{m.port}/openai/deployments/mock-model"}
    assert_nowhere([key], tmp_path / "t.run", r.stdout, r.stderr)


@pytest.mark.parametrize("check", [True, False])
def test_a_request_that_cannot_be_sent_stops_the_run_at_once_and_a_good_url_resumes(
        tmp_path: Path, mock: MockThread, check: bool) -> None:
    """"a..b" cannot be encoded as a host name (UnicodeError, a ValueError): nothing can reach any server. With
    the check it refuses the run; without it, the first request does: exit 2 at once, nothing ejected or waited
    for, no task written; the rerun with the right URL does every task once."""
    tasks = write_tasks(tmp_path / "t.jsonl", 40)
    bad = f"http://alice:{PASSWORD}@a..b:{mock.port}/v1"
    r = run_cli("run", "--model", "mock-model", "--base-url", bad, *(() if check else ("--no-check",)),
                str(tasks))
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if "could not be sent" in x]
    assert len(lines) == 1 and "a setting is wrong, not the endpoint" in lines[0], r.stderr
    assert "down" not in r.stderr and "ejected" not in r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    run_dir = tmp_path / "t.run"
    if not check:
        assert summary(run_dir)["exit_code"] == 2
        assert not read_results(run_dir)  # no task was failed for it
        events = (run_dir / "events.jsonl").read_bytes()
        assert b"breaker_open" not in events and PASSWORD.encode() not in events
    again = run_cli("run", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert again.returncode == 0, again.stderr
    assert_exactly_once(run_dir, ids_of(40))


@pytest.mark.parametrize("url", ["user", "query"])
def test_the_two_urls_of_the_report_against_a_plain_endpoint(tmp_path: Path, mock: MockThread, url: str) -> None:
    base = with_auth(mock.url, f"user:{PASSWORD}") if url == "user" else f"{mock.url}?{API_VERSION}"
    tasks = write_tasks(tmp_path / "t.jsonl", 10)
    r = run_cli("run", "--model", "mock-model", "--base-url", base, str(tasks))
    assert r.returncode == 0, r.stderr
    assert_exactly_once(tmp_path / "t.run", ids_of(10))
    assert_nowhere([PASSWORD], tmp_path / "t.run", r.stdout, r.stderr)


def test_evalsup_run_keeps_the_password_off_every_command_line(tmp_path: Path) -> None:
    """``evalsup.run`` starts `evalsup run` as a process: a URL with user:password@ goes to it in its environment,
    never on its command line (any process title shows that)."""
    code = ("import os, evalsup; r = evalsup.run(os.environ['T_TASKS'], base_url=os.environ['T_URL'], "
            "model='mock-model', progress=False); print(r.succeeded)")
    with MockThread(MockConfig(basic_auth=f"alice:{PASSWORD}", latency_ms=20)) as m:
        tasks = write_tasks(tmp_path / "t.jsonl", 300)
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env_for({"T_TASKS": str(tasks), "T_URL": with_auth(m.url)}))
        shown: set[str] = set()
        try:
            while p.poll() is None:
                for proc in psutil.process_iter(["cmdline"]):
                    cmd = " ".join(proc.info["cmdline"] or ())
                    if PASSWORD in cmd:
                        shown.add(cmd)
                time.sleep(0.05)
            out, err = p.communicate(timeout=LIVENESS_S)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == "300" and not shown
    assert_nowhere([PASSWORD, TOKEN], tmp_path / "t.run", out, err)
