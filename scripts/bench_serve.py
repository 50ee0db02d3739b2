#!/usr/bin/env python3
"""Benchmark of `evalsup serve` (issue 42): one N-line batch through the server (upload, create, poll, download
with the openai SDK) against the same file through `evalsup run`, both on the same mock (ratio of the wall
times), and the server process's own RSS (its runs are children, measured apart) while it receives a large upload
and while its batch runs. Offline, against the project's mock on 127.0.0.1.

    scripts/bench_serve.py                    # the issue's figures: 100,000 lines, a 190 MB upload
    scripts/bench_serve.py -n 5000 --upload-mb 20
    scripts/bench_serve.py --lone -n 3000     # a lone batch on a slow mock: its fixed share against the live one

``--lone``: one batch alone on a mock answering in --latency-ms, through `evalsup serve --concurrency C
--max-running-batches 4`, twice in one invocation: with the fixed share serve gave a run before the live ceilings
(C / 4, passed as the run's own `-- --concurrency`, which then caps its ceiling; serve refuses
`--max-concurrency` after `--` since it sets it itself) and with the live share (all of
C, lent while no other batch runs). Wall times from create to the output file, their ratio, and the most
requests the mock held at once each time.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    return e | {"PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "sk-bench"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def batch_file(path: Path, n: int, pad: int = 0) -> Path:
    with open(path, "wb") as f:
        for i in range(n):
            body = {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i} " + "x" * pad}]}
            f.write(orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                                  "body": body}) + b"\n")
    return path


class Peak:
    """The peak RSS of one process, sampled every 20 ms while in a ``with``."""

    def __init__(self, pid: int) -> None:
        self.p, self.mb, self._stop = psutil.Process(pid), 0.0, threading.Event()

    def __enter__(self) -> Peak:
        def sample() -> None:
            while not self._stop.wait(0.02):
                self.mb = max(self.mb, self.p.memory_info().rss / 1e6)

        self._t = threading.Thread(target=sample, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def serve_up(upstream: str, data: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "evalsup", "serve", "--upstream", upstream, "--data", str(data),
                               "--port", str(port), *extra], env=env(), stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return server, f"http://127.0.0.1:{port}/v1"
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"bench_serve: evalsup serve {' '.join(extra)} did not come up (exit {server.wait()})")


def batch_through(c: Any, file_id: str, poll_s: float) -> tuple[Any, bytes]:
    """A chat batch of ``file_id`` created, waited for (polled every ``poll_s``), and its output file's bytes."""
    b = c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    while (b := c.batches.retrieve(b.id)).status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(poll_s)
    return b, c.files.content(b.output_file_id or "").content


def mock_stats(mport: int, reset: bool = False) -> dict[str, object]:
    if reset:
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{mport}/_mock/reset", method="POST"))
        return {}
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/_mock/stats") as r:
        return dict(orjson.loads(r.read()))


def lone(a: argparse.Namespace) -> None:
    """A lone batch's wall time with the fixed share against the live one (see the module's doc)."""
    import openai

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        d = Path(tmp)
        mport = free_port()
        mock = subprocess.Popen([sys.executable, "-m", "evalsup", "mock", "--port", str(mport), "--latency-ms",
                                 str(a.latency_ms)], env=env(), stderr=subprocess.DEVNULL)
        time.sleep(2)
        tasks = batch_file(d / "tasks.jsonl", a.n)
        got = []
        try:
            # serve sets each run's --max-concurrency itself (and refuses it after --): a run fixed at the old share
            for name, extra in (("fixed share", ("--", "--concurrency", str(max(1, a.concurrency // 4)))),
                                ("live share", ())):
                server, base = serve_up(f"http://127.0.0.1:{mport}/v1", d / name.replace(" ", "-"), "--concurrency",
                                        str(a.concurrency), "--max-running-batches", "4", *extra)
                try:
                    c = openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=600)
                    f = c.files.create(file=("tasks.jsonl", io.BytesIO(tasks.read_bytes())), purpose="batch")
                    mock_stats(mport, reset=True)
                    t = time.monotonic()
                    b, out = batch_through(c, f.id, 0.2)
                    wall = time.monotonic() - t
                    assert b.status == "completed" and out.count(b"\n") == a.n, b
                    got.append((name, wall, mock_stats(mport)["max_in_flight"]))
                finally:
                    server.terminate()
                    server.wait(60)
        finally:
            mock.terminate()
            mock.wait(10)
    print(f"a lone {a.n:,}-line batch, mock at {a.latency_ms:g} ms, serve --concurrency {a.concurrency} "
          "--max-running-batches 4:")
    for name, wall, held in got:
        print(f"  {name}: {wall:.1f} s, at most {held} in flight at the mock")
    print(f"  ratio live / fixed: {got[1][1] / got[0][1]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--upload-mb", type=float, default=190.0)
    ap.add_argument("--lone", action="store_true", help="a lone batch: its fixed share against the live one")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="--lone: the mock's latency")
    ap.add_argument("--concurrency", type=int, default=256, help="--lone: serve's --concurrency")
    a = ap.parse_args()
    if a.lone:
        lone(a)
        return
    import openai

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        d = Path(tmp)
        mport = free_port()
        mock = subprocess.Popen([sys.executable, "-m", "evalsup", "mock", "--port", str(mport)], env=env(),
                                stderr=subprocess.DEVNULL)
        time.sleep(2)
        upstream = f"http://127.0.0.1:{mport}/v1"
        tasks = batch_file(d / "tasks.jsonl", a.n)
        t = time.monotonic()
        subprocess.run([sys.executable, "-m", "evalsup", "run", str(tasks), "--out", str(d / "run"), "--base-url",
                        upstream, "--quiet"], env=env(), check=True, capture_output=True)
        run_s = time.monotonic() - t
        server, base = serve_up(upstream, d / "data", "--max-running-batches", "1")
        try:
            c = openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=600)
            idle = psutil.Process(server.pid).memory_info().rss / 1e6
            pad = 2000
            big = batch_file(d / "big.jsonl", int(a.upload_mb * 1e6 / (pad + 120)), pad)
            big_mb = big.stat().st_size / 1e6
            with Peak(server.pid) as up, open(big, "rb") as fh:
                t = time.monotonic()
                c.files.create(file=("big.jsonl", fh), purpose="batch")
                up_s = time.monotonic() - t
            t = time.monotonic()
            f = c.files.create(file=("tasks.jsonl", io.BytesIO(tasks.read_bytes())), purpose="batch")
            with Peak(server.pid) as during:
                b, out = batch_through(c, f.id, 0.5)
            serve_s = time.monotonic() - t
            assert b.status == "completed" and out.count(b"\n") == a.n, b
        finally:
            server.terminate()
            server.wait(60)
            mock.terminate()
            mock.wait(10)
    print(f"{a.n:,} lines: evalsup run {run_s:.1f} s, through serve (upload, run, download) {serve_s:.1f} s: "
          f"ratio {serve_s / run_s:.2f}")
    print(f"server RSS: idle {idle:.0f} MB, peak {up.mb:.0f} MB during a {big_mb:.0f} MB upload "
          f"({up_s:.1f} s), peak {during.mb:.0f} MB while its batch ran")


if __name__ == "__main__":
    main()
