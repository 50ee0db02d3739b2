"""The `evalsup` command: parse, build the config, call in. Nothing else lives here."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import cloup

from evalsup.cli.cache import cache_command
from evalsup.cli.config_file import META_KEY as CONFIG_META
from evalsup.cli.config_file import config_option
from evalsup.cli.mock import mock_command
from evalsup.cli.serve import serve_command
from evalsup.config.options import BY_NAME, GROUPS, Option, clash, env_var
from evalsup.config.run_config import ConfigError, build_config, retry_failed_task_file

_F = TypeVar("_F", bound=Callable[..., Any])


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"evalsup: {msg}", err=True)
    sys.exit(code)


class Evalsup(cloup.Group):
    """The `evalsup` group: a usage error (a flag misspelt, a value refused) is one line naming the command's
    --help, exit 2 (click's own is three lines of usage first)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        standalone = standalone_mode
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
            if standalone and isinstance(rv, int):  # click's own exit (--help, --version, a bare group): its code
                sys.exit(rv)
            return rv
        except click.UsageError as e:
            if not standalone:
                raise
            where = e.ctx.command_path if e.ctx is not None else "evalsup"
            click.echo(f"evalsup: {e.format_message()} (see {where} --help)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            if not standalone:
                raise
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            if not standalone:
                raise
            click.echo("Aborted!", err=True)
            sys.exit(1)


@cloup.group(cls=Evalsup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="evalsup")
def main() -> None:
    """Push 10k-1M requests through an OpenAI-compatible endpoint without running out of memory,
    losing results or starting over after a crash.

    \b
    evalsup demo                              try it against the built-in mock endpoint
    evalsup run --workers 4 tasks.jsonl       the real job, against $OPENAI_BASE_URL
    evalsup status tasks.run                  progress of a run, from another shell
    evalsup estimate tasks.jsonl              what a run would send and cost, before it starts
    evalsup serve --upstream URL --data DIR   OpenAI's Batch API (files, batches) in front of URL
    """


def _click_option(o: Option, env: bool = True, **extra: Any) -> Any:
    """The click decorator for one run option of the table in evalsup/config/options.py (its value may also come
    from $EVALSUP_<OPTION> when ``env``, or from a --config file). ``extra``: click's own (required=True)."""
    kw: dict[str, Any] = {"help": o.help, "hidden": o.hidden, **extra}
    if env and env_var(o) is not None:
        kw["envvar"] = env_var(o)
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
    if o.flag_value is not None:
        kw.update(is_flag=False, flag_value=o.flag_value)
    return click.option(*o.flags, o.name, default=o.default, multiple=o.multiple, **kw)


def table_option(name: str, param: str | None = None, required: bool = False,
                 **changes: Any) -> Callable[[_F], _F]:
    """A run option of the table as another command's option where it means the same thing (issue 44: one
    definition): ``param`` names the command's parameter (default: the option's name), ``changes`` what that
    command says otherwise (its default, range or help). Not read from $EVALSUP_<OPTION>: only `run` is."""
    o = dataclasses.replace(BY_NAME[name], **changes)
    if param is not None:
        o = dataclasses.replace(o, name=param)
    deco: Callable[[_F], _F] = _click_option(o, env=False, **({"required": True} if required else {}))
    return deco


def run_options(f: Any) -> Any:
    """Every option of `evalsup run`, from evalsup.config.options.RUN_OPTIONS (the one definition), in the help's
    sections (GROUPS: by what a person wants to do), then --config."""
    f = cloup.option_group("Settings from a file", config_option(), help="any option above, kept in TOML")(f)
    for g in reversed(GROUPS):
        f = cloup.option_group(g.title, *(_click_option(BY_NAME[n]) for n in g.names), help=g.help)(f)
    return f


def given_options(ctx: click.Context, values: dict[str, Any]) -> dict[str, Any]:
    """The run options the user gave (on the command line, or as evalsup.run's keywords), with their ``values``:
    not those click filled in with a default, which on a resume are the run's recorded request settings'
    (evalsup.rundir.run_json.resume_config)."""
    return {k: v for k, v in values.items() if k != "tasks" and ctx.get_parameter_source(k) not in (
        None, click.core.ParameterSource.DEFAULT)}


def _move_aside(run_dir: Path, quiet: bool = False, tasks: Path | None = None) -> None:
    """--fresh: move the run directory aside (never deleted), never from under a run that holds it. A --batch-api
    run's batches still at the provider are named, with the command that cancels them: this run pays again."""
    from evalsup.batch.journal import chunks_of
    from evalsup.batch.plan import Step
    from evalsup.config.exitcodes import BAD_INPUT, LOCKED
    from evalsup.rundir.lock import RunDirBusy, RunDirError, move_aside

    try:
        dest = move_aside(run_dir)
    except RunDirBusy as e:
        _fail(str(e), LOCKED)
    except (RunDirError, OSError) as e:
        _fail(str(e), BAD_INPUT)
    if dest is not None and not quiet:  # --quiet: the final line and what stops the run, nothing else
        click.echo(f"evalsup: --fresh: moved the old run directory to {dest}", err=True)
        running = [c.chunk for c in chunks_of(dest).values() if c.step is Step.CREATED]
        if running:
            how = f"evalsup cancel {dest}" + (f" --tasks {tasks}" if tasks is not None else "")
            click.echo(f"evalsup: --fresh: the old run's {len(running)} batch(es) not yet collected (chunks "
                       f"{', '.join(map(str, running[:10]))}) still run at the provider and are charged, and this "
                       f"run pays again for every task: `{how}` cancels them", err=True)


@main.command(formatter_settings=cloup.HelpFormatter.settings(col2_min_width=50))
@click.argument("tasks", type=click.Path(path_type=Path, dir_okay=False), required=False)
@run_options
def run(tasks: Path | None, **kw: Any) -> None:
    """Send every task in TASKS (JSONL) to the endpoint; results go to TASKS.run/results.jsonl.

    \b
    evalsup run --base-url http://localhost:8000/v1 --model MODEL tasks.jsonl

    TASKS holds OpenAI Batch API lines ({"custom_id", "method", "url", "body"}) or simple lines
    ({"id", "messages"} or {"id", "prompt"}, sent to /v1/chat/completions with --model). Other keys of
    a line are copied to its record's "metadata". Rerunning the same command after a crash or a stop
    resumes where the run left off: every task ends up in results.jsonl exactly once. A resume keeps the
    request settings recorded in RUN_DIR/run.json: a request flag left out (--model, --max-tokens,
    --temperature, --stream, --scorer...) takes the run's value; one given with another value is refused
    unless --accept-changed-settings.

    TASKS may also be gzip or zstandard compressed (.jsonl.gz, .jsonl.zst), a FIFO, or - for stdin (with
    --out): it is streamed once into the run directory's own copy, RUN_DIR/tasks.jsonl, which the run reads.

    Exit codes: 0 every task has its record (failed requests are records, not errors); 75 stopped before
    the end (signal, endpoint down, key refused, crash loop, disk full; a cap reached, exit_reason budget: rerun
    with a higher cap): rerun to resume; 2 bad input or
    settings (every task line is checked before the first request; an input with no task is exit 2 too);
    73 another evalsup holds the run directory; 1 anything else.
    """
    from evalsup.rundir.inputs import InputError, InputKind, classify, materialize
    from evalsup.rundir.run_json import resume_config
    from evalsup.supervisor import early_signals as earlysignals

    # `--retry-failed tasks.jsonl`: the flag without codes; the codes are parsed once, by build_config (before
    # the Ray branch: a shard's command gets the file as TASKS and the bare flag)
    tasks, kw["retry_failed"] = retry_failed_task_file(tasks, kw["retry_failed"])
    if kw["ray"] is not None or kw["shards"] is not None:
        _run_on_ray(tasks, kw)
    earlysignals.hold()  # a SIGTERM from here on still ends in a checkpoint and exit 75
    if tasks is None:
        _fail("missing TASKS (the task file); see evalsup run --help")
    assert tasks is not None
    try:
        cfg, resumed = resume_config(tasks, given_options(click.get_current_context(), kw))
        src = classify(tasks)
        if src.kind == InputKind.STDIN and kw["out"] is None:
            raise ConfigError("reading tasks from stdin (-) needs --out RUN_DIR (where its copy and the results go)")
    except (ConfigError, InputError) as e:
        _fail(str(e))
    if kw["resume"]:
        from evalsup.rundir.layout import is_run_dir

        if not is_run_dir(cfg.run_dir):
            _fail(f"--resume: nothing to resume in {cfg.run_dir} (no checkpoint, results or events there); leave "
                  "--resume out to start the run" + ("" if kw["out"] else ", or give --out RUN_DIR if it is elsewhere"))
    config_used = click.get_current_context().meta.get(CONFIG_META)
    # said by the run once it holds the run directory and its settings pass: a refusal comes first (issue 44)
    notes = [f"settings from {config_used}"] if config_used else []
    if resumed is not None:  # request flags left out: the run's own settings, from run.json
        notes.append(resumed)
    if cfg.fresh:
        _move_aside(cfg.run_dir, cfg.quiet, tasks)
    if src.kind != InputKind.FILE:
        from evalsup.config.exitcodes import LOCKED
        from evalsup.rundir.lock import RunDirBusy, RunDirError, holding

        try:
            with holding(cfg.run_dir, "copy of the input"):  # never under a run that reads the directory
                cfg = dataclasses.replace(cfg, tasks_path=materialize(src, cfg.run_dir,
                                                                           log=None if cfg.quiet else _note))
        except RunDirBusy as e:
            _fail(str(e), LOCKED)
        except (InputError, RunDirError) as e:
            _fail(str(e))
    from evalsup.supervisor.run import run as run_job

    sys.exit(run_job(cfg, notes))


def _run_on_ray(tasks: Path | None, kw: dict[str, Any]) -> None:
    """`run --ray [ADDRESS] --shards N`: the shards as Ray tasks (evalsup.ray.driver); exits with its code."""
    if tasks is None and kw["ray"] not in (None, "default") and Path(kw["ray"]).is_file():
        tasks, kw["ray"] = Path(kw["ray"]), "default"  # `--ray tasks.jsonl`: the address is optional
    why = clash(kw)  # the option table's needs/conflicts: --shards needs --ray, --shard cannot go with it...
    if why is not None:
        _fail(why)
    if tasks is None:
        _fail("missing TASKS (the task file); see evalsup run --help")
    assert tasks is not None
    from evalsup.ray.driver import RayRunError, run_on_ray

    given = given_options(click.get_current_context(), kw)
    try:
        code = run_on_ray(tasks, given, address=kw["ray"], n=kw["shards"], retries=kw["ray_retries"],
                          quiet=kw["quiet"], interval=kw["log_interval"], json_summary=kw["json_summary"],
                          say=lambda m: _note(m, kw["log_format"]))
    except RayRunError as e:
        _fail(str(e), e.code)
    sys.exit(code)


def _note(msg: str, log_format: str = "text") -> None:
    if log_format == "json":  # as the run's own log lines (--log-format json)
        import time

        import orjson

        click.echo(orjson.dumps({"t": round(time.time(), 3), "level": "info", "msg": msg}).decode(), err=True)
    else:
        click.echo(f"evalsup: {msg}", err=True)


DEMO_MAX_TOKENS = 512  # the demo's max_tokens: above the mock's ~1 KB answers (~256 tokens), so none is cut


@main.command()
@click.option("--tasks", "n", type=click.IntRange(1, 10_000_000), default=2000, show_default=True,
              help="Sample tasks to make.")
@table_option("workers", default=4, hi=64, show_default=True, help="Worker processes (as for `evalsup run --workers`).")
@table_option("concurrency", default=64, hi=10_000, show_default=True,
              help="Requests in flight in total, split among the workers.")
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
        # the mock is one's own endpoint (no cost), and its answers are bounded as a user's should be (issue 40)
        cfg = build_config(tasks, {"base_url": mock.url, "workers": workers, "concurrency": concurrency,
                                   "model": "mock-model", "api_key_env": "EVALSUP_DEMO_NO_KEY",
                                   "max_tokens": DEMO_MAX_TOKENS, "self_hosted": True})
        from evalsup.supervisor.run import run as run_job

        code = run_job(cfg)
    if code == 0:
        _next_steps(cfg.run_dir)
    sys.exit(code)


def evalsup_command() -> str:
    """How to run this very evalsup from a shell, as printed (issue 44): ``evalsup`` when that is what PATH
    finds, else the interpreter's own script (a venv's bin/evalsup, not on PATH after scripts/demo), else
    ``PYTHON -m evalsup``."""
    import shlex
    import shutil

    here = Path(sys.executable).parent / "evalsup"
    on_path = shutil.which("evalsup")
    if here.is_file() and os.access(here, os.X_OK):
        if on_path is not None and Path(on_path).resolve() == here.resolve():
            return "evalsup"
        return shlex.quote(str(here))
    return f"{shlex.quote(sys.executable)} -m evalsup"


def _next_steps(run_dir: Path) -> None:
    import shlex

    cmd, where = evalsup_command(), shlex.quote(str(run_dir))
    click.echo(f"""
next steps:
  {cmd} status {where}      progress of a run (from another shell, while it goes)
  {cmd} report {where}      one HTML page: memory, request rate, latency
  {cmd} run --base-url http://HOST:PORT/v1 --model MODEL tasks.jsonl      against your own server
  python: evalsup.run(tasks, ...) runs a job, evalsup.read_results("{run_dir}") streams its records
          (docs/evaluations.md: Python)""",
               err=True)


main.add_command(mock_command)  # `evalsup mock`: evalsup/cli/mock.py
main.add_command(cache_command)  # `evalsup cache ...`: evalsup/cli/cache.py (issue 30)
main.add_command(serve_command)  # `evalsup serve`: evalsup/cli/serve.py (issue 42)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
@table_option("scorers", required=True, help="Scorer to apply (repeatable), as for `evalsup run --scorer`.")
@click.option("--workers", "-w", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Processes scoring in parallel.")
@table_option("ignore_case")
@table_option("no_strip")
@table_option("normalize")
@table_option("regex", param="pattern")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to write (default: RUN_DIR/results.scored.jsonl).")
@table_option("judge_base_url",
              help="--scorer judge: the judge's endpoint (asked for each answer; the run's endpoints never are).")
@table_option("judge_model", help="--scorer judge: the judge's model.")
@table_option("judge_api_key_env",
              help="--scorer judge: environment variable that holds the judge's key (default: OPENAI_API_KEY).")
@table_option("judge_template")
@table_option("judge_concurrency", help="--scorer judge: judge requests in flight at most.")
@table_option("judge_max_tokens")
@table_option("judge_timeout")
@click.option("--tasks", "tasks_file", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="--scorer judge: the run's task file, for each answer's prompt (default: the one the run read).")
@table_option("group_by", help="Scores per group of this metadata key too (e.g. metadata.subject).")
@table_option("max_cost",
              help="--scorer judge: stop before the judge's spend could pass this (its model must have a price); "
                   "exit 75, what was scored kept: rerun with a higher cap to go on.")
@table_option("max_total_tokens",
              help="--scorer judge: stop before the judge's prompt + completion tokens could pass N (exit 75, as "
                   "--max-cost).")
@table_option("check", help="--scorer judge: ask the judge's endpoint first (reachable, its key taken, its model "
                            "served) and stop in one line if not (default); --no-check skips it, as for evalsup run.")
@table_option("prices", param="prices_file",
              help="--max-cost: prices over the maintained and shipped ones (as for evalsup run).")
def score(run_dir: Path, scorers: tuple[str, ...], workers: int, ignore_case: bool, no_strip: bool,
          normalize: bool, pattern: str | None, output: Path | None, judge_base_url: str | None = None,
          judge_model: str | None = None, judge_api_key_env: str | None = None, judge_template: Path | None = None,
          judge_concurrency: int = 16, judge_max_tokens: int | None = None, judge_timeout: float = 900.0,
          tasks_file: Path | None = None, group_by: str | None = None, max_cost: str | None = None,
          max_total_tokens: str | None = None, prices_file: Path | None = None, check: bool = True) -> None:
    """Score an existing run's results again, without sending any request to its endpoints.

    Streams RUN_DIR/results.jsonl through WORKERS processes and writes each record with its new "scores"
    to a new file beside it; prints the per-scorer summary (also written to scores.json). With --scorer
    judge, each answer is graded by the judge endpoint instead (in this process, --judge-concurrency requests
    at a time; the judge's reply kept in the record's score_detail, its tokens in scores.json's judge_usage).
    --group-by: the same per group too (printed, and in scores.json's "groups").
    """
    from evalsup.config.exitcodes import LOCKED, RESUMABLE
    from evalsup.rundir.lock import RunDirBusy, RunDirError, locked
    from evalsup.tools.judge_caps import caps_for
    from evalsup.tools.rescore import rescore
    from evalsup.tools.rescore_judge import CapReached

    usage = None
    try:
        if group_by is not None:  # refused before anything is scored (a judge costs requests)
            from evalsup.tasks.group_key import parse_group_by

            parse_group_by(group_by)
        with contextlib.ExitStack() as stack:
            # not while a run writes results.jsonl; a run directory we cannot write in is scored unlocked
            with contextlib.suppress(RunDirError):
                stack.enter_context(locked(run_dir, create=False, command="score"))
            if "judge" in scorers:
                from evalsup.tools.rescore_judge import judge_for_score, rescore_judge

                settings, others = judge_for_score(scorers, not no_strip, ignore_case, pattern, normalize,
                                                    judge_base_url, judge_model, judge_api_key_env, judge_template,
                                                    judge_concurrency, judge_max_tokens, judge_timeout)
                caps = caps_for(settings.model, judge_max_tokens, max_cost, max_total_tokens, prices_file)
                summary, usage = rescore_judge(run_dir, others, settings, output, tasks_file, caps=caps,
                                               check=check)
                if group_by is not None:  # per group, from the records just written (one streamed pass)
                    from evalsup.rundir.layout import SCORED
                    from evalsup.tools.report.scan import scan_results

                    scan = scan_results(output or run_dir / SCORED, group_by)
                    if scan.groups is not None:
                        summary = {**summary, "groups": scan.groups.summary()}
            else:
                summary = rescore(run_dir, list(scorers), workers, not no_strip, ignore_case, pattern, output,
                                  normalize=normalize, group_by=group_by)
    except RunDirBusy as e:
        _fail(str(e), LOCKED)
    except CapReached as e:
        _fail(str(e), RESUMABLE)
    except (ValueError, OSError) as e:
        _fail(str(e))
    from rich.console import Console

    from evalsup.supervisor.summary import judge_rows, print_groups, print_scores

    groups = summary.pop("groups", None)
    print_scores(summary, Console())
    if groups:
        print_groups(groups, Console())
    for k, v in judge_rows(usage):
        click.echo(f"{k}: {v}")


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="The merged results file; its summary goes beside it as NAME.summary.json.")
@click.option("--tasks", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="The task file: check that the shards were made from this very file and that every task "
                   "appears exactly once.")
@click.option("--sort", is_flag=True, help="Write results in input order (needs --tasks).")
def merge(run_dirs: tuple[Path, ...], output: Path, tasks: Path | None, sort: bool) -> None:
    """Merge the results of shard runs (RUN_DIRs, or a directory holding shard-K-of-N/ run directories).

    Before writing anything it proves coverage from the checkpoints: every shard-K-of-N for K in 0..N-1
    present and finished, all made from the same input (and from --tasks, if given). Otherwise, or when an
    id is missing or appears twice, it exits 1 listing each missing or incomplete shard (done/total) or the
    ids, and leaves an earlier OUTPUT untouched (the merge is written to a temporary file, renamed at the end).
    Moved-aside directories (*.old-*, from run --fresh) are left out.
    """
    import orjson

    from evalsup.common.tty_progress import TtyProgress
    from evalsup.rundir.checkpoint import write_atomic
    from evalsup.tools.coverage import coverage_problems
    from evalsup.tools.merge import MergeError, find_run_dirs, merged_summary
    from evalsup.tools.merge import merge as do_merge

    try:
        dirs = find_run_dirs(list(run_dirs))
        problems = coverage_problems(dirs, tasks)
        if problems:
            click.echo(f"evalsup: merge refused: the run directories do not cover the input ({len(problems)} "
                       f"problem(s)); {output} was not written", err=True)
            for p in problems:
                click.echo(f"  {p}", err=True)
            sys.exit(1)
        progress = TtyProgress("records merged")  # on a terminal only
        try:
            rep = do_merge(dirs, output, tasks, sort, tick=progress.tick)
        finally:
            progress.close()
    except (MergeError, OSError) as e:
        _fail(str(e), 1)
    if rep.complete:
        summary = merged_summary(rep, dirs)
        write_atomic(output.with_name(output.stem + ".summary.json"), orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        click.echo(f"merged {len(dirs)} run directories: {rep.records:,} results ({rep.succeeded:,} ok, "
                   f"{rep.failed:,} failed) -> {output}")
    else:
        click.echo(f"evalsup: merge failed; {output} was not written", err=True)
    if rep.duplicate_count:
        click.echo(f"evalsup: {rep.duplicate_count} duplicated id(s): {', '.join(rep.duplicates)}", err=True)
    if rep.missing_count:
        click.echo(f"evalsup: {rep.missing_count} task(s) of {tasks} have no result: {', '.join(rep.missing)}"
                   + (" ..." if rep.missing_count > len(rep.missing) else ""), err=True)
    if not rep.complete:
        sys.exit(1)


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object (for scripts).")
def status(run_dir: Path, as_json: bool) -> None:
    """Where a run stands, read-only: state and why, done/ok/failed/invalid, outstanding task ids, rate and
    ETA while it runs, its settings. RUN_DIR may also be the parent of shard-K-of-N/ directories (one row a
    shard, a total and the missing shards). Fast on any size: figures come from the checkpoint and the tails
    of the files, never a full read of results.jsonl.
    """
    from evalsup.rundir.results_file import check_run_dir

    damaged = check_run_dir(run_dir)  # a damaged results.jsonl: one line naming results.jsonl:LINE, exit 2
    if damaged is not None:
        _fail(damaged)
    if as_json:
        import orjson

        from evalsup.tools.status import status as status_dict

        click.echo(orjson.dumps(status_dict(run_dir), option=orjson.OPT_INDENT_2).decode())
    else:
        from evalsup.tools.status import status_text

        click.echo(status_text(run_dir))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--tasks", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="The run's task file (default: RUN_DIR's own copy, or RUN_DIR without its .run suffix).")
@table_option("base_url", help="The endpoint (default: $OPENAI_BASE_URL, else the run's last endpoint from run.json).")
@table_option("api_key_env")
@table_option("quiet", help="Print only the final line.")
def cancel(run_dir: Path, tasks: Path | None, base_url: tuple[str, ...], api_key_env: str, quiet: bool) -> None:
    """Cancel the batches of a --batch-api run at the provider, record what they finished, and stop.

    The run resumes long enough to cancel each batch it created, wait for the provider to end it, and write
    the records of the requests it answered; the rest stay outstanding (exit 75): rerunning the run's
    command sends them again. The run must be stopped (Ctrl-C or SIGTERM leave its batches running): a run
    still going holds the directory (exit 73). Exit codes as `evalsup run`'s.
    """

    from evalsup.batch.journal import run_id_of
    from evalsup.rundir.layout import INPUT_COPY
    from evalsup.rundir.run_json import read_run_json, resume_config
    from evalsup.supervisor import early_signals as earlysignals

    earlysignals.hold()
    if run_id_of(run_dir) is None:
        _fail(f"{run_dir}: not a --batch-api run (no batches.jsonl): nothing to cancel")
    if tasks is None:
        stem = run_dir.with_suffix("") if run_dir.suffix == ".run" else None  # TASKS.run <- TASKS.jsonl[.gz|.zst]
        guesses = [run_dir / INPUT_COPY] + ([stem.with_name(stem.name + x) for x in (".jsonl", ".jsonl.gz",
                                                                                   ".jsonl.zst")] if stem else [])
        tasks = next((g for g in guesses if g.is_file()), None)
    if tasks is None:
        _fail(f"{run_dir}: cannot tell the run's task file; give it with --tasks")
    assert tasks is not None
    urls: list[str] = list(base_url)
    if not urls and not os.environ.get("OPENAI_BASE_URL"):
        rec = read_run_json(run_dir) or {}
        urls = [str(u) for u in rec.get("endpoints") or []]
    given: dict[str, Any] = {"out": run_dir, "batch_api": True, "batch_cancel": True, "api_key_env": api_key_env,
                             "quiet": quiet, "check": False}
    if urls:
        given["base_url"] = urls
    try:
        cfg, _ = resume_config(tasks, given)
    except ConfigError as e:
        _fail(str(e))
    from evalsup.supervisor.run import run as run_job

    sys.exit(run_job(cfg))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where to write the page (default: RUN_DIR/report.html).")
@click.option("--group-by", "group_by", default=None, metavar="metadata.KEY",
              help="Scores per group of this metadata key too (default: the run's own --group-by).")
def report(run_dir: Path, output: Path | None, group_by: str | None) -> None:
    """Write one self-contained HTML page (opens offline) of a run: figures and settings, scores (by group:
    a table and a chart), throughput whole and per session, finish reasons, rate/tokens/errors over time,
    latency, TTFT/ITL, output lengths, failed and slowest tasks, memory."""
    from evalsup.tools.report import ReportError, write_report

    try:
        click.echo(f"report written to {write_report(run_dir, output, group_by)}")
    except ReportError as e:
        _fail(str(e), 1)


@main.command()
@click.argument("tasks", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--base-url", default=None, metavar="URL",
              help="The endpoint: its /tokenize (vLLM, SGLang) counts the prompt tokens. Without it, or when it "
                   "has none, they are estimated as characters / 4 (marked ≈).")
@table_option("model", help="Model for lines whose body has none (as for evalsup run).")
@table_option("max_tokens", lo=0, help="max_tokens for requests that do not set it (as for evalsup run).")
@table_option("prices", help="Model prices (YAML or JSON: MODEL: {input, output, cached_input, cache_write, "
                             "cache_write_1h}, USD per million tokens) over evalsup's own table.")
@table_option("self_hosted", help="Your own endpoint: every model costs 0.")
@table_option("out", help="The run directory (default TASKS.run): its answers so far give the lengths seen, and the "
                          "estimate covers only the tasks still to do.")
@table_option("shard", help="Only the lines of this shard (as for evalsup run).")
@click.option("--tokenize-max", type=click.IntRange(0), default=2000, show_default=True,
              help="Requests whose prompt the endpoint counts; the rest are scaled by the ratio those showed.")
@table_option("api_key_env", help="Environment variable holding the key for /tokenize.")
@click.option("--cache", "cache_dir", type=click.Path(path_type=Path, file_okay=False), default=None, metavar="DIR",
              help="The answer cache the run will use (--cache DIR): requests it already answers are free (counted "
                   "apart), and its answers' lengths inform the completion band. Read only.")
@table_option("cache_model_id", help="As for evalsup run (the cache keys' model).")
@table_option("cache_salt", help="As for evalsup run (mixed into every cache key).")
@table_option("cache_length", help="As for evalsup run: an answer kept cut at its token limit is free too.")
@click.option("--json", "as_json", is_flag=True, help="Print the estimate as one JSON object.")
def estimate(tasks: Path, base_url: str | None, model: str | None, max_tokens: int | None, prices: Path | None,
             self_hosted: bool, out: Path | None, shard: str | None, tokenize_max: int, api_key_env: str,
             cache_dir: Path | None, cache_model_id: str | None, cache_salt: str, cache_length: bool,
             as_json: bool) -> None:
    """What a run of TASKS would send and cost: requests, prompt and completion tokens, and the cost, each as
    low / expected / high, by model. Streamed: flat memory on any size; no request but /tokenize.

    \b
    Completion tokens: low 0, expected half of max_tokens, high max_tokens (a request without max_tokens: the
    model's largest answer or context window from its price source, else unbounded: no high end, say
    --max-tokens); with answers already in the run directory, low is the shortest seen and expected the mean.
    With --cache DIR, the requests whose answer the cache holds are free (counted apart) and those answers'
    lengths count as seen; an answer kept that the run would not serve (damaged, an error) is a request. A
    model with no price says so (never counted as free). The prices: --prices FILE over genai-prices (pip
    install 'evalsup[prices]') over evalsup's own table, each named with its date. Exit 2 on a bad line or
    price file.
    """
    from evalsup.config.prices import PriceError, load_prices
    from evalsup.config.run_config import parse_shard, run_dir_of
    from evalsup.rundir.run_json import recorded_settings
    from evalsup.tasks.headers import HeaderError
    from evalsup.tasks.requests import RequestDefaults
    from evalsup.tools.estimate import EstimateError, endpoint_headers, estimate_text
    from evalsup.tools.estimate import estimate as do_estimate

    try:
        table = load_prices(prices, self_hosted)
        parsed_shard = parse_shard(shard)
        run_dir = run_dir_of(tasks, out, parsed_shard)
        rec = recorded_settings(run_dir) or {}  # a run begun: its own --model and --max-tokens
        defaults = RequestDefaults(model=model if model is not None else rec.get("model"),
                                   max_tokens=max_tokens if max_tokens is not None else rec.get("max_tokens"))
        headers = endpoint_headers(base_url, (), api_key_env, None) if base_url else None
        s = do_estimate(tasks, table, defaults, base_url=base_url, headers=headers, tokenize_max=tokenize_max,
                        run_dir=run_dir, shard=parsed_shard, cache_dir=cache_dir, cache_model_id=cache_model_id,
                        cache_salt=cache_salt, cache_length=cache_length)
    except (PriceError, ConfigError, EstimateError, HeaderError) as e:
        _fail(str(e))
    if as_json:
        import orjson

        click.echo(orjson.dumps(s, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(estimate_text(s))


@main.command()
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False, exists=True))
def repair(run_dir: Path) -> None:
    """Move the damaged lines of RUN_DIR/results.jsonl (not a record, or a second record for a task) to
    damaged.jsonl, so that the next `evalsup run` of the same command sends their tasks again, exactly once.

    Crash-safe; changes nothing when nothing is damaged. Exit 0 when done, 1 when it cannot write.
    """
    from evalsup.rundir.rewrite import repair as do_repair

    text, code = do_repair(run_dir)
    if code:
        _fail(text, code)
    click.echo(text)


if __name__ == "__main__":  # pragma: no cover
    main()
