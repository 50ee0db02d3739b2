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

import importlib
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from evalsup.common.child import child_env, last_message, run_child
from evalsup.config.exitcodes import BAD_INPUT, FAILED, OK, RESUMABLE, describe
from evalsup.config.options import argv_of
from evalsup.ray.plan import Exit, ShardUnfinished, exit_of, progress_line, shard_options
from evalsup.rundir.layout import shard_dir_name

HELD_WAIT_S = 120.0  # how long a shard's attempt waits for a previous attempt's process to let go of its directory
LOGS = "ray-logs"
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
    message = last_message(lines)
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
    urls = given.get("base_url") or ()
    if any("@" in urllib.parse.urlsplit(u).netloc for u in urls):
        raise RayRunError("--ray: a --base-url with user:password@ would travel in Ray's task arguments (kept by "
                          "its GCS, shown on its dashboard); set OPENAI_BASE_URL on the nodes instead", BAD_INPUT)


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
    """shard_attempt, counting the attempt first in OUT/ray-logs/shard-K/attempts (for the progress line
    and `evalsup status`; one attempt of a shard starts at a time, so a read and a rewrite suffice)."""
    p = _logs(Path(out), k) / "attempts"
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        count = int(p.read_text() or "0")
    except (OSError, ValueError):
        count = 0
    p.write_text(str(count + 1))
    return shard_attempt(tasks, out, argv, k, n)


def run_on_ray(tasks: Path, given: dict[str, Any], *, address: str, n: int, retries: int, quiet: bool,
               interval: float, json_summary: bool, say: Callable[[str], None]) -> int:
    """The whole run on Ray; its exit code (0 merged and proven, 2 bad input, 75 unfinished: rerun, 1 merge)."""
    from evalsup.config.run_config import default_run_dir

    _check(tasks, given)
    tasks = tasks.resolve()
    out = Path(given["out"]).resolve() if given.get("out") else default_run_dir(tasks).resolve()
    if given.get("fresh"):
        _move_aside(out, say)
    ray = _ray()
    out.mkdir(parents=True, exist_ok=True)
    try:
        ray.init(address=None if address == "default" else address, log_to_driver=False,
                 logging_level="ERROR", configure_logging=True)
    except Exception as e:  # Ray raises ConnectionError, ValueError, RuntimeError...
        raise RayRunError(f"--ray {address}: cannot reach a Ray cluster: {str(e).splitlines()[0] if str(e) else e!r}",
                          RESUMABLE) from None
    attempt = ray.remote(counted_attempt).options(max_retries=retries, retry_exceptions=[ShardUnfinished],
                                                  num_cpus=1, name="evalsup-shard")
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
    if not quiet:
        say(_progress(out, n, _attempts(out, n)))
    return _merge(tasks, out, n, quiet, json_summary, say)


def _merge(tasks: Path, out: Path, n: int, quiet: bool, json_summary: bool, say: Callable[[str], None]) -> int:
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
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    elif not quiet:
        sys.stdout.write(r.stdout)
    else:
        sys.stdout.write(f"{summary['total']:,} results ({summary['succeeded']:,} ok, {summary['failed']:,} failed) "
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
