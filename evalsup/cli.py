"""The `evalsup` command: parse, build the config, call in. Nothing else lives here."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from evalsup.config import ConfigError, build_config
from evalsup.options import RUN_OPTIONS, Option


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


def _click_option(o: Option) -> Any:
    """The click decorator for one run option of the table in evalsup/options.py."""
    kw: dict[str, Any] = {"help": o.help, "hidden": o.hidden}
    if o.show_default:
        kw["show_default"] = True
    if o.metavar:
        kw["metavar"] = o.metavar
    if o.kind == "flag":
        return click.option(*o.flags, o.name, is_flag=True, default=o.default, **kw)
    types: dict[str, Any] = {"int": int, "float": float, "str": None, "path": click.Path(path_type=Path),
                             "file": click.Path(exists=True, dir_okay=False), "bool": None}
    if o.kind == "int" and (o.lo is not None or o.hi is not None):
        kw["type"] = click.IntRange(o.lo, o.hi)
    elif o.kind == "choice":
        kw["type"] = click.Choice(list(o.choices))
    elif types[o.kind] is not None:
        kw["type"] = types[o.kind]
    return click.option(*o.flags, o.name, default=o.default, multiple=o.multiple, **kw)


def run_options(f: Any) -> Any:
    """Every option of `evalsup run`, from evalsup.options.RUN_OPTIONS (the one definition)."""
    for o in reversed(RUN_OPTIONS):
        f = _click_option(o)(f)
    return f


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
@run_options
def run(tasks: Path, **kw: Any) -> None:
    """Send every task in TASKS (JSONL) to the endpoint; results go to TASKS.run/results.jsonl.

    TASKS holds OpenAI Batch API lines ({"custom_id", "method", "url", "body"}) or simple lines
    ({"id", "messages"} or {"id", "prompt"}, sent to /v1/chat/completions with --model). Other keys of
    a line are copied to its record's "metadata". Rerunning the same command after a crash or a stop
    resumes where the run left off: every task ends up in results.jsonl exactly once.

    TASKS may also be gzip or zstandard compressed (.jsonl.gz, .jsonl.zst), a FIFO, or - for stdin (with
    --out): it is streamed once into the run directory's own copy, RUN_DIR/tasks.jsonl, which the run reads.

    Exit codes: 0 done (failed requests are records, not errors), 1 the run could not go on,
    2 bad input or settings, 130 interrupted.
    """
    from evalsup.inputs import InputError, classify, materialize

    try:
        cfg = build_config(tasks, kw)
        src = classify(tasks)
        if src.kind == "stdin" and kw["out"] is None:
            raise ConfigError("reading tasks from stdin (-) needs --out RUN_DIR (where its copy and the results go)")
    except (ConfigError, InputError) as e:
        _fail(str(e))
    if cfg.fresh:
        _move_aside(cfg.run_dir)
    if src.kind != "file":
        try:
            cfg = dataclasses.replace(cfg, tasks_path=materialize(src, cfg.run_dir, log=_note))
        except InputError as e:
            _fail(str(e))
    from evalsup.supervisor.run import run as run_job

    sys.exit(run_job(cfg))


def _note(msg: str) -> None:
    click.echo(f"evalsup: {msg}", err=True)


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
        cfg = build_config(tasks, {"base_url": mock.url, "workers": workers, "concurrency": concurrency,
                                   "model": "mock-model", "api_key_env": "EVALSUP_DEMO_NO_KEY"})
        from evalsup.supervisor.run import run as run_job

        code = run_job(cfg)
    if code == 0:
        _next_steps(cfg.run_dir)
    sys.exit(code)


def _next_steps(run_dir: Path) -> None:
    click.echo(f"""
next steps:
  evalsup status {run_dir}      progress of a run (from another shell, while it goes)
  evalsup report {run_dir}      one HTML page: memory, request rate, latency
  evalsup run --base-url http://HOST:PORT/v1 --model MODEL tasks.jsonl      against your own server
  python: evalsup.run(tasks, ...) runs a job, evalsup.read_results("{run_dir}") streams its records
          (README: Python)""",
               err=True)


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
def mock(host: str, port: int, latency_ms: float, jitter_ms: float, response_kb: float, fail_500: float,
         fail_429: float, retry_after: float, reset: float, malformed: float, seed: int) -> None:
    """Serve an OpenAI-compatible mock endpoint with fault injection (for tests and benchmarks)."""
    from evalsup.mock.server import MockConfig, serve_forever

    cfg = MockConfig(latency_ms=latency_ms, jitter_ms=jitter_ms, response_kb=response_kb, fail_500=fail_500,
                     fail_429=fail_429, retry_after_s=retry_after, reset=reset, malformed=malformed, seed=seed)
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
