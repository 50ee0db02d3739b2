"""Observability end to end: progress off and on a terminal, `evalsup status`, /metrics, JSON logs, the report.

Real processes, real pipes and pseudo-terminals, real HTTP against the mock on 127.0.0.1, a real headless
Chromium for the report (skipped when none is installed).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import shutil
import socket
import struct
import subprocess
import termios
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import ROOT, Run, read_results, run_cli, wait_until, write_tasks

MIB = 1 << 20
GIB = 1 << 30
PROGRESS = re.compile(r"^evalsup: running: ([\d,]+)/300 \([\d.]+%\) done, [\d.]+ req/s", re.M)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][AB0-2]|\r")


def slow_tasks(path: Path, n: int, delay_s: float) -> Path:
    return write_tasks(path, n, extra={"mock": {"delay_s": delay_s}})


def run_args(mock: MockThread, tasks: Path, *extra: str) -> list[str]:
    return ["run", "-w", "2", "-c", "8", "--model", "mock-model", "--base-url", mock.url, *extra, str(tasks)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------- progress, off a tty


def test_plain_progress_lines_off_a_terminal(tmp_path: Path, mock: MockThread) -> None:
    tasks = slow_tasks(tmp_path / "t.jsonl", 300, 0.05)  # ~2 s at 8 in flight
    r = run_cli(*run_args(mock, tasks, "--log-interval", "0.5"))
    assert r.returncode == 0, r.stderr
    done = [int(x.replace(",", "")) for x in PROGRESS.findall(r.stderr)]
    assert len(done) >= 2, r.stderr
    assert done == sorted(done) and done[-1] <= 300
    assert "\x1b[" not in r.stderr, "terminal control codes written to a pipe"
    assert "300 done: 300 ok" in r.stdout  # the table
    assert "Traceback" not in r.stderr


def test_quiet_prints_one_line(tmp_path: Path, mock: MockThread) -> None:
    tasks = slow_tasks(tmp_path / "t.jsonl", 300, 0.02)
    r = run_cli(*run_args(mock, tasks, "--log-interval", "0.2", "--quiet"))
    assert r.returncode == 0, r.stderr
    assert "req/s" not in r.stderr and "done" not in r.stderr, r.stderr
    assert r.stderr.strip() == "", r.stderr
    assert len(r.stdout.splitlines()) == 1, r.stdout  # no table
    assert re.fullmatch(r"evalsup: finished: 300 done \(300 ok, 0 failed\), 300 this session in [\d.]+s "
                        r"\([\d.,]+ req/s\) -> .*t\.run/results\.jsonl\n", r.stdout), r.stdout


def test_json_prints_the_summary_on_stdout(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 200)
    r = run_cli(*run_args(mock, tasks, "--json"))
    assert r.returncode == 0, r.stderr
    printed = orjson.loads(r.stdout)  # the whole of stdout is one JSON document: no table
    assert printed == orjson.loads((tmp_path / "t.run" / "summary.json").read_bytes())
    assert printed["total"] == printed["succeeded"] == 200 and printed["finished"] is True


# --------------------------------------------------------------------------------------- progress, on a tty


def run_in_pty(start: Callable[..., Run], args: tuple[str, ...], timeout: float = 30) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin, stdout and stderr; return its exit code and what it drew."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 150, 0, 0))
    env = {"TERM": "xterm-256color", "COLUMNS": "150", "LINES": "40"}
    proc = start(*args, env=env, tty=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave side has closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.communicate(timeout)
        rc = proc.returncode
        assert rc is not None
    finally:
        proc.cleanup()
        reader.join(10)
        os.close(master)
    return rc, b"".join(chunks).decode("utf-8", "replace")


def test_live_display_on_a_terminal(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    tasks = slow_tasks(tmp_path / "t.jsonl", 300, 0.03)  # ~1.2 s: a few refreshes of the live display
    rc, raw = run_in_pty(start, run_args(mock, tasks))
    text = ANSI.sub("", raw)
    assert rc == 0, text
    assert "Traceback" not in text, text
    assert "\x1b[" in raw, "no terminal control codes: the live display did not run"
    assert re.search(r"\d+/300", text) and re.search(r"[\d.]+ req/s", text), text
    assert "in flight" in text  # the health line under the bar
    assert "evalsup run" in text and "300 done: 300 ok" in text, text  # the final table
    assert "evalsup: running:" not in text, "plain progress lines on a terminal"


# --------------------------------------------------------------------------------------- evalsup status


def snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    out = {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}
    out["."] = (b"", d.stat().st_mtime_ns)
    return out


def test_status_of_a_running_then_finished_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    tasks = slow_tasks(tmp_path / "t.jsonl", 200, 0.1)  # ~5 s at 4 in flight
    run_dir = tmp_path / "t.run"
    proc = start(*["run", "-w", "2", "-c", "4", "--model", "mock-model", "--base-url", mock.url, "--quiet",
                  str(tasks)])
    try:
        # a checkpoint is written at the start; wait for it and for the first results after it
        results = run_dir / "results.jsonl"
        wait_until(lambda: (run_dir / "checkpoint.json").exists() and results.exists() and results.stat().st_size > 0,
                   "the first checkpoint and results", 15)
        r = run_cli("status", str(run_dir))
        assert r.returncode == 0, r.stderr
        assert f"{run_dir}: running" in r.stdout, r.stdout
        m = re.search(r"done\s+([\d,]+)", r.stdout)
        assert m, r.stdout
        done = int(m.group(1).replace(",", ""))
        with open(run_dir / "results.jsonl", "rb") as f:
            on_disk = sum(1 for _ in f)
        assert 0 < done <= on_disk < 200, (done, on_disk)  # never claims more than what is written
        assert proc.running(), "the run ended before status was checked: make it slower"
    finally:
        _, err = proc.communicate(30)
    assert proc.returncode == 0, err
    before = snapshot(run_dir)
    r = run_cli("status", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert f"{run_dir}: finished" in r.stdout and re.search(r"done\s+200 ", r.stdout), r.stdout
    assert snapshot(run_dir) == before, "evalsup status changed the run directory"


# --------------------------------------------------------------------------------------- Prometheus /metrics


def fake_cgroup(root: Path, current: int) -> Path:
    root.mkdir()
    files = {
        "cgroup.controllers": "cpuset cpu io memory pids\n",
        "memory.max": f"{GIB}\n",
        "memory.high": "max\n",
        "memory.current": f"{current}\n",
        "memory.stat": "anon 0\nfile 0\nactive_file 0\ninactive_file 0\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        "memory.pressure": "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                           "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def set_current(root: Path, value: int) -> None:
    tmp = root / "memory.current.tmp"
    tmp.write_text(f"{value}\n")
    os.replace(tmp, root / "memory.current")  # the probe never reads a half-written file


Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Scrape | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    return samples or None  # a reply cut short as the process exits is not a scrape


def value(sc: Scrape, name: str, **labels: str) -> float:
    return sc[(name, tuple(sorted(labels.items())))]


def by_name(sc: Scrape, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {lab: v for (n, lab), v in sc.items() if n == name}


def test_metrics_during_and_at_the_end_of_a_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    lines = []
    for i in range(400):
        obj: dict[str, Any] = {"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}],
                               "mock": {"delay_s": 0.04}}
        if i % 40 == 7:
            obj["mock"] = {"status": 400}  # fails at once: a failed record
        elif i % 40 == 21:
            obj["mock"] = {"status": 429, "retry_after": 0.05, "times": 1, "delay_s": 0.04}  # one retry
        lines.append(orjson.dumps(obj))
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(b"\n".join(lines) + b"\n")
    cg = fake_cgroup(tmp_path / "cgroup", 300 * MIB)
    port = free_port()
    proc = start(*run_args(mock, tasks, "--metrics-port", str(port), "--monitor-interval", "0.1", "--quiet",
                          "--worker-plugin", f"{ROOT / 'tests/plugins/obs_slow_exit.py'}:noop"),
                 env={"EVALSUP_CGROUP_ROOT": str(cg), "EVALSUP_TEST_EXIT_DELAY_S": "1.5"})
    scrapes: list[Scrape] = []
    try:
        while proc.running():
            sc = scrape(f"http://127.0.0.1:{port}/metrics")
            if sc is not None:
                scrapes.append(sc)
            time.sleep(0.05)
    finally:
        _, err = proc.communicate(30)
    assert proc.returncode == 0, err
    assert len(scrapes) >= 5, f"only {len(scrapes)} successful scrapes"
    last = scrapes[-1]
    names = {n for n, _ in last}
    for family in ("evalsup_tasks_total", "evalsup_tasks_in_flight", "evalsup_request_latency_seconds_count",
                   "evalsup_retries_total", "evalsup_worker_restarts_total", "evalsup_throttled",
                   "evalsup_worker_rss_bytes", "evalsup_cgroup_working_set_bytes", "evalsup_cgroup_limit_bytes"):
        assert family in names, f"{family} missing from /metrics"
    # during the run
    inflight = [value(s, "evalsup_tasks_in_flight") for s in scrapes]
    # requests on the wire: never more than --concurrency 8 (tasks queued in the workers are not counted)
    assert max(inflight) > 0 and max(inflight) <= 8 and min(inflight) >= 0, inflight
    rss = [by_name(s, "evalsup_worker_rss_bytes") for s in scrapes]
    assert any(len(r) == 2 for r in rss), rss
    assert all(5 * MIB < v < GIB for r in rss for v in r.values()), rss
    ticked = [s for s in scrapes if value(s, "evalsup_cgroup_working_set_bytes")]  # gauges set by the monitor
    assert len(ticked) >= 3
    assert {value(s, "evalsup_cgroup_working_set_bytes") for s in ticked} == {300 * MIB}
    assert {value(s, "evalsup_cgroup_limit_bytes") for s in ticked} == {GIB}
    assert {value(s, "evalsup_throttled") for s in scrapes} == {0}
    assert 8 in {value(s, "evalsup_concurrency_limit") for s in ticked}  # issue 21: -c 8, summed over 2 workers
    # and per endpoint (here one, labelled with its URL)
    assert 8 in {value(s, "evalsup_endpoint_concurrency_limit", endpoint=mock.url) for s in ticked}
    assert {value(s, "evalsup_endpoint_up", endpoint=mock.url) for s in ticked} == {1}
    totals = [value(s, "evalsup_tasks_total", outcome="succeeded") + value(s, "evalsup_tasks_total", outcome="failed")
              for s in scrapes]
    assert totals == sorted(totals) and len(set(totals)) > 1, totals  # seen during the run, not only after
    # at the end: the counters match the results file
    recs = read_results(tmp_path / "t.run")
    ok = sum(1 for r in recs if r["error"] is None)
    assert len(recs) == 400 and ok == 390
    assert value(last, "evalsup_tasks_total", outcome="succeeded") == ok
    assert value(last, "evalsup_tasks_total", outcome="failed") == 400 - ok
    assert value(last, "evalsup_request_latency_seconds_count") == 400
    assert value(last, "evalsup_request_latency_seconds_sum") == pytest.approx(
        sum(r["metrics"]["latency_s"] for r in recs), rel=0.01)
    # ten requests re-sent after a 429, which is flow control: no task used up a second attempt for it
    assert value(last, "evalsup_retries_total") == 10 and {r["metrics"]["attempts"] for r in recs} == {1}
    assert by_name(last, "evalsup_worker_restarts_total") == {(("cause", "crashed"),): 0, (("cause", "hung"),): 0}


# --------------------------------------------------------------------------------------- --log-format json

SECRET = "sk-obs-Zq8vT3xW9kLm2pRn"
PROMPT_MARK = "PLEASE-KEEP-THIS-PROMPT-PRIVATE"


def prompt_tasks(path: Path, n: int) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            obj: dict[str, Any] = {"id": f"t{i}", "messages": [{"role": "user", "content": f"{PROMPT_MARK} {i}"}]}
            if i % 50 == 3:
                obj["mock"] = {"status": 400}
            f.write(orjson.dumps(obj) + b"\n")
    return path


def json_lines(stderr: str) -> list[dict[str, Any]]:
    out = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AssertionError(f"not a JSON line on stderr: {line!r}") from None
        assert isinstance(obj, dict), line
        out.append(obj)
    return out


@pytest.fixture
def keyed_mock() -> Iterator[MockThread]:
    with MockThread(MockConfig(latency_ms=20, jitter_ms=5, seed=2, api_key=SECRET)) as m:
        yield m


def test_json_logs_carry_no_key_and_no_prompt(tmp_path: Path, keyed_mock: MockThread) -> None:
    tasks = prompt_tasks(tmp_path / "t.jsonl", 600)
    r = run_cli(*run_args(keyed_mock, tasks, "--log-format", "json", "--log-interval", "0.3",
                          "--max-tasks-per-worker", "100"), env={"OPENAI_API_KEY": SECRET})
    assert r.returncode == 0, r.stderr
    logs = json_lines(r.stderr)
    assert any("progress" in x for x in logs), logs  # progress lines, as objects
    assert any("recycling" in x.get("msg", "") for x in logs), logs  # and ordinary log lines
    assert SECRET not in r.stderr and SECRET not in r.stdout
    assert PROMPT_MARK not in r.stderr
    assert len(read_results(tmp_path / "t.run")) == 600


def test_json_logs_when_the_endpoint_check_fails(tmp_path: Path, keyed_mock: MockThread) -> None:
    tasks = prompt_tasks(tmp_path / "t.jsonl", 5)
    wrong = "sk-obs-wrong-key-Yh7Gf5Dd"
    r = run_cli(*run_args(keyed_mock, tasks, "--log-format", "json"), env={"OPENAI_API_KEY": wrong})
    assert r.returncode == 2, r.stderr
    assert wrong not in r.stderr and SECRET not in r.stderr
    logs = json_lines(r.stderr)
    assert logs, "no message at all about the failed check"


# --------------------------------------------------------------------------------------- the HTML report


def png_info(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of an 8-bit RGB/RGBA PNG: enough to tell a picture from a flat fill."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    assert len(raw) == stride * height
    return width, height, len({raw[i * stride:(i + 1) * stride] for i in range(height)})


def test_report_of_a_throttled_recycled_run_renders_in_chromium(tmp_path: Path, mock: MockThread,
                                                                start: Callable[..., Run]) -> None:
    cg = fake_cgroup(tmp_path / "cgroup", 300 * MIB)
    tasks = slow_tasks(tmp_path / "t.jsonl", 600, 0.01)
    run_dir = tmp_path / "t.run"
    proc = start(*run_args(mock, tasks, "--max-tasks-per-worker", "100", "--monitor-interval", "0.1", "--quiet"),
                 env={"EVALSUP_CGROUP_ROOT": str(cg)})

    def last_done() -> int:
        try:
            lines = (run_dir / "memory.jsonl").read_bytes().splitlines()
            return int(orjson.loads(lines[-1])["done"]) if lines else 0
        except (OSError, ValueError):
            return 0

    def events() -> list[str]:
        try:
            return [orjson.loads(x)["event"] for x in (run_dir / "events.jsonl").read_bytes().splitlines()]
        except OSError:
            return []

    try:
        wait_until(lambda: last_done() >= 100, "100 tasks done", 15)
        set_current(cg, int(0.92 * GIB))  # above the high mark (85%): pause
        wait_until(lambda: "pause" in events(), "the pause", 5)
        time.sleep(0.5)
        set_current(cg, int(0.5 * GIB))  # below the low mark (70%): resume
        wait_until(lambda: "resume" in events(), "the resume", 5)
    finally:
        _, err = proc.communicate(30)
    assert proc.returncode == 0, err
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["throttle"]["episodes"] == 1 and summary["recycles"]["tasks"] >= 1, summary

    r = run_cli("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    page = (run_dir / "report.html").read_text()
    for chart in ("memory-chart", "rate-chart", "latency-chart"):
        assert f'<svg id="{chart}"' in page, chart
    assert page.count('class="throttle"') >= 2  # the one episode, shaded on both time charts
    assert 'class="event recycle"' in page
    assert 'class="limit"' in page and 'class="high"' in page and 'class="low"' in page
    assert "http://" not in page and "https://" not in page, "the page refers to something online"
    assert "<script" not in page and "<link" not in page
    assert "600 (600 ok, 0 failed)" in page  # the header's figures
    other = tmp_path / "elsewhere.html"
    assert run_cli("report", str(run_dir), "-o", str(other)).returncode == 0 and other.read_text() == page

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium binary on PATH: cannot check that report.html renders (apt-get install chromium)")
    png = tmp_path / "report.png"
    shot = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", f"--screenshot={png}",
                           "--window-size=1400,1800", (run_dir / "report.html").resolve().as_uri()],
                          capture_output=True, text=True, timeout=60)
    assert png.exists(), shot.stderr[-2000:]
    assert png.stat().st_size > 20_000, png.stat().st_size
    width, height, distinct = png_info(png)
    assert (width, height) == (1400, 1800)
    assert distinct > 100, f"the screenshot is nearly flat ({distinct} distinct rows)"


def test_report_thins_long_runs_and_reads_torn_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "long.run"
    run_dir.mkdir()
    t0 = 1_700_000_000.0
    with open(run_dir / "memory.jsonl", "wb") as f:
        for i in range(10_000):
            f.write(orjson.dumps({"t": t0 + i, "supervisor_rss": 50 * MIB, "workers_rss": {"11": 40 * MIB + i},
                                  "working_set": 200 * MIB, "limit": None, "paused": 3000 <= i < 3100,
                                  "done": i * 10, "high": None, "low": None}) + b"\n")
        f.write(b'{"t": 1700010000.5, "supervis')  # a sample being written
    (run_dir / "events.jsonl").write_bytes(
        orjson.dumps({"t": t0 + 5000, "event": "restart", "cause": "crashed", "pid": 11, "exit": -9}) + b"\n")
    with open(run_dir / "results.jsonl", "wb") as f:
        for i in range(1000):
            f.write(orjson.dumps({"custom_id": f"t{i}", "error": None if i % 10 else {"code": "x"},
                                  "metrics": {"latency_s": 0.01 * (1 + i % 50)}}) + b"\n")
        f.write(b'{"custom_id": "torn"')
    r = run_cli("report", str(run_dir))  # no summary.json: a run that was killed
    assert r.returncode == 0, r.stderr
    page = (run_dir / "report.html").read_text()
    total = re.search(r'<polyline class="series total" points="([^"]+)"', page)
    assert total is not None
    assert 1000 <= len(total.group(1).split()) <= 2000
    assert page.count('class="throttle"') == 2 and 'class="event restart"' in page
    assert 'class="limit"' not in page  # no limit, no line
    assert len(re.findall(r'<rect class="bar ok"', page)) >= 5 and '<rect class="bar failed"' in page
    assert "No summary.json" in page
    bad = run_cli("report", str(tmp_path))
    assert bad.returncode == 1 and "not a run directory" in bad.stderr
