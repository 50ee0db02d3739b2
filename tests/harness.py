"""Starting evalsup and reading what a run leaves: task files, the CLI as a process (``run_cli``, the ``Run``
harness), results and summaries, and the runs the resume tests start from. Imported by test modules of every
tier (``from tests.harness import ...``); the fixtures built on it are in ``tests/conftest.py``."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil

from evalsup.config.cgroup import own_v1_memory_cgroup
from evalsup.mock.server import MockConfig, MockThread
from evalsup.rundir.lock import LOCK_NAME

ROOT = Path(__file__).resolve().parent.parent


def mock_endpoints(n: int, latency_ms: float = 2, jitter_ms: float = 1) -> Iterator[list[MockThread]]:
    """``n`` mock endpoints (2 ms answers by default, each its own seed), for a fixture to yield; stopped
    together."""
    ms = [MockThread(MockConfig(latency_ms=latency_ms, jitter_ms=jitter_ms, seed=i)) for i in range(n)]
    for m in ms:
        m.start()
    try:
        yield ms
    finally:
        for m in ms:
            m.stop()


def write_tasks(path: Path, n: int, form: str = "simple", extra: dict[str, Any] | None = None,
                start: int = 0) -> Path:
    with open(path, "wb") as f:
        for i in range(start, start + n):
            if form == "simple":
                obj: dict[str, Any] = {"id": f"t{i}", "messages": [{"role": "user", "content": f"q{i}"}]}
            elif form == "prompt":
                obj = {"id": f"t{i}", "prompt": f"q{i}"}
            else:
                obj = {"custom_id": f"t{i}", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "mock-model", "messages": [{"role": "user", "content": f"q{i}"}]}}
            if extra:
                obj.update(extra)
            f.write(orjson.dumps(obj) + b"\n")
    return path


def evalsup_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "evalsup", *args]


def env_for(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "EVALSUP_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(evalsup_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env_for(env))


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    with open(run_dir / "results.jsonl", "rb") as f:
        return [orjson.loads(line) for line in f]


def assert_exactly_once(run_dir: Path, ids: set[str]) -> list[dict[str, Any]]:
    recs = read_results(run_dir)
    got = [r["custom_id"] for r in recs]
    dupes = {i for i, c in Counter(got).items() if c > 1}
    assert not dupes, f"ids written twice: {sorted(dupes)[:10]}"
    assert set(got) == ids, f"missing {sorted(ids - set(got))[:10]}, extra {sorted(set(got) - ids)[:10]}"
    return recs


# ------------------------------------------------------------------------ the one harness for running evalsup

LIVENESS_S = 90.0  # how long a step may take before a test calls it stuck (never a performance bound)
PLUGINS = ROOT / "tests" / "plugins"
FAULTS_PLUGIN = PLUGINS / "faults.py"


def lines(path: Path, objs: list[dict[str, Any]]) -> Path:
    """Write ``objs`` as a JSONL task file."""
    path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in objs))
    return path


def summary(run_dir: Path) -> dict[str, Any]:
    """The run's summary.json."""
    return orjson.loads((run_dir / "summary.json").read_bytes())  # type: ignore[no-any-return]


def run_args(mock: MockThread, tasks: Path, *extra: str) -> tuple[str, ...]:
    # a fixed concurrency (the default is adaptive, up to 256): many of these runs are killed mid-way, and
    # their pace must leave the moment to do it (a later -c in extra wins)
    return ("run", "--model", "mock-model", "--base-url", mock.url, "-c", "64", *extra, str(tasks))


def ids_of(n: int, start: int = 0) -> set[str]:
    return {f"t{i}" for i in range(start, start + n)}


def chat_requests(mock: MockThread) -> int:
    """Generation requests the mock has seen (not counting the start-up check of /v1/models)."""
    return int(mock.stats()["by_path"].get("/v1/chat/completions", 0))


def complete_lines(path: Path) -> int:
    """Complete (newline-terminated) lines of a file; 0 if it does not exist."""
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def memory_samples(run_dir: Path) -> list[dict[str, Any]]:
    """Complete lines of memory.jsonl (the last one may be half written while the run goes on)."""
    try:
        data = (run_dir / "memory.jsonl").read_bytes()
    except FileNotFoundError:
        return []
    return [orjson.loads(x) for x in data[: data.rfind(b"\n") + 1].splitlines() if x]


def wait_until(cond: Callable[[], bool], what: str, timeout: float = LIVENESS_S, proc: Run | None = None) -> None:
    """Poll ``cond``; the deadline only guards against a hang, it is not what the test measures. With ``proc``,
    its end while waiting fails at once, with its stderr."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and not proc.running():
            raise AssertionError(f"evalsup exited ({proc.p.returncode}) while waiting for {what}; "
                                 f"stderr:\n{proc.stderr[-3000:]}")
        if time.monotonic() > deadline:
            tail = f"; stderr:\n{proc.stderr[-3000:]}" if proc is not None else ""
            raise AssertionError(f"gave up after {timeout:g}s waiting for {what}{tail}")
        time.sleep(0.02)


class Run:
    """One evalsup command (or ``argv``) in its own session (its workers share its process group), output to
    files. It remembers every child it saw, so teardown kills exactly what the test started, by PID."""

    _count = 0

    def __init__(self, where: Path, *args: str, env: dict[str, str] | None = None,
                 argv: list[str] | None = None, stdin: bytes | None = None, tty: int | None = None) -> None:
        """``stdin``: bytes fed to its standard input (then closed) by a thread; ``tty``: a terminal's fd (a pty's
        slave side) as its stdin, stdout and stderr instead of the output files."""
        Run._count += 1
        self.out_path = where / f"evalsup-{Run._count}.stdout"
        self.err_path = where / f"evalsup-{Run._count}.stderr"
        self.args = args
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            if tty is not None:
                streams: dict[str, Any] = {"stdin": tty, "stdout": tty, "stderr": tty}
            else:
                streams = {"stdin": subprocess.PIPE if stdin is not None else None, "stdout": out, "stderr": err}
            self.p = subprocess.Popen(argv or evalsup_cmd(*args), env=env_for(env), start_new_session=True,
                                      **streams)
        self.pid = self.p.pid
        self.seen: dict[int, psutil.Process] = {}
        if stdin is not None:
            pipe = self.p.stdin
            assert pipe is not None

            def feed() -> None:
                try:
                    pipe.write(stdin)
                    pipe.close()
                except OSError:  # the run ended (or was killed) before it read everything
                    pass

            threading.Thread(target=feed, daemon=True).start()

    def workers(self) -> list[psutil.Process]:
        """The live (non-zombie) descendants of the process, remembered for teardown."""
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        live = []
        for k in kids:
            try:
                if k.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.NoSuchProcess:
                continue
            self.seen.setdefault(k.pid, k)
            live.append(k)
        return live

    def running(self) -> bool:
        self.workers()
        return self.p.poll() is None

    def wait(self, timeout: float = LIVENESS_S) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` (a hang guard, not a measurement)."""
        deadline = time.monotonic() + timeout
        while self.running():
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return self.p.returncode

    def finish(self, timeout: float = LIVENESS_S) -> int:
        """The exit code; fails the test, with the stderr, if it still runs after ``timeout``."""
        rc = self.wait(timeout)
        if rc is None:
            raise AssertionError(f"evalsup {' '.join(self.args[:1])} still running after {timeout:g}s; "
                                 f"stderr:\n{self.stderr[-3000:]}")
        return rc

    def communicate(self, timeout: float = LIVENESS_S) -> tuple[str, str]:
        """Wait for its end and return its stdout and stderr; if it still runs after ``timeout`` (a hang guard),
        kill it (only it) and fail the test with its stderr."""
        if self.wait(timeout) is None:
            self.p.kill()
            self.p.wait()
            raise AssertionError(f"evalsup {' '.join(self.args[:1])} still running after {timeout:g}s; "
                                 f"stderr:\n{self.stderr[-3000:]}")
        return self.stdout, self.stderr

    @property
    def returncode(self) -> int | None:
        return self.p.poll()

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        """``sig`` to the supervisor and its workers at once (its process group: docker pause, the OOM killer)."""
        self.workers()
        os.killpg(self.pid, sig)

    def interrupt(self, grace: float = 15.0) -> None:
        """SIGINT (stop now, checkpoint), then SIGKILL if it does not go."""
        if self.p.poll() is None:
            self.workers()
            os.kill(self.pid, signal.SIGINT)
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()

    def kill_group(self) -> None:
        """SIGKILL the supervisor and its workers at once (the process group, as the OOM killer would)."""
        self.workers()
        os.killpg(self.pid, signal.SIGKILL)
        self.p.wait()

    def leftovers(self) -> list[int]:
        """Children seen earlier that still run."""
        out = []
        for proc in self.seen.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def alive_pids(self) -> list[int]:
        return ([self.pid] if self.p.poll() is None else []) + self.leftovers()

    def wait_workers_gone(self, timeout: float = 20.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def wait_results(self, run_dir: Path, at_least: int = 1, timeout: float = LIVENESS_S) -> int:
        """Wait until results.jsonl holds ``at_least`` complete lines while the run still goes."""
        results = run_dir / "results.jsonl"
        deadline = time.monotonic() + timeout
        while (n := complete_lines(results)) < at_least:
            assert self.running(), f"run ended (exit {self.p.returncode}) before {at_least} results:\n{self.stderr}"
            assert time.monotonic() < deadline, f"no {at_least} results after {timeout:g}s:\n{self.stderr}"
            time.sleep(0.02)
        return n

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def cleanup(self) -> None:
        self.workers()
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for proc in self.seen.values():
            try:
                if proc.is_running():  # psutil checks it is still the same process (create time)
                    proc.kill()
            except psutil.NoSuchProcess:
                pass


def resume_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if "resuming:" in x]
    assert len(lines) == 1, f"expected one 'resuming:' line, got {len(lines)}:\n{stderr}"
    return lines[0]


def assert_clean_exit(proc: Run | subprocess.CompletedProcess[str]) -> None:
    err = proc.stderr
    assert "Traceback" not in err, err


def quiesce(mock: MockThread) -> None:
    """Wait until the mock has nothing in flight and no request of a killed run still arrives (bytes a
    worker wrote just before it died can reach the server after)."""
    last = -1
    deadline = time.monotonic() + LIVENESS_S
    while True:
        st = mock.stats()
        if st["in_flight"] == 0 and st["requests"] == last:
            return
        assert time.monotonic() < deadline, "the mock never went quiet"
        last = st["requests"] if st["in_flight"] == 0 else -1
        time.sleep(0.3)


def resumed_done(line: str) -> int:
    m = re.search(r"resuming:\D*([\d,]+) done", line)
    assert m, f"the resume line does not say how many are done: {line!r}"
    return int(m.group(1).replace(",", ""))


def snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under d with its bytes and mtime (but the lock file, which names whoever held it last)."""
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


# ------------------------------------------------------------------------ runs the resume tests start from


def killed_mid_run(tmp_path: Path, mock: MockThread, start: Callable[..., Run], n: int = 2000,
                   at_least: int = 300) -> tuple[Path, Path, tuple[str, ...]]:
    """A run SIGKILLed (whole process group) while results were coming in; the mock is fast again after."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "3")
    mock.configure(latency_ms=100, jitter_ms=20)
    p = start(*args)
    p.wait_results(run_dir, at_least)
    time.sleep(0.3)  # somewhere between flushes and checkpoints
    p.kill_group()
    assert p.wait_workers_gone() == []
    assert complete_lines(run_dir / "results.jsonl") < n, "the run finished before it could be killed"
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    return tasks, run_dir, args


def finished_run(tmp_path: Path, mock: MockThread, n: int = 100, *extra: str,
              tasks_extra: Callable[[int], dict[str, Any] | None] | None = None) -> tuple[Path, Path, tuple[str, ...]]:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, n)
    if tasks_extra is not None:  # per-task fields (the mock's per-request behaviour)
        lines = tasks.read_bytes().splitlines()
        out = []
        for i, line in enumerate(lines):
            obj = orjson.loads(line)
            obj.update(tasks_extra(i) or {})
            out.append(orjson.dumps(obj))
        tasks.write_bytes(b"\n".join(out) + b"\n")
    run_dir = tmp_path / "tasks.run"
    args = run_args(mock, tasks, "-w", "2", *extra)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    return tasks, run_dir, args


def fail_once(ids: set[int], status: int = 400) -> Callable[[int], dict[str, Any] | None]:
    """The mock answers these tasks' first attempt with `status` (and succeeds after)."""
    return lambda i: {"mock": {"status": status, "times": 1}} if i in ids else None


# ------------------------------------------------------------------------ --batch-api runs (issue 31)

# small chunks and fast polling, so a batch run against the mock takes about as long as an online one
BATCH_FAST = ("--batch-api", "--batch-max-requests", "40", "--batch-poll-interval", "0.05", "--batch-poll-max",
              "0.2", "-q")
BATCH_KEY = {"OPENAI_API_KEY": "sk-test"}


def batches_of(mock: MockThread) -> list[dict[str, Any]]:
    """Every batch the mock holds, listed with the openai SDK (small pages: it follows ``after``)."""
    import openai

    c = openai.OpenAI(base_url=mock.url, api_key="sk-test")
    return [b.model_dump() for b in c.batches.list(limit=7)]


def assert_no_chunk_twice(mock: MockThread) -> None:
    """No chunk of a run was created as a batch twice (the metadata names it)."""
    made = Counter((b["metadata"] or {}).get("evalsup_chunk") for b in batches_of(mock))
    assert made and max(made.values()) == 1, f"a chunk was created twice: {made}"


def v1_memory_cgroup(limit: int) -> Iterator[Path | str]:
    """A fresh cgroup v1 memory cgroup limited to ``limit`` bytes, made inside this process's own (for a fixture
    to yield; its processes moved back and it is removed afterwards). Yields the reason instead when it cannot be
    made (not root, no v1 memory hierarchy): the caller skips. A command joins it with ``in_cgroup``."""
    mount = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (mount / "memory.limit_in_bytes").is_file():
        yield "needs root and a cgroup v1 memory hierarchy at /sys/fs/cgroup/memory"
        return
    parent = own_v1_memory_cgroup(mount)
    cg = parent / f"evalsup-test-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as e:
        yield f"cannot make a memory cgroup under {parent}: {e.strerror}"
        return
    try:
        yield cg
    finally:
        for _ in range(50):
            pids = [x for x in (cg / "cgroup.procs").read_text().split() if x.isdigit()]
            for pid in pids:
                with contextlib.suppress(OSError):
                    (parent / "cgroup.procs").write_text(pid)
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def in_cgroup(cg: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside cgroup ``cg``: the child joins it before it execs, so every process it starts is in it."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cg / "cgroup.procs"), *argv]
