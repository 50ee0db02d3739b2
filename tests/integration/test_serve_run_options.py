"""`evalsup serve ... -- RUN_OPTION ...`: the run options are checked once, at serve's start, by `evalsup run`'s own
parser and config: a bad one (or one serve sets itself) is one line and exit 2 before the port is bound, not the
failure of every batch later."""

from __future__ import annotations

import io
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from evalsup.mock.server import MockThread
from evalsup.rundir.run_json import recorded_settings
from tests.harness import Run
from tests.serve_client import batch_lines, client, free_port, serve, wait_ended

REFUSED = [
    (("--no-such-flag",), "--no-such-flag"),
    (("--help",), "--help"),  # not the run's help and exit 0
    (("--concurrency", "abc"), "--concurrency"),
    (("--max-tokens", "-5"), "--max-tokens"),
    (("--scorer", "no-such-scorer"), "no-such-scorer"),
    (("--out", "elsewhere"), "--out is set by evalsup serve"),
    (("-o", "elsewhere"), "--out is set by evalsup serve"),
    (("--base-url", "http://127.0.0.1:9/v1"), "--base-url is set by evalsup serve"),
    (("--api-key-env", "OTHER_KEY"), "--api-key-env is set by evalsup serve"),
    (("--max-concurrency", "8"), "--max-concurrency is set by evalsup serve"),
    (("--json",), "--json is set by evalsup serve"),
    (("--quiet",), "--quiet is set by evalsup serve"),
    (("--no-check",), "--check/--no-check is set by evalsup serve"),
    (("--fresh",), "--fresh cannot go to a batch's run"),
    (("--resume",), "--resume cannot go to a batch's run"),
    (("--retry-failed",), "--retry-failed cannot go to a batch's run"),
    (("--shard", "0/2"), "--shard cannot go to a batch's run"),
    (("--ray", "--shards", "2"), "cannot go to a batch's run"),
    (("--metrics-port", "9100"), "--metrics-port cannot go to a batch's run"),
]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(("run_args", "said"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_bad_run_option_is_refused_at_the_start(tmp_path: Path, start: Callable[..., Run], mock: MockThread,
                                                  run_args: tuple[str, ...], said: str) -> None:
    port, data = free_port(), tmp_path / "data"
    p = start("serve", "--upstream", mock.url, "--data", str(data), "--port", str(port), "--", *run_args)
    assert p.finish() == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evalsup: after --: ") and said in lines[0], p.stderr
    assert "Traceback" not in p.stderr and "listening" not in p.stderr
    assert not listening(port)
    assert not data.exists()  # nothing made: the check comes before --data is touched


def test_a_good_run_option_starts_and_reaches_the_runs(tmp_path: Path, start: Callable[..., Run],
                                                       mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--", "--max-tokens", "16")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(3))), purpose="batch")
    b = wait_ended(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h").id, p)
    assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 3
    assert (recorded_settings(tmp_path / "data" / "runs" / b.id / "run") or {}).get("max_tokens") == 16
    p.signal(signal.SIGTERM)
    assert p.finish() == 0


def test_a_refused_run_option_from_the_environment_or_a_config_file_is_refused_too(
        tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    """serve's own options come last on each run's command line and win; a refused one (--fresh: a restarted
    batch would start over and pay again) does not, so it is refused wherever it comes from."""
    port, data = free_port(), tmp_path / "data"
    p = start("serve", "--upstream", mock.url, "--data", str(data), "--port", str(port), env={"EVALSUP_FRESH": "1"})
    assert p.finish() == 2
    assert "EVALSUP_FRESH in serve's environment" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not listening(port) and not data.exists()
    conf = tmp_path / "run.toml"
    conf.write_text("fresh = true\n")
    p = start("serve", "--upstream", mock.url, "--data", str(data), "--port", str(port), "--", "--config", str(conf))
    assert p.finish() == 2
    assert "--config sets fresh" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not listening(port) and not data.exists()
