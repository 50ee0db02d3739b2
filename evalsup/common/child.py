"""Run an evalsup command in a child process and follow it: the Python API's run (evalsup.api.run) and each
shard on Ray (evalsup.ray) start `python -m evalsup run ...` this way, exactly as the CLI runs it.

The child's output goes to files, not pipes; it gets SIGTERM when its caller dies (so it drains and checkpoints
instead of going on unwatched) and SIGINT when the caller is interrupted; its last stderr lines are kept for the
one-line message a failure raises.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson


def _tail(path: Path, keep: collections.deque[str], echo: bool, done: threading.Event) -> None:
    """Follow the run's stderr file line by line until the run has ended and every line is read."""
    with open(path, "rb") as f:
        part = b""
        while True:
            chunk = f.readline()
            if chunk:
                part += chunk
                if not part.endswith(b"\n"):
                    continue
                line = part.decode("utf-8", "replace")
                part = b""
                keep.append(line.rstrip("\n"))
                if echo:
                    sys.stderr.write(line)
                    sys.stderr.flush()
            elif done.is_set():
                if part:
                    keep.append(part.decode("utf-8", "replace"))
                return
            else:
                done.wait(0.1)


def run_child(cmd: list[str], stdin: bool, tmp: Path, progress: bool, env: dict[str, str] | None = None
               ) -> tuple[int, dict[str, Any] | None, collections.deque[str]]:
    """Run ``cmd`` (an `evalsup run`) to its end; its exit code, --json summary and last stderr lines.

    Its output goes to files, not pipes: a run whose caller died (SIGTERM from die_with_parent) must still be
    able to write its log lines while it drains. Its own session: a Ctrl-C at a terminal reaches it once,
    through us, as SIGINT (it stops at once and checkpoints), and then KeyboardInterrupt is raised here."""
    err_path, out_path = tmp / "stderr", tmp / "stdout"
    with open(err_path, "wb") as err_f, open(out_path, "wb") as out_f:
        proc = subprocess.Popen(cmd, stdin=None if stdin else subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                env={**child_env(), **(env or {})}, start_new_session=True,
                                preexec_fn=die_with_parent if sys.platform == "linux" else None)
    err_lines: collections.deque[str] = collections.deque(maxlen=200)
    done = threading.Event()
    tail = threading.Thread(target=_tail, args=(err_path, err_lines, progress, done), daemon=True)
    tail.start()
    interrupted = False
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:  # stop the run resumably: it checkpoints and exits
            interrupted = True
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
    done.set()
    tail.join()
    if interrupted:
        raise KeyboardInterrupt
    try:
        summary = orjson.loads(out_path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        summary = None
    return code, summary if isinstance(summary, dict) else None, err_lines


def last_message(lines: Iterable[str]) -> str:
    """The CLI's message: its last ``evalsup: ...`` line (or click's ``Error: ...``), with the indented lines
    that end the output right after it (a refused resume's changed settings, one a line)."""
    tail: list[str] = []
    at_end = True  # still among the indented lines that end the output
    for line in reversed(list(lines)):
        if line.startswith("evalsup: "):
            return "\n".join([line[len("evalsup: "):], *reversed(tail)])
        at_end = at_end and line.startswith("  ")
        if at_end:
            tail.append(line)
            continue
        tail = []
        if line.startswith("Error: "):
            return line[len("Error: "):]
        if line.startswith("{") and '"msg"' in line:  # --log-format json
            try:
                return str(orjson.loads(line)["msg"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
    return ""


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when this process dies (a killed notebook kernel, a kill -9), so
    the run drains and checkpoints instead of going on unwatched; a later call resumes it. (Linux may send it
    twice, from each of a multi-threaded caller's dying threads in turn: then the run stops at once, 143,
    checkpointed all the same.)"""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def child_env() -> dict[str, str]:
    """The caller's environment, with this evalsup importable in the child (a source tree as much as a wheel)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
