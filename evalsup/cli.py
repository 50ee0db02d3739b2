"""The `evalsup` command: parse, build the config, call in. Nothing else lives here."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from evalsup.config import (
    DEFAULT_MAX_CONCURRENCY,
    ConfigError,
    RunConfig,
    WorkerConfig,
    default_run_dir,
    parse_shard,
    resolve_base_url,
)


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"evalsup: {msg}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="evalsup")
def main() -> None:
    """Push 10k-1M requests through an OpenAI-compatible endpoint without running out of memory,
    losing results or starting over after a crash.

    \b
    evalsup demo                              try it against the built-in mock endpoint
    evalsup run --workers 4 tasks.jsonl       the real job, against $OPENAI_BASE_URL
    evalsup status tasks.run                  progress of a run, from another shell
    """


def run_options(f: Any) -> Any:
    opts = [
        click.option("--workers", "-w", type=click.IntRange(1, 256), default=None,
                     help="Worker processes (each an asyncio event loop with its own HTTP connections). "
                          "Default: start with 1 and add one while every worker is CPU-bound (large "
                          "responses, high rates), up to min(4, 2 x CPUs), fewer under a small memory limit."),
        click.option("--concurrency", "-c", type=click.IntRange(1, 100_000), default=None,
                     help="Requests in flight in total, split evenly among the workers: fixed. Default: "
                          "adaptive, between 1 and --max-concurrency, found from the server's latency, "
                          "429/503s, timeouts and (when it has them) its queue metrics."),
        # issue 21: adaptive concurrency, server signals, headers (evalsup.worker.adaptive, evalsup.headers)
        click.option("--max-concurrency", type=click.IntRange(1, 100_000), default=256, show_default=True,
                     help="The most requests in flight the adaptive limit may reach (never past the memory cap)."),
        click.option("--server-metrics", default=None, metavar="URL",
                     help="The server's Prometheus metrics (vLLM, SGLang, TGI queue gauges) for the adaptive "
                          "limit. Default: the server root's /metrics, when it has one; off: never."),
        click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'",
                     help="Extra request header (repeatable). VALUE may be env:VAR or @FILE for secrets; "
                          "values are never printed."),
        click.option("--window", type=click.IntRange(0, 100_000), default=0,
                     help="Tasks handed to one worker ahead of its results (default 2 x its concurrency)."),
        click.option("--out", "-o", "out", type=click.Path(path_type=Path), default=None,
                     help="Run directory (default: TASKS.run beside the task file)."),
        click.option("--fresh", is_flag=True,
                     help="Start over: move an existing run directory aside (never deleted) instead of resuming."),
        click.option("--model", default=None, help="Model for simple-form lines (and lines whose body has none)."),
        click.option("--max-tokens", type=int, default=None, help="max_tokens for requests that do not set it."),
        click.option("--temperature", type=float, default=None, help="temperature for requests that do not set it."),
        click.option("--max-attempts", type=click.IntRange(1, 100), default=5, show_default=True,
                     help="Attempts per task for retryable failures (connection errors, timeouts, 429, 5xx)."),
        click.option("--timeout", "total_timeout", type=float, default=600.0, show_default=True,
                     help="Total seconds one attempt may take."),
        click.option("--connect-timeout", type=float, default=10.0, show_default=True,
                     help="Seconds to open a connection."),
        click.option("--read-timeout", type=float, default=120.0, show_default=True,
                     help="Seconds to wait for the first byte, and between chunks."),
        click.option("--max-response-mb", type=float, default=64.0, show_default=True,
                     help="Larger responses become error records."),
        click.option("--max-line-mb", type=float, default=16.0, show_default=True,
                     help="Longer task lines are invalid."),
        click.option("--on-invalid", type=click.Choice(["error", "skip"]), default="error", show_default=True,
                     help="A bad task line stops the run (error), or is recorded in invalid.jsonl (skip)."),
        click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                     help="Environment variable that holds the API key (sent as a bearer token)."),
        click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
                     help="File that holds the API key (instead of the environment)."),
        click.option("--insecure", is_flag=True, help="Do not verify TLS certificates."),
        click.option("--grace", type=float, default=20.0, show_default=True,
                     help="On SIGTERM, seconds to let requests in flight finish before checkpointing."),
        click.option("--hang-timeout", type=float, default=60.0, show_default=True,
                     help="A worker silent (no heartbeat) this long is killed and replaced."),
        click.option("--max-task-crashes", type=click.IntRange(1, 100), default=3, show_default=True,
                     help="A task whose workers died this often is written as failed (worker_crashed)."),
        click.option("--max-restarts", type=click.IntRange(0, 10_000), default=10, show_default=True,
                     help="More unplanned worker restarts than this in 60s stops the run (resumably)."),
        click.option("--shard", default=None, metavar="K/N|auto",
                     help="Process only the lines whose index (non-blank lines from 0) is K mod N; auto reads "
                          "JOB_COMPLETION_INDEX+EVALSUP_SHARDS, SLURM_ARRAY_TASK_ID+SLURM_ARRAY_TASK_COUNT or "
                          "AWS_BATCH_JOB_ARRAY_INDEX+AWS_BATCH_JOB_ARRAY_SIZE. Run dir: TASKS.run/shard-K-of-N/."),
        click.option("--stream", is_flag=True,
                     help="Stream responses (SSE): records ttft_s; the reassembled body is written."),
        click.option("--max-requests-per-s", type=float, default=None,
                     help="Global request rate limit, across all workers together."),
        click.option("--max-tokens-per-min", type=float, default=None,
                     help="Global token rate limit (estimated before a request, corrected from usage)."),
        click.option("--arrivals", type=click.Choice(["uniform", "poisson"]), default="uniform", show_default=True,
                     help="Spacing of request starts under --max-requests-per-s."),
        click.option("--max-wait-down", type=float, default=600.0, show_default=True,
                     help="Seconds to wait for an endpoint that went down before stopping (resumably)."),
        click.option("--check/--no-check", default=True, show_default=True,
                     help="Check the endpoint, key and model with one tiny request before the run."),
        click.option("--memory-limit", "memory_limit_mb", type=float, default=None,
                     help="Memory budget in MiB for the whole job (default: the container's cgroup limit)."),
        click.option("--memory-high", "memory_high_mb", type=float, default=None,
                     help="Pause dispatch above this many MiB in use (default: 85% of the limit); "
                          "resume below 70% of the limit (or 70/85 of --memory-high)."),
        click.option("--max-worker-rss", "max_worker_rss_mb", type=float, default=None,
                     help="Recycle a worker past this RSS in MiB (default: its share of the limit, or 1024); "
                          "kill it past 1.5x."),
        click.option("--max-tasks-per-worker", type=click.IntRange(1, None), default=None,
                     help="Recycle a worker after this many tasks (bounds slow leaks)."),
        click.option("--max-tasks-jitter", type=click.IntRange(0, None), default=None,
                     help="Add up to this many to --max-tasks-per-worker, per worker, so they do not recycle at once "
                          "(default: a tenth of it)."),
        click.option("--monitor-interval", type=float, default=0.5, show_default=True,
                     help="Seconds between memory samples (written to memory.jsonl)."),
        click.option("--trace-memory", is_flag=True,
                     help="Run tracemalloc in workers; one recycled for RSS writes leaks/worker-PID.txt."),
        click.option("--worker-plugin", default=None, hidden=True,
                     help="module:function called in the worker for each task (testing hooks)."),
        click.option("--scorer", "scorers", multiple=True, metavar="NAME|module:fn|file.py:fn",
                     help="Score each successful response in the workers (repeatable): exact_match, contains, "
                          "regex, json_valid, choice, or your own function fn(task, response) -> number|bool|dict."),
        click.option("--scorer-timeout", type=float, default=30.0, show_default=True,
                     help="Seconds one scorer call may take; past it the task gets an error score."),
        click.option("--ignore-case", "score_ignore_case", is_flag=True,
                     help="exact_match/contains/regex/choice: compare case-insensitively."),
        click.option("--no-strip", "score_no_strip", is_flag=True,
                     help="exact_match/contains/regex: do not strip surrounding white space."),
        click.option("--regex", "score_pattern", default=None,
                     help="Pattern for the regex scorer when a task has no 'pattern' (its first group is compared "
                          "to 'expected')."),
        click.option("--log-interval", type=float, default=10.0, show_default=True,
                     help="Off a terminal, seconds between progress lines."),
        click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
                     help="json: one JSON object per log line, for log collectors."),
        click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
                     help="Serve Prometheus metrics on this port (/metrics)."),
        click.option("--metrics-host", default="127.0.0.1", show_default=True,
                     help="Address for --metrics-port (0.0.0.0 to expose it, e.g. in a pod)."),
        click.option("--quiet", "-q", is_flag=True, help="Print only the final summary."),
        click.option("--json", "json_summary", is_flag=True, help="Print the final summary as JSON on stdout."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_config(tasks: Path, base_url: str, kw: dict[str, Any]) -> RunConfig:
    wc = WorkerConfig(
        base_url=base_url, concurrency=0, api_key_env=kw["api_key_env"], api_key_file=kw["api_key_file"],
        model=kw["model"], max_tokens=kw["max_tokens"], temperature=kw["temperature"],
        max_attempts=kw["max_attempts"], connect_timeout_s=kw["connect_timeout"],
        read_timeout_s=kw["read_timeout"], total_timeout_s=kw["total_timeout"],
        max_response_mb=kw["max_response_mb"], insecure=kw["insecure"], plugin=kw["worker_plugin"],
        trace_memory=kw.get("trace_memory", False), stream=kw.get("stream", False),
        scorers=tuple(kw.get("scorers") or ()), scorer_timeout_s=kw.get("scorer_timeout") or 30.0,
        score_strip=not kw.get("score_no_strip"), score_ignore_case=bool(kw.get("score_ignore_case")),
        score_pattern=kw.get("score_pattern"),
        # issue 21
        adaptive=kw.get("concurrency") is None, server_metrics=kw.get("server_metrics"),
        headers=tuple(kw.get("headers") or ()),
    )
    _check_headers(wc.headers)
    mib = 1 << 20

    def mb(name: str) -> int | None:
        v = kw.get(name)
        return None if v is None else int(v * mib)
    workers = kw["workers"]
    autoscale = workers is None
    if workers is None:
        from evalsup.config import container_limit, default_workers

        limit = mb("memory_limit_mb") or container_limit()[0]
        workers = default_workers(limit)
    adaptive = kw.get("concurrency") is None  # issue 21: without --concurrency the limit adapts
    concurrency = max(kw.get("max_concurrency") or DEFAULT_MAX_CONCURRENCY if adaptive else kw["concurrency"],
                      workers)
    shard = parse_shard(kw.get("shard"))
    return RunConfig(
        tasks_path=tasks, run_dir=kw["out"] or default_run_dir(tasks, shard), worker=wc, workers=workers, shard=shard,
        autoscale=autoscale and workers > 1,
        concurrency=concurrency, adaptive=adaptive,  # issue 21
        window=kw["window"], max_line_mb=kw["max_line_mb"], on_invalid=kw["on_invalid"],
        fresh=kw["fresh"], grace_s=kw["grace"], hang_timeout_s=kw["hang_timeout"],
        max_task_crashes=kw["max_task_crashes"], max_restarts=kw["max_restarts"], quiet=kw["quiet"],
        json_summary=kw["json_summary"], memory_limit=mb("memory_limit_mb"), memory_high=mb("memory_high_mb"),
        max_worker_rss=mb("max_worker_rss_mb"), max_tasks_per_worker=kw.get("max_tasks_per_worker"),
        max_tasks_jitter=int(kw["max_tasks_jitter"]) if kw.get("max_tasks_jitter") is not None
        else int(kw.get("max_tasks_per_worker") or 0) // 10, monitor_interval_s=kw.get("monitor_interval") or 0.5,
        max_requests_per_s=kw.get("max_requests_per_s"), max_tokens_per_min=kw.get("max_tokens_per_min"),
        arrivals=kw.get("arrivals") or "uniform", max_wait_down_s=kw.get("max_wait_down") or 600.0,
        check=kw.get("check", True), log_interval_s=kw.get("log_interval") or 10.0,
        log_format=kw.get("log_format") or "text", metrics_port=kw.get("metrics_port"),
        metrics_host=kw.get("metrics_host") or "127.0.0.1",
    )


def _check_headers(specs: tuple[str, ...]) -> None:
    """A --header that cannot be used stops the run before it starts (issue 21); never shows a value."""
    from evalsup.headers import HeaderError, build_headers

    try:
        build_headers(specs)
    except HeaderError as e:
        raise ConfigError(str(e)) from None


def _move_aside(run_dir: Path) -> None:
    if run_dir.exists():
        dest = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while dest.exists():
            n += 1
            dest = dest.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        run_dir.rename(dest)
        click.echo(f"evalsup: --fresh: moved the old run directory to {dest}", err=True)


@main.command()
@click.argument("tasks", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--base-url", default=None,
              help="Endpoint base URL including /v1, e.g. http://localhost:8000/v1 (default: $OPENAI_BASE_URL).")
@run_options
def run(tasks: Path, base_url: str | None, **kw: Any) -> None:
    """Send every task in TASKS (JSONL) to the endpoint; results go to TASKS.run/results.jsonl.

    TASKS holds OpenAI Batch API lines ({"custom_id", "method", "url", "body"}) or simple lines
    ({"id", "messages"} or {"id", "prompt"}, sent to /v1/chat/completions with --model). Other keys of
    a line are copied to its record's "metadata". Rerunning the same command after a crash or a stop
    resumes where the run left off: every task ends up in results.jsonl exactly once.

    Exit codes: 0 done (failed requests are records, not errors), 1 the run could not go on,
    2 bad input or settings, 130 interrupted.
    """
    try:
        url = resolve_base_url(base_url)
        if not tasks.exists():
            raise ConfigError(f"{tasks}: no such file")
        cfg = build_config(tasks, url, kw)
    except ConfigError as e:
        _fail(str(e))
    if cfg.fresh:
        _move_aside(cfg.run_dir)
    from evalsup.supervisor.run import run as run_job

    sys.exit(run_job(cfg))


@main.command()
@click.option("--tasks", "n", type=click.IntRange(1, 10_000_000), default=2000, show_default=True,
              help="Sample tasks to make.")
@click.option("--workers", "-w", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--concurrency", "-c", type=click.IntRange(1, 10_000), default=64, show_default=True)
@click.option("--latency-ms", type=float, default=20.0, show_default=True, help="Mock latency per request.")
@click.option("--response-kb", type=float, default=1.0, show_default=True, help="Mock response size.")
@click.option("--dir", "where", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where to put the task file and run directory (default: a new temporary folder).")
def demo(n: int, workers: int, concurrency: int, latency_ms: float, response_kb: float, where: Path | None) -> None:
    """Run N sample tasks against the built-in mock endpoint on 127.0.0.1 and print the summary."""
    import orjson

    from evalsup.mock.server import MockConfig, MockThread

    base = where or Path(tempfile.mkdtemp(prefix="evalsup-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    tasks = base / "tasks.jsonl"
    with open(tasks, "wb") as f:
        for i in range(n):
            f.write(orjson.dumps({"id": f"demo-{i}", "messages": [{"role": "user", "content": f"Question {i}?"}],
                                  "expected": str(i % 7)}) + b"\n")
    run_dir = base / "tasks.run"
    if run_dir.exists():
        _move_aside(run_dir)
    with MockThread(MockConfig(latency_ms=latency_ms, jitter_ms=latency_ms / 4, response_kb=response_kb)) as mock:
        click.echo(f"evalsup demo: {n:,} tasks in {tasks}, mock endpoint on {mock.url}", err=True)
        names = ("model", "max_tokens", "temperature", "api_key_file", "worker_plugin", "out")
        kw: dict[str, Any] = dict.fromkeys(names)
        kw.update(workers=workers, concurrency=concurrency, window=0, fresh=False, max_attempts=5,
                  total_timeout=600.0, connect_timeout=10.0, read_timeout=120.0, max_response_mb=64.0,
                  max_line_mb=16.0, on_invalid="error", api_key_env="EVALSUP_DEMO_NO_KEY", insecure=False,
                  grace=20.0, hang_timeout=60.0, max_task_crashes=3, max_restarts=10, quiet=False,
                  json_summary=False, model="mock-model")
        cfg = build_config(tasks, mock.url, kw)
        from evalsup.supervisor.run import run as run_job

        code = run_job(cfg)
    sys.exit(code)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--latency-ms", type=float, default=0.0, show_default=True, help="Mean latency per response.")
@click.option("--jitter-ms", type=float, default=0.0, show_default=True, help="Uniform +- jitter.")
@click.option("--response-kb", type=float, default=0.0, show_default=True, help="Pad answers to about this size.")
@click.option("--fail-500", type=float, default=0.0, show_default=True, help="Fraction answered 500.")
@click.option("--fail-429", type=float, default=0.0, show_default=True, help="Fraction answered 429 + Retry-After.")
@click.option("--retry-after", type=float, default=1.0, show_default=True, help="Retry-After seconds on 429.")
@click.option("--reset", type=float, default=0.0, show_default=True, help="Fraction of connections reset.")
@click.option("--malformed", type=float, default=0.0, show_default=True, help="Fraction with a non-JSON body.")
@click.option("--seed", type=int, default=0, show_default=True)
# issue 21: the capacity model (evalsup.mock.capacity)
@click.option("--capacity", type=click.IntRange(0, None), default=0, show_default=True,
              help="Serve at most this many requests at once (0: no limit); /metrics shows running and waiting.")
@click.option("--queue", type=click.IntRange(0, None), default=0, show_default=True,
              help="With --capacity: this many more wait in a FIFO; beyond them, 429 with Retry-After.")
def mock(host: str, port: int, latency_ms: float, jitter_ms: float, response_kb: float, fail_500: float,
         fail_429: float, retry_after: float, reset: float, malformed: float, seed: int, capacity: int,
         queue: int) -> None:
    """Serve an OpenAI-compatible mock endpoint with fault injection (for tests and benchmarks)."""
    from evalsup.mock.server import MockConfig, serve_forever

    cfg = MockConfig(latency_ms=latency_ms, jitter_ms=jitter_ms, response_kb=response_kb, fail_500=fail_500,
                     fail_429=fail_429, retry_after_s=retry_after, reset=reset, malformed=malformed, seed=seed,
                     capacity=capacity, queue=queue)
    serve_forever(cfg, host, port)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--scorer", "scorers", multiple=True, required=True, metavar="NAME|module:fn|file.py:fn",
              help="Scorer to apply (repeatable), as for `evalsup run --scorer`.")
@click.option("--workers", "-w", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Processes scoring in parallel.")
@click.option("--ignore-case", is_flag=True, help="Compare case-insensitively.")
@click.option("--no-strip", is_flag=True, help="Do not strip surrounding white space.")
@click.option("--regex", "pattern", default=None, help="Pattern for the regex scorer.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to write (default: RUN_DIR/results.scored.jsonl).")
def score(run_dir: Path, scorers: tuple[str, ...], workers: int, ignore_case: bool, no_strip: bool,
          pattern: str | None, output: Path | None) -> None:
    """Score an existing run's results again, without sending any request.

    Streams RUN_DIR/results.jsonl through WORKERS processes and writes each record with its new "scores"
    to a new file beside it; prints the per-scorer summary (also written to scores.json).
    """
    from evalsup.rescore import rescore

    try:
        summary = rescore(run_dir, list(scorers), workers, not no_strip, ignore_case, pattern, output)
    except (ValueError, OSError) as e:
        _fail(str(e))
    from rich.console import Console

    from evalsup.supervisor.summary import print_scores

    print_scores(summary, Console())


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The merged results file; its summary goes beside it as NAME.summary.json.")
@click.option("--tasks", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="The task file: check that every task appears exactly once across the shards.")
@click.option("--sort", is_flag=True, help="Write results in input order (needs --tasks).")
def merge(run_dirs: tuple[Path, ...], output: Path, tasks: Path | None, sort: bool) -> None:
    """Merge the results of shard runs (RUN_DIRs, or a directory holding shard-*/ run directories).

    Exits 1 and lists the ids when a task is missing or appears twice.
    """
    import orjson

    from evalsup.merge import MergeError, find_run_dirs, merged_summary
    from evalsup.merge import merge as do_merge

    try:
        dirs = find_run_dirs(list(run_dirs))
        rep = do_merge(dirs, output, tasks, sort)
    except MergeError as e:
        _fail(str(e))
    summary = merged_summary(rep, dirs)
    output.with_name(output.stem + ".summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    click.echo(f"merged {len(dirs)} run directories: {rep.records:,} results ({rep.succeeded:,} ok, "
               f"{rep.failed:,} failed) -> {output}")
    if rep.duplicate_count:
        click.echo(f"evalsup: {rep.duplicate_count} duplicated id(s), kept once: {', '.join(rep.duplicates)}",
                   err=True)
    if rep.missing_count:
        click.echo(f"evalsup: {rep.missing_count} task(s) of {tasks} have no result: {', '.join(rep.missing)}"
                   + (" ..." if rep.missing_count > len(rep.missing) else ""), err=True)
    if not rep.complete:
        sys.exit(1)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
def status(run_dir: Path) -> None:
    """Progress of a run directory, from its checkpoint and results file (read-only)."""
    from evalsup.status import status_text

    click.echo(status_text(run_dir))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to write the page (default: RUN_DIR/report.html).")
def report(run_dir: Path, output: Path | None) -> None:
    """Write one self-contained HTML page (opens offline) of a run: figures, memory, request rate, latency."""
    from evalsup.report import ReportError, write_report

    try:
        click.echo(f"report written to {write_report(run_dir, output)}")
    except ReportError as e:
        _fail(str(e), 1)


if __name__ == "__main__":  # pragma: no cover
    main()
