"""Watching a run tells the truth (issue 23): in flight is requests on the wire, the rate exists from the first
line, totals follow the file, `evalsup status` says why and from one source (also over shard directories),
and the report has what users look at first. Real processes and HTTP against the mock; the report rendered
in headless Chromium when one is installed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockThread
from tests.harness import Run, read_results, run_cli, wait_until, write_tasks


def status_json(path: Path) -> dict[str, Any]:
    r = run_cli("status", "--json", str(path))
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = orjson.loads(r.stdout)
    return out


def results_count(run_dir: Path) -> int:
    try:
        return (run_dir / "results.jsonl").read_bytes().count(b"\n")
    except OSError:
        return 0


# --------------------------------------------------------------------------------------- the live figures


def test_in_flight_counts_requests_on_the_wire_and_the_rate_starts_at_once(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 160, extra={"mock": {"delay_s": 0.1}})  # ~4 s at 4 in flight
    r = run_cli("run", "-w", "1", "-c", "4", "--window", "40", "--model", "mock-model", "--base-url", mock.url,
                "--log-format", "json", "--log-interval", "0.5", str(tasks))
    assert r.returncode == 0, r.stderr
    lines = [orjson.loads(x)["progress"] for x in r.stderr.splitlines() if x.startswith("{") and '"progress"' in x]
    assert len(lines) >= 3, r.stderr
    # the worker holds up to 40 tasks; only 4 are requests at the endpoint, which is what "in flight" says
    assert max(p["inflight"] for p in lines) <= 4 < max(p["queued"] + p["inflight"] for p in lines), lines
    assert max(p["inflight"] for p in lines) > 0, lines
    assert mock.stats()["max_in_flight"] <= 4
    for p in lines:
        if p["done"]:  # from the first line with a result on: a rate and an ETA (the window starts at the start)
            assert p["rate"] > 0 and p["eta_s"] is not None, p
        assert p["total"] == 160 and p["done"] <= p["total"], p


def test_plain_progress_labels_the_eta(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 120, extra={"mock": {"delay_s": 0.05}})
    r = run_cli("run", "-w", "1", "-c", "4", "--model", "mock-model", "--base-url", mock.url, "--log-interval", "0.5",
                str(tasks))
    assert r.returncode == 0, r.stderr
    first = re.search(r"^evalsup: running: .*$", r.stderr, re.M)
    assert first, r.stderr
    assert re.search(r"req/s, ETA (\d+s|\?), \d+ in flight( \(limit \d+\))?, \d+ queued in workers",
                     first.group(0)), first.group(0)


# --------------------------------------------------------------------------------------- status


def test_status_running_then_stopped_by_sigterm(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    objs = [{"id": f"t{i}", "prompt": f"q{i}", "mock": {"delay_s": 0.1, **({"status": 400} if i % 10 == 3 else {})}}
            for i in range(400)]
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
    run_dir = tmp_path / "t.run"
    proc = start("run", "-w", "2", "-c", "4", "--window", "24", "--model", "mock-model", "--base-url", mock.url,
                 "--quiet", str(tasks))
    try:
        # the rate comes from the checkpoint's history: wait for three checkpoints with results between them
        def history() -> int:
            try:
                cp = orjson.loads((run_dir / "checkpoint.json").read_bytes())
            except (OSError, orjson.JSONDecodeError):
                return 0
            return len({d for _, d in cp["counters"].get("history", [])})
        wait_until(lambda: history() >= 3, "three checkpoints with progress between them", 30)
        (run_dir / "run.json").write_bytes(orjson.dumps({"settings": {"model": "mock-model", "max_tokens": 64,
                                                                      "api_key": "sk-must-not-show"}}))
        s = status_json(run_dir)
        assert proc.running(), "the run ended before status was checked: make it slower"
        assert s["state"] == "running" and s["rate"] > 0 and s["eta_s"] is not None, s
        # the input is not all read yet, but the pre-scan counted every line: the total is exact (issue 44)
        assert s["total"] == 400 and s["total_estimated"] is False, s
        assert s["settings"]["model"] == "mock-model" and "sk-must-not-show" not in orjson.dumps(s).decode()
        # -c 4: the limit is the fixed concurrency, the requests on the wire never more
        assert s["concurrency_limit"] == 4 and 0 <= s["in_flight"] <= 4, s
        text = run_cli("status", str(run_dir)).stdout
        assert "ETA" in text and "model=mock-model" in text and "sk-must-not-show" not in text, text
        assert re.search(r"in flight\s+\d requests, limit 4", text), text
        proc.signal(signal.SIGTERM)
    finally:
        proc.communicate()
    assert proc.returncode in (0, 75), proc.returncode  # 75: the resumable stop of issue 19, when it lands
    s = status_json(run_dir)
    recs = read_results(run_dir)
    assert s["state"] == "stopped" and "SIGTERM" in s["why"] and "resume" in s["why"], s
    # one source: the same figures as the file
    assert s["done"] == len(recs) and s["failed"] == sum(r["error"] is not None for r in recs), s
    assert s["ok"] + s["failed"] == s["done"] and s["failed"] > 0
    # drained: the requests in flight finished; the tasks queued in workers came back (outstanding, for the
    # rerun); the rest is unread input
    assert s["input_line"] == s["done"] + s["outstanding"] < 400, s
    text = run_cli("status", str(run_dir)).stdout
    assert "stopped (stopped by SIGTERM" in text and re.search(rf"done\s+{s['done']} of 400\b", text), text


def test_status_of_a_killed_run_counts_what_is_on_disk(tmp_path: Path, mock: MockThread,
                                                       start: Callable[..., Run]) -> None:
    slow = {f"t{i}" for i in range(5, 400, 20)}  # these take a minute: outstanding when the run is killed
    objs = [{"id": f"t{i}", "prompt": "q", "mock": {"delay_s": 60 if f"t{i}" in slow else 0.02}} for i in range(400)]
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
    run_dir = tmp_path / "t.run"
    proc = start("run", "-w", "1", "-c", "8", "--model", "mock-model", "--base-url", mock.url, "--quiet", str(tasks))

    def slow_in_checkpoint() -> bool:
        try:
            cp = orjson.loads((run_dir / "checkpoint.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return False
        return cp["succeeded"] >= 50 and any(o[2] in slow for o in cp["outstanding"])
    try:
        wait_until(slow_in_checkpoint, "a checkpoint with results and slow tasks outstanding", 30)
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor only: its workers see their pipes close
    finally:
        proc.communicate()
    lines = (run_dir / "results.jsonl").read_bytes().split(b"\n")[:-1]  # complete lines (a torn one is not done)
    s = status_json(run_dir)
    assert s["state"] == "stopped" and "killed" in s["why"], s
    assert s["done"] == len(lines) and s["ok"] == len(lines), (s["done"], len(lines))  # the checkpoint + the tail
    assert s["outstanding"] > 0 and s["input_line"] >= s["done"] + s["outstanding"], s
    assert set(s["outstanding_ids"]) & slow, s
    done_ids = {orjson.loads(x)["custom_id"] for x in lines}
    assert s["outstanding_ids"] and not set(s["outstanding_ids"]) & done_ids, s
    assert s["outstanding"] == len(s["outstanding_ids"]) or len(s["outstanding_ids"]) == 10, s
    text = run_cli("status", str(run_dir)).stdout
    assert s["outstanding_ids"][0] in text and f"outstanding {s['outstanding']:,} " in text, text


def test_status_of_a_sharded_parent(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 90)
    parent = tmp_path / "t.run"
    for k in (0, 2):
        r = run_cli("run", "-w", "1", "-c", "8", "--model", "mock-model", "--base-url", mock.url, "--quiet",
                    "--shard", f"{k}/3", str(tasks))
        assert r.returncode == 0, r.stderr
    shutil.copytree(parent / "shard-0-of-3", parent / "shard-1-of-3.old-20250101-000000")  # moved aside: ignored
    s = status_json(parent)
    (g,) = s["groups"]
    assert [r["shard"] for r in g["rows"]] == ["shard-0-of-3", "shard-2-of-3"], g
    assert all(r["state"] == "finished" and r["done"] == 30 for r in g["rows"]), g
    assert g["missing"] == ["shard-1-of-3"] and g["total"]["done"] == 60 and g["total"]["finished"] == 2, g
    text = run_cli("status", str(parent)).stdout
    assert re.search(r"shard-0-of-3\s+finished\s+30\s+0", text) and re.search(r"total\s+60\s+0", text), text
    assert "missing     1 of 3: shard-1-of-3" in text and ".old-" not in text, text
    assert "no checkpoint" not in text


# --------------------------------------------------------------------------------------- the CLI


# --------------------------------------------------------------------------------------- the report


def test_report_has_the_sections_and_renders_in_chromium(tmp_path: Path, mock: MockThread,
                                                         start: Callable[..., Run]) -> None:
    objs = []
    for i in range(400):
        m: dict[str, Any] = {"delay_s": 0.03, **({"status": 400} if i % 25 == 1 else {})}
        # every fourth answer is cut at max_tokens (finish_reason "length"); the mock's answers are longer than 2
        body = {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}], "mock": m,
                "max_tokens": 2 if i % 4 == 0 else 100_000}
        objs.append({"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
    run_dir = tmp_path / "t.run"
    args = ["run", "-w", "1", "-c", "8", "--stream", "--base-url", mock.url, "--monitor-interval", "0.1", "--quiet",
            str(tasks)]
    proc = start(*args)
    try:
        wait_until(lambda: results_count(run_dir) >= 60, "60 results", 30)
        proc.signal(signal.SIGTERM)
    finally:
        proc.communicate()
    assert proc.returncode in (0, 75), proc.returncode
    r = run_cli(*args)  # the second session
    assert r.returncode == 0, r.stderr
    (run_dir / "run.json").write_bytes(orjson.dumps({"settings": {"model": "mock-model", "stream": True}}))
    r = run_cli("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    page = (run_dir / "report.html").read_text()
    recs = read_results(run_dir)
    cut = sum(1 for x in recs if x["error"] is None
              and x["response"]["body"]["choices"][0]["finish_reason"] == "length")
    assert cut == 100 - 4  # every fourth, less those that failed (i % 25 == 1 and i % 4 == 0: 4 of them)
    assert f"{cut:,} answer(s) of {sum(x['error'] is None for x in recs):,}" in page
    for section in ("settings", "sessions", "finish-reasons", "failed-tasks", "slowest-tasks"):
        assert f'<table class="t" id="{section}">' in page, section
    for chart in ("rate-chart", "tokens-chart", "errors-chart", "latency-chart", "ttft-chart", "itl-chart",
                  "output-length-chart", "memory-chart", "concurrency-chart"):
        assert f'<svg id="{chart}"' in page, chart
    conc = re.search(r'<svg id="concurrency-chart".*?</svg>', page, re.S)
    assert conc and conc.group(0).count('class="series limit"') == 2, "the limit, one line a session"
    sessions = re.search(r'<table class="t" id="sessions">(.*?)</table>', page, re.S)
    assert sessions and sessions.group(1).count("<tr>") == 3, "a header and two sessions"
    assert "stopped by SIGTERM" in sessions.group(1) and "finished" in sessions.group(1)
    assert "throughput, whole run" in page and "http_400" in page
    failed = re.search(r'<table class="t" id="failed-tasks">(.*?)</table>', page, re.S)
    assert failed and failed.group(1).count("<tr>") == 1 + 16 and "http_400" in failed.group(1)  # 16 failed
    rate = re.search(r'<svg id="rate-chart".*?</svg>', page, re.S)
    assert rate and rate.group(0).count('class="series rate"') == 2, "one line a session, none across the gap"
    assert 'class="gap"' in rate.group(0)
    assert page.count('class="pct-label"') >= 3 and "<script" not in page and "http://" not in page

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium binary on PATH: cannot check that report.html renders (apt-get install chromium)")
    png = tmp_path / "report.png"
    shot = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={png}",
                           "--window-size=1300,4000", (run_dir / "report.html").resolve().as_uri()],
                          capture_output=True, text=True, timeout=90)
    assert png.exists() and png.stat().st_size > 50_000, shot.stderr[-2000:]
    keep = os.environ.get("EVALSUP_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(png, keep)


def test_status_says_since_when_the_endpoint_is_down(tmp_path: Path, mock: MockThread,
                                                     start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 400, extra={"mock": {"delay_s": 0.05}})
    run_dir = tmp_path / "t.run"
    proc = start("run", "-w", "1", "-c", "8", "--max-attempts", "3", "--model", "mock-model", "--base-url", mock.url,
                 "--quiet", str(tasks))
    try:
        wait_until(lambda: results_count(run_dir) >= 20, "20 results", 30)
        mock.configure(down=True)

        def opened() -> bool:
            try:
                return b'"breaker_open"' in (run_dir / "events.jsonl").read_bytes()
            except OSError:
                return False
        wait_until(opened, "the breaker to open", 30)
        s = status_json(run_dir)
        assert s["state"] == "running" and s["why"].startswith("waiting for the endpoint: down since "), s
        text = run_cli("status", str(run_dir)).stdout
        assert "running (waiting for the endpoint: down since" in text, text
        mock.configure(down=False)
    finally:
        proc.communicate(120)
    assert proc.returncode == 0
    assert status_json(run_dir)["state"] == "finished"
