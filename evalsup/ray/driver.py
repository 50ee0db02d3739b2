"""`evalsup run --ray [ADDRESS] --shards N TASKS`: each shard a Ray task, retried by Ray, merged at the end.

The driver (this module, in the `evalsup run` process) connects to a Ray cluster and submits one Ray task per
shard. A shard's task runs `evalsup run TASKS --shard K/N --out OUT/shard-K-of-N ...` as a child process on
whichever node Ray chose (evalsup.common.child: it gets SIGTERM if its Ray worker dies, SIGINT if the task is
cancelled, and drains and checkpoints either way), and carries out evalsup.ray.plan's verdict on its exit:

* done (0), bad input (2), or a cost or token cap reached (75, exit_reason budget: a retry would stop again at
  once): the task returns that outcome;
* the shard's directory still held (73: the child of a previous attempt is draining): wait up to HELD_WAIT_S;
* anything else (75, killed, 1): it raises ShardUnfinished, which Ray retries (``retry_exceptions``), as it
  retries a task whose worker process or node died (``max_retries`` = --ray-retries). A retry is a resume.

The driver waits for the tasks, prints one progress line over every shard (from their checkpoints, as
`evalsup status OUT` does), stops the whole at the first bad input (cancelling the others, which checkpoint),
and when every shard is done runs `evalsup merge OUT --tasks TASKS -o OUT/merged.jsonl`, which proves coverage.
No scheduler, RPC or cluster of evalsup's own: Ray's task API and retries only. Each shard's last attempt's log
is kept in OUT/ray-logs/shard-K/stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from evalsup.common.child import child_env, last_message, run_child
from evalsup.config.exitcodes import BAD_INPUT, FAILED, OK, RESUMABLE, describe
from evalsup.config.options import argv_of
from evalsup.ray.plan import (
    CredentialInArgs,
    Exit,
    ShardUnfinished,
    exit_of,
    progress_line,
    retry_line,
    shard_env,
    shard_options,
)
from evalsup.rundir.layout import shard_dir_name

HELD_WAIT_S = 120.0  # how long a shard's attempt waits for a previous attempt's process to let go of its directory
LOGS = "ray-logs"
DRIVER_LOG = "driver.log"  # in LOGS: what Ray itself says (a retried task's traceback, its core's lines)
MERGED = "merged.jsonl"


class RayRunError(Exception):
    """The run on Ray cannot start or go on; ``code`` is the exit code, the message the one line to print."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _logs(out: Path, k: int) -> Path:
    """Where shard K's last attempt leaves its log: OUT/ray-logs/shard-K/ (not named shard-K-of-N: that name
    is a shard's run directory, which `evalsup merge` and `status` look for)."""
    return out / LOGS / f"shard-{k}"


def shard_attempt(tasks: str, out: str, argv: list[str], k: int, n: int) -> dict[str, Any]:
    """One attempt at shard ``k`` of ``n``, in a Ray worker: its outcome, or ShardUnfinished for Ray to retry."""
    run_dir = Path(out) / shard_dir_name(k, n)
    logs = _logs(Path(out), k)
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "evalsup", "run", tasks, "--shard", f"{k}/{n}", "--out", str(run_dir), *argv,
           "--json"]
    deadline = time.monotonic() + HELD_WAIT_S
    while True:
        code, summary, lines = run_child(cmd, False, logs, False)
        verdict = exit_of(code, (summary or {}).get("exit_reason"))
        if verdict is not Exit.HELD or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    (logs / "exit").write_text(str(code))  # how this attempt ended, for the next one's line (counted_attempt)
    message = last_message(lines) if code >= 0 else ""  # a killed process said no last word: its last line is not one
    if verdict in (Exit.DONE, Exit.BAD, Exit.BUDGET):
        return {"shard": k, "code": code, "message": message, "summary": summary, "verdict": verdict.value}
    raise ShardUnfinished(k, code, message)


def _ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise RayRunError("--ray needs Ray in this environment and on every node: pip install 'evalsup[ray]'",
                          BAD_INPUT) from None


def _check(tasks: Path, given: dict[str, Any]) -> None:
    if str(tasks) == "-" or not tasks.is_file():
        raise RayRunError(f"--ray: {tasks}: not a regular file; the task file must be a file on a path every node "
                          "of the cluster sees (not stdin or a FIFO)", BAD_INPUT)


def _move_aside(out: Path, say: Callable[[str], None]) -> None:
    from evalsup.rundir.lock import RunDirBusy, RunDirError, move_aside

    try:
        dest = move_aside(out)
    except (RunDirBusy, RunDirError, OSError) as e:
        raise RayRunError(str(e), BAD_INPUT) from None
    if dest is not None:
        say(f"--fresh: moved the old run directory to {dest}")


def _progress(out: Path, n: int, retried: int) -> str:
    from evalsup.tools.status import shards_status

    try:
        return progress_line(shards_status(out)["groups"], n, retried)
    except Exception as e:  # a damaged or half-written checkpoint must never stop the driver
        return f"ray: {n} shards running (status unreadable: {e})"


def _attempts(out: Path, n: int) -> int:
    """Attempts started beyond the first of each shard (each attempt's child rewrites its stderr file; the
    attempts file counts them)."""
    total = 0
    for k in range(n):
        p = _logs(out, k) / "attempts"
        try:
            total += max(0, int(p.read_text() or "0") - 1)
        except (OSError, ValueError):
            continue
    return total


def counted_attempt(tasks: str, out: str, argv: list[str], k: int, n: int) -> dict[str, Any]:
    """shard_attempt, counting the attempt first in OUT/ray-logs/shard-K/attempts (for the progress line and
    `evalsup status`; one attempt of a shard starts at a time, so a read and a rewrite suffice). A retry also
    appends how the attempt before it ended to ``retries`` (its ``exit`` file: a code, or "running" when its Ray
    worker died with it), which the driver says in one line."""
    logs = _logs(Path(out), k)
    logs.mkdir(parents=True, exist_ok=True)
    p, last = logs / "attempts", logs / "exit"
    try:
        count = int(p.read_text() or "0")
    except (OSError, ValueError):
        count = 0
    p.write_text(str(count + 1))
    try:
        before = last.read_text().strip()
    except OSError:
        before = None  # the first attempt of this run of the driver (which took the file away)
    if before is not None:
        code = int(before) if before.lstrip("-").isdigit() else None
        with open(logs / "retries", "ab") as f:
            f.write(orjson.dumps({"attempt": count + 1, "last_exit": code}) + b"\n")
    last.write_text("running")
    return shard_attempt(tasks, out, argv, k, n)


def _lines(path: Path) -> int:
    try:
        return len(path.read_bytes().splitlines())
    except OSError:
        return 0


def _retries_said(out: Path, n: int, said: dict[int, int], say: Callable[[str], None]) -> None:
    """Each retry Ray started since the last look, in one line (``plan.retry_line``); ``said``: lines read a shard."""
    for k in range(n):
        try:
            lines = (_logs(out, k) / "retries").read_bytes().splitlines()
        except OSError:
            continue
        for line in lines[said.get(k, 0):]:
            try:
                r = orjson.loads(line)
                say(retry_line(k, n, int(r["attempt"]), r.get("last_exit")))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # (a line being written: read again next time)
        said[k] = len(lines)


@contextlib.contextmanager
def _ray_output(log: Path) -> Iterator[IO[str]]:
    """While Ray runs, its own words go to ``log`` (OUT/ray-logs/driver.log), never into evalsup's output: file
    descriptors 1 and 2 point at the file (Ray's core, the processes a local cluster starts, and the traceback of a
    retried task that Ray's driver prints to sys.stdout), and Ray's Python logger writes there; sys.stderr is a copy
    of the original stderr (evalsup's lines, `say`). Yields a copy of the original stdout for evalsup's own output
    (the summary, --json). Everything is put back at the end."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    out = open(saved_out, "w", buffering=1, closefd=False)  # noqa: SIM115 - closed below
    err = open(saved_err, "w", buffering=1, closefd=False)  # noqa: SIM115 - closed below
    ray_log = logging.getLogger("ray")
    handler = logging.FileHandler(log)
    ray_log.addHandler(handler)
    ray_log.setLevel(logging.INFO)
    ray_log.propagate = False
    stderr = sys.stderr
    sys.stderr = err
    try:
        yield out
    finally:
        for f in (out, err, sys.stdout):
            with contextlib.suppress(OSError, ValueError):
                f.flush()
        sys.stderr = stderr
        ray_log.removeHandler(handler)
        handler.close()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        out.close()
        err.close()
        os.close(saved_out)
        os.close(saved_err)


def run_on_ray(tasks: Path, given: dict[str, Any], *, address: str, n: int, retries: int, quiet: bool,
               interval: float, json_summary: bool, say: Callable[[str], None]) -> int:
    """The whole run on Ray; its exit code (0 merged and proven, 2 bad input, 75 unfinished: rerun, 1 merge)."""
    from evalsup.config.run_config import default_run_dir

    _check(tasks, given)
    try:
        given, env = shard_env(given, os.environ)  # the driver's endpoint settings, for the shards' environment
    except CredentialInArgs as e:
        raise RayRunError(str(e), BAD_INPUT) from None
    tasks = tasks.resolve()
    out = Path(given["out"]).resolve() if given.get("out") else default_run_dir(tasks).resolve()
    if given.get("fresh"):
        _move_aside(out, say)
    ray = _ray()
    (out / LOGS).mkdir(parents=True, exist_ok=True)
    for k in range(n):  # a retry's line names how the attempt before it ended: none yet in this run of the driver
        with contextlib.suppress(OSError):
            (_logs(out, k) / "exit").unlink()
    with _ray_output(out / LOGS / DRIVER_LOG) as stdout:
        try:
            return _drive(ray, tasks, given, env, out, address=address, n=n, retries=retries, quiet=quiet,
                          interval=interval, json_summary=json_summary, say=say, stdout=stdout)
        finally:
            with contextlib.suppress(Exception):  # (its own lines go to the log too)
                ray.shutdown()


def _drive(ray: Any, tasks: Path, given: dict[str, Any], env: dict[str, str], out: Path, *, address: str, n: int,
           retries: int, quiet: bool, interval: float, json_summary: bool, say: Callable[[str], None],
           stdout: IO[str]) -> int:
    """run_on_ray once Ray's output is in its log: connect, submit, wait, say, merge."""
    try:
        # log_to_driver off: the shards' own output stays in their logs; Ray's logger is _ray_output's
        ray.init(address=None if address == "default" else address, log_to_driver=False, configure_logging=False)
    except Exception as e:  # Ray raises ConnectionError, ValueError, RuntimeError...
        raise RayRunError(f"--ray {address}: cannot reach a Ray cluster: {str(e).splitlines()[0] if str(e) else e!r}",
                          RESUMABLE) from None
    said = {k: _lines(_logs(out, k) / "retries") for k in range(n)}  # the retries said, a shard (not a rerun's)
    # the endpoint settings reach each shard in its environment (runtime_env), never its arguments
    attempt = ray.remote(counted_attempt).options(max_retries=retries, retry_exceptions=[ShardUnfinished],
                                                  num_cpus=1, name="evalsup-shard",
                                                  runtime_env={"env_vars": env} if env else None)
    shard_of = {attempt.remote(str(tasks), str(out), argv_of(shard_options(given, k, n)), k, n): k for k in range(n)}
    if not quiet:
        say(f"ray: {n} shards of {tasks.name} submitted to the cluster at {address}; run directory {out}")
    pending = list(shard_of)
    unfinished: dict[int, str] = {}
    bad: tuple[int, str] | None = None
    stop = _on_signals()
    last = time.monotonic()
    try:
        while pending and bad is None and not stop():
            ready, pending = ray.wait(pending, num_returns=1, timeout=min(interval, 1.0))
            for ref in ready:
                k = shard_of[ref]
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as e:
                    cause = getattr(e, "cause", None)
                    unfinished[k] = str(cause) if isinstance(cause, ShardUnfinished) else str(e).splitlines()[0]
                    say(f"ray: {shard_dir_name(k, n)} did not finish after {retries} retries: {unfinished[k]}")
                    continue
                if outcome["verdict"] == Exit.BAD.value:
                    bad = (k, str(outcome["message"]))
                elif outcome["verdict"] == Exit.BUDGET.value:  # final for this run: rerun with a higher cap
                    unfinished[k] = f"stopped at its cap: {outcome['message']}"
                    say(f"ray: {shard_dir_name(k, n)} {unfinished[k]}")
            _retries_said(out, n, said, say)
            if not quiet and time.monotonic() - last >= interval:
                last = time.monotonic()
                say(_progress(out, n, _attempts(out, n)))
    except KeyboardInterrupt:
        stop.set()
    if bad is not None or stop():
        for ref in pending:  # the shard's child gets SIGINT: it checkpoints and exits; a rerun resumes it
            ray.cancel(ref)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=60.0)
        if bad is not None:
            say(f"{shard_dir_name(bad[0], n)}: {bad[1]}")
            return BAD_INPUT
        say(f"ray: stopped; the shards checkpointed: rerun the same command to resume ({out})")
        return RESUMABLE
    if unfinished:
        capped = any(m.startswith("stopped at its cap") for m in unfinished.values())
        how = "rerun with a higher cap to resume" if capped else "rerun the same command to resume"
        say(f"ray: {len(unfinished)} of {n} shards unfinished: {how} ({out})")
        return RESUMABLE
    _retries_said(out, n, said, say)
    if not quiet:
        say(_progress(out, n, _attempts(out, n)))
    return _merge(tasks, out, n, quiet, json_summary, say, stdout)


def _merge(tasks: Path, out: Path, n: int, quiet: bool, json_summary: bool, say: Callable[[str], None],
           stdout: IO[str]) -> int:
    merged = out / MERGED
    r = subprocess.run([sys.executable, "-m", "evalsup", "merge", str(out), "--tasks", str(tasks), "-o", str(merged)],
                       capture_output=True, text=True, env=child_env())
    for line in r.stderr.splitlines():
        sys.stderr.write(line + "\n")
    if r.returncode != 0:
        say(f"ray: every shard finished but the merge failed (exit {r.returncode}); see the lines above")
        return FAILED
    summary = orjson.loads(merged.with_name(merged.stem + ".summary.json").read_bytes())
    summary.update(run_dir=str(out), merged=str(merged), shards_count=n, finished=True, **describe(OK))
    if json_summary:
        stdout.write(orjson.dumps(summary).decode() + "\n")
    elif not quiet:
        stdout.write(r.stdout)
    else:
        stdout.write(f"{summary['total']:,} results ({summary['succeeded']:,} ok, {summary['failed']:,} failed) "
                         f"-> {merged}\n")
    return OK


class _Stop:
    """Set by SIGTERM or SIGINT: the driver cancels the shards (they checkpoint) and exits 75."""

    def __init__(self) -> None:
        self.is_set = False

    def __call__(self) -> bool:
        return self.is_set

    def set(self) -> None:
        self.is_set = True


def _on_signals() -> _Stop:
    stop = _Stop()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
