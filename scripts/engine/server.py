"""Find and run a real engine: Hugging Face `transformers serve --continuous-batching` with the tiny local model.

Used by ``scripts/bench_engine.py`` and ``tests/slow/test_real_engine.py``. Standard library only (it runs under
evalsup's venv; the engine has its own, built by ``scripts/engine-venv``, since torch must not go into
evalsup's).

Where the engine is:

* ``EVALSUP_ENGINE_PYTHON``: the python of a venv with ``transformers[serving]`` (else ``.engine/venv/bin/python``
  in the repository, where ``scripts/engine-venv`` puts it);
* ``EVALSUP_ENGINE_MODEL``: the tiny model's directory (else ``.engine/model``); when missing it is built (a few
  seconds) with ``build_tiny_model.py`` by that python.

The server listens on 127.0.0.1 only, runs in its own session (so it and anything it starts can be ended as a
group) and is ended by its process-group id: SIGTERM, then SIGKILL if it has not gone within 15 s.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_DIR = ROOT / ".engine"
BUILD = Path(__file__).resolve().parent / "build_tiny_model.py"
FLAGS = ("--continuous-batching", "--device", "cpu", "--host", "127.0.0.1")
# The paged KV cache sized by hand. Left to itself on CPU, transformers sizes it from the machine's memory (60-90 %
# of it): here an 11 GB process whose first generation took 17 s (allocating the cache and its attention masks)
# and whose steps were slower (1,000 tasks at -c 64: 8.7 s against 6.1 s with these; 0.7 GB). 2,048 blocks of 32
# tokens hold ~1,000 requests of ~50 tokens; 1,024 tokens a step (256 was slower: prefill-bound).
CB_FLAGS = ("--cb-block-size", "32", "--cb-num-blocks", "2048", "--cb-max-batch-tokens", "1024")


def engine_python() -> Path | None:
    p = os.environ.get("EVALSUP_ENGINE_PYTHON")
    cand = Path(p) if p else DEFAULT_DIR / "venv" / "bin" / "python"
    return cand if cand.exists() else None


def engine_model() -> Path:
    p = os.environ.get("EVALSUP_ENGINE_MODEL")
    return Path(p) if p else DEFAULT_DIR / "model"


def _wait_for_build(timeout_s: float = 600.0) -> str | None:
    """scripts/test builds the engine in the background in CI (``.engine/building`` holds the builder's pid,
    ``.engine/build.rc`` its exit code once done): wait for it while it runs. The reason it failed, or None."""
    marker, rc = DEFAULT_DIR / "building", DEFAULT_DIR / "build.rc"
    if not marker.exists():
        return None
    try:
        pid = int(marker.read_text().strip())
    except ValueError:
        pid = 0
    deadline = time.monotonic() + timeout_s
    while not rc.exists() and _alive(pid) and time.monotonic() < deadline:
        time.sleep(1.0)
    if not rc.exists():
        return f"scripts/engine-venv did not finish (see {DEFAULT_DIR / 'build.log'})"
    if rc.read_text().strip() != "0":
        log = (DEFAULT_DIR / "build.log").read_text(errors="replace").strip().splitlines() or ["?"]
        return f"scripts/engine-venv failed (exit {rc.read_text().strip()}): {log[-1]}"
    return None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: is it there
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_engine() -> tuple[Path, Path] | str:
    """(python, model dir), building the model if needed; or the reason there is no engine."""
    if not os.environ.get("EVALSUP_ENGINE_PYTHON") and (why := _wait_for_build()) is not None:
        return why
    py = engine_python()
    if py is None:
        where = os.environ.get("EVALSUP_ENGINE_PYTHON") or str(DEFAULT_DIR / "venv" / "bin" / "python")
        return f"no engine python at {where} (build it with scripts/engine-venv, or set EVALSUP_ENGINE_PYTHON)"
    # find_spec, not import: importing torch alone takes seconds
    code = ("import importlib.util as u, sys; sys.exit(' '.join(m for m in ('torch', 'transformers', 'fastapi', "
            "'uvicorn', 'openai') if u.find_spec(m) is None) or None)")
    probe = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"{py} cannot run transformers serve: no {probe.stderr.strip() or 'python'} there"
    model = engine_model()
    built = subprocess.run([str(py), str(BUILD), str(model)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if built.returncode != 0:
        last = (built.stderr.strip().splitlines() or ["?"])[-1]
        return f"could not build the tiny model in {model}: {last}"
    return py, model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def chat(base: str, model: str, content: str, max_tokens: int = 4, timeout: float = 300) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class EngineServer:
    """``transformers serve`` with the model preloaded, on a free port of 127.0.0.1; warmed up on entry (the first
    generation starts the continuous-batching manager, which takes seconds)."""

    def __init__(self, python: Path, model: Path, log: IO[bytes] | None = None, extra: tuple[str, ...] = (),
                 port: int | None = None) -> None:
        self.python, self.model, self.log, self.extra = python, model, log, extra
        self.port = port or free_port()
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = self.root + "/v1"
        self.model_id = str(model)  # transformers serve names a preloaded local model by its path
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0
        self.warmup_s = 0.0

    def cmd(self) -> list[str]:
        cli = self.python.parent / "transformers"
        return [str(cli), "serve", *FLAGS, *CB_FLAGS, "--port", str(self.port), *self.extra, str(self.model)]

    def start(self, timeout: float = 180) -> EngineServer:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd(), stdout=self.log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited {self.proc.returncode} while starting")
            try:
                if _get(self.root + "/health", timeout=2).get("status") == "ok":
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve not up within {timeout:.0f} s")
            time.sleep(0.25)
        self.startup_s = time.monotonic() - t0
        t1 = time.monotonic()
        chat(self.root, self.model_id, "warm up", max_tokens=2, timeout=timeout)
        self.warmup_s = time.monotonic() - t1
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        pgid = proc.pid  # its own session: the group id is its pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> EngineServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
