"""``evalsup.run(...)``: the CLI's run, from Python.

The run goes in a child process (``python -m evalsup run ... --json``), exactly as the CLI runs it: the same run
directory, checkpoint and resume, and no event loop in the caller's process, so it works from a script and from
a Jupyter notebook whose loop is already running. Ctrl-C (a kernel interrupt) is passed on to the child as
SIGINT; it checkpoints and exits, and then KeyboardInterrupt is raised: calling ``run`` again resumes.

Tasks given as an iterable of dicts are streamed into the run directory's own ``tasks.jsonl`` first (a chunk
at a time, flat memory), so a resume works the same way as for a file.
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsup.api.exceptions import BadInput, BadSettings, RunStopped, error_for_exit
from evalsup.api.options import credentials_off_the_command_line, schema_inline, with_judge, write_schema
from evalsup.api.results import Record, read_results, to_pandas
from evalsup.common.child import last_message, run_child
from evalsup.config.options import API_OPTIONS, BY_NAME, DEFAULTS, argv_of, python_type
from evalsup.rundir.layout import INPUT_COPY


@dataclass(frozen=True)
class RunResult:
    """A finished run: its summary (summary.json), its directory, and its records."""

    summary: dict[str, Any]
    run_dir: Path

    @property
    def total(self) -> int:
        return int(self.summary["total"])

    @property
    def succeeded(self) -> int:
        return int(self.summary["succeeded"])

    @property
    def n_failed(self) -> int:
        return int(self.summary["failed"])

    @property
    def scores(self) -> dict[str, Any]:
        """Per scorer: count, mean, errors, and for 0/1 scores accuracy with its 95 % interval (ci95)."""
        return dict(self.summary.get("scores") or {})

    @property
    def groups(self) -> dict[str, Any]:
        """With group_by: per group, its tasks, failures and scores as ``scores`` has them (summary.json's
        ``groups.groups``); empty without."""
        return dict((self.summary.get("groups") or {}).get("groups") or {})

    def records(self, *, ordered: bool = False, typed: bool = False) -> Iterator[Any]:
        """Every record, streamed (see evalsup.read_results)."""
        return read_results(self.run_dir, ordered=ordered, typed=typed)  # type: ignore[call-overload, no-any-return]

    def failed(self) -> Iterator[Record]:
        """The records of tasks that finally failed (``.error`` says why), streamed."""
        return (r for r in read_results(self.run_dir, typed=True) if not r.ok)

    def to_pandas(self, *, ordered: bool = False, group_by: str | None = None) -> Any:
        """The records as a DataFrame (see evalsup.to_pandas); with the run's group_by (or ``group_by``) a
        ``group`` column."""
        by = group_by or (self.summary.get("groups") or {}).get("by")
        return to_pandas(self.run_dir, ordered=ordered, group_by=by)


def _check_settings(task_arg: str, options: dict[str, Any]) -> None:
    """Parse the arguments as the CLI will, in this process, so a bad value raises BadSettings at once with
    the CLI's message, before any task is copied or a process started."""
    import click

    from evalsup.cli.main import given_options
    from evalsup.cli.main import run as run_command
    from evalsup.config.run_config import ConfigError
    from evalsup.rundir.run_json import resume_config

    try:
        ctx = run_command.make_context("evalsup run", [task_arg, *argv_of(options)])
    except click.ClickException as e:
        raise BadSettings(e.format_message()) from None
    if ctx.params.get("out") is None and task_arg == "-":
        raise BadSettings("reading tasks from stdin (-) needs out=RUN_DIR (where its copy and the results go)")
    try:  # as the CLI will: a keyword left out (None) takes, on a resume, the run's recorded request setting
        resume_config(Path(task_arg), given_options(ctx, ctx.params))
    except ConfigError as e:
        raise BadSettings(str(e)) from None


def _echo(msg: str) -> None:
    sys.stderr.write(f"evalsup: {msg}\n")
    sys.stderr.flush()


def run(tasks: str | os.PathLike[str] | Iterable[dict[str, Any]], *, progress: bool = True,
        **options: Any) -> RunResult:
    """Run every task to its record, as ``evalsup run`` does, and return the result (see the module's doc).

    ``tasks``: a task file (.jsonl, .jsonl.gz, .jsonl.zst, a FIFO, "-" for stdin) or any iterable of task dicts
    (a list, a generator, a datasets.Dataset, ``df.to_dict("records")``; then ``out`` is required).
    The keyword options are `evalsup run`'s (``evalsup run --help``), with the same names and defaults; calling
    it again resumes, and a request option left out (model, max_tokens, temperature, stream, scorers...) then
    takes the value the run recorded in its run.json.
    ``response_schema`` may also be a JSON schema as a dict, or a pydantic model class (its
    ``model_json_schema()``), besides a file's path.
    Raises BadInput, BadSettings, RunStopped (``.code``, ``.resumable``) or EndpointUnavailable.
    """
    options = with_judge(options)  # judge=Judge(...): the judge_* keywords (evalsup.api.options)
    schema = options.get("response_schema")
    if not schema_inline(schema):
        return _run(tasks, progress, options)
    # the CLI takes a file: the schema is written to one for the run (run.json records the schema itself, so a
    # later call with the same model resumes)
    with tempfile.TemporaryDirectory(prefix="evalsup-schema-") as tmp:
        path = write_schema(schema, Path(tmp) / "response_schema.json")
        return _run(tasks, progress, {**options, "response_schema": path})


def _run(tasks: str | os.PathLike[str] | Iterable[dict[str, Any]], progress: bool,
         options: dict[str, Any]) -> RunResult:
    bad = [k for k in options if k not in BY_NAME or not BY_NAME[k].api]
    if bad:
        raise TypeError(f"run() got unexpected keyword argument(s): {', '.join(sorted(bad))}")
    if isinstance(options.get("base_url"), str):  # one endpoint, or a list of them (issue 21)
        options["base_url"] = [options["base_url"]]
    if isinstance(tasks, str | os.PathLike):
        task_arg = os.fspath(tasks)
        _check_settings(task_arg, options)
    elif isinstance(tasks, bytes | dict) or not isinstance(tasks, Iterable):
        raise TypeError(f"tasks must be a path or an iterable of task dicts, not {type(tasks).__name__}")
    else:
        if options.get("out") is None:
            raise BadSettings("tasks given as an iterable need out=RUN_DIR: the run directory keeps their copy, "
                              "so that calling run() again resumes")
        out = Path(options["out"])
        _check_settings(str(out / INPUT_COPY), options)
        if options.pop("fresh", False):
            from evalsup.cli.main import _move_aside

            _move_aside(out)
        from evalsup.config.exitcodes import LOCKED
        from evalsup.rundir.inputs import InputError, InputKind, Source, iter_lines, materialize
        from evalsup.rundir.lock import RunDirBusy, RunDirError, holding

        try:
            with holding(out, "copy of the tasks given"):  # never under a run that reads the directory
                task_arg = str(materialize(Source(InputKind.ITERABLE, "the tasks given"), out, chunks=iter_lines(tasks),
                                           log=_echo if progress else None))
        except RunDirBusy as e:
            raise RunStopped(str(e), LOCKED, resumable=True) from None
        except (InputError, RunDirError) as e:
            raise BadInput(str(e)) from None
    options, env = credentials_off_the_command_line(options)
    cmd = [sys.executable, "-m", "evalsup", "run", task_arg, *argv_of(options), "--json"]
    if not progress:
        cmd.append("--quiet")
    with tempfile.TemporaryDirectory(prefix="evalsup-run-") as tmp:
        code, summary, err_lines = run_child(cmd, task_arg == "-", Path(tmp), progress, env)
    err = error_for_exit(code, last_message(err_lines))
    if err is not None:
        raise err
    if summary is None:
        raise RunStopped(last_message(err_lines) or "the run printed no summary", code)
    if not summary.get("finished", True):
        raise RunStopped(summary.get("stopped") or "the run stopped before every task had its record", code)
    return RunResult(summary, Path(summary["run_dir"]))


def _signature() -> inspect.Signature:
    params = [inspect.Parameter("tasks", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=True, annotation="bool")]
    params += [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=DEFAULTS[o.name],
                                 annotation=python_type(o)) for o in API_OPTIONS]
    params.append(inspect.Parameter("judge", inspect.Parameter.KEYWORD_ONLY, default=None,
                                    annotation="Judge | dict[str, Any] | None"))
    return inspect.Signature(params, return_annotation="RunResult")


run.__signature__ = _signature()  # type: ignore[attr-defined]  # help(evalsup.run) lists every option
run.__doc__ = (run.__doc__ or "") + "\n    Options:\n" + "".join(
    f"      {o.name}: {python_type(o)} = {DEFAULTS[o.name]!r}  ({o.flag}) {o.help}\n" for o in API_OPTIONS) + (
    "      judge: Judge | dict | None = None  the model-graded scorer's settings (evalsup.Judge): the judge_* "
    "options, and 'judge' among the scorers\n")
