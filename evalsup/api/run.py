"""``evalsup.run(...)``: the CLI's run, from Python.

The run goes in a child process (``python -m evalsup run ... --json``), exactly as the CLI runs it: the same run
directory, checkpoint and resume, and no event loop in the caller's process, so it works from a script and from
a Jupyter notebook whose loop is already running. Ctrl-C (a kernel interrupt) is passed on to the child as
SIGINT; it checkpoints and exits, and then KeyboardInterrupt is raised: calling ``run`` again resumes.

Tasks given as an iterable of dicts are streamed into the run directory's own ``tasks.jsonl`` first (a chunk
at a time, flat memory), so a resume works the same way as for a file.
"""

from __future__ import annotations

import collections
import inspect
import os
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsup.api.exceptions import BadInput, BadSettings, RunStopped, error_for_exit
from evalsup.api.results import Record, read_results, to_pandas
from evalsup.config.options import API_OPTIONS, BY_NAME, DEFAULTS, python_type
from evalsup.rundir.layout import INPUT_COPY


@dataclass(frozen=True)
class Judge:
    """The model-graded scorer's settings for ``evalsup.run(..., judge=Judge(...))``: the same as the
    ``judge_*`` keywords (``--judge-*`` options), and ``"judge"`` is added to the scorers. ``api_key_env`` names
    the variable that holds the judge's key (never the key itself)."""

    base_url: str
    model: str | None = None
    api_key_env: str | None = None
    template: str | os.PathLike[str] | None = None
    concurrency: int | None = None
    max_tokens: int | None = None
    timeout: float | None = None

    def options(self) -> dict[str, Any]:
        """As ``evalsup.run``'s keywords (those set)."""
        out: dict[str, Any] = {"judge_base_url": self.base_url, "judge_model": self.model,
                               "judge_api_key_env": self.api_key_env,
                               "judge_template": None if self.template is None else os.fspath(self.template),
                               "judge_concurrency": self.concurrency, "judge_max_tokens": self.max_tokens,
                               "judge_timeout": self.timeout}
        return {k: v for k, v in out.items() if v is not None}


def _with_judge(options: dict[str, Any]) -> dict[str, Any]:
    """``judge=Judge(...)`` (or a dict of its fields) as the judge_* keywords, with "judge" among the scorers."""
    judge = options.pop("judge", None)
    if judge is None:
        return options
    if isinstance(judge, dict):
        judge = Judge(**judge)
    if not isinstance(judge, Judge):
        raise TypeError(f"judge must be evalsup.Judge(...) or a dict of its fields, not {type(judge).__name__}")
    clash = sorted(k for k in judge.options() if k in options)
    if clash:
        raise TypeError(f"run() got both judge= and {', '.join(clash)}")
    scorers = options.get("scorers") or ()
    scorers = [scorers] if isinstance(scorers, str) else list(scorers)
    return {**options, **judge.options(), "scorers": scorers if "judge" in scorers else [*scorers, "judge"]}


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

    def records(self, *, ordered: bool = False, typed: bool = False) -> Iterator[Any]:
        """Every record, streamed (see evalsup.read_results)."""
        return read_results(self.run_dir, ordered=ordered, typed=typed)  # type: ignore[call-overload, no-any-return]

    def failed(self) -> Iterator[Record]:
        """The records of tasks that finally failed (``.error`` says why), streamed."""
        return (r for r in read_results(self.run_dir, typed=True) if not r.ok)

    def to_pandas(self, *, ordered: bool = False) -> Any:
        return to_pandas(self.run_dir, ordered=ordered)


def _argv(options: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for name, value in options.items():
        o = BY_NAME[name]
        if value is None or (o.kind == "flag" and not value):
            continue
        args += o.argv(value)
    return args


def _check_settings(task_arg: str, options: dict[str, Any]) -> None:
    """Parse the arguments as the CLI will, in this process, so a bad value raises BadSettings at once with
    the CLI's message, before any task is copied or a process started."""
    import click

    from evalsup.cli.main import given_options
    from evalsup.cli.main import run as run_command
    from evalsup.config.run_config import ConfigError
    from evalsup.rundir.run_json import resume_config

    try:
        ctx = run_command.make_context("evalsup run", [task_arg, *_argv(options)])
    except click.ClickException as e:
        raise BadSettings(e.format_message()) from None
    if ctx.params.get("out") is None and task_arg == "-":
        raise BadSettings("reading tasks from stdin (-) needs out=RUN_DIR (where its copy and the results go)")
    try:  # as the CLI will: a keyword left out (None) takes, on a resume, the run's recorded request setting
        resume_config(Path(task_arg), given_options(ctx, ctx.params))
    except ConfigError as e:
        raise BadSettings(str(e)) from None


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


def _supervise(cmd: list[str], stdin: bool, tmp: Path, progress: bool, env: dict[str, str] | None = None
               ) -> tuple[int, dict[str, Any] | None, collections.deque[str]]:
    """Run ``cmd`` (an `evalsup run`) to its end; its exit code, --json summary and last stderr lines.

    Its output goes to files, not pipes: a run whose caller died (SIGTERM from _die_with_parent) must still be
    able to write its log lines while it drains. Its own session: a Ctrl-C at a terminal reaches it once,
    through us, as SIGINT (it stops at once and checkpoints), and then KeyboardInterrupt is raised here."""
    err_path, out_path = tmp / "stderr", tmp / "stdout"
    with open(err_path, "wb") as err_f, open(out_path, "wb") as out_f:
        proc = subprocess.Popen(cmd, stdin=None if stdin else subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                env={**_child_env(), **(env or {})}, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
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


def _last_message(lines: Iterable[str]) -> str:
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


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when this process dies (a killed notebook kernel, a kill -9), so
    the run drains and checkpoints instead of going on unwatched; a later call resumes it. (Linux may send it
    twice, from each of a multi-threaded caller's dying threads in turn: then the run stops at once, 143,
    checkpointed all the same.)"""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _echo(msg: str) -> None:
    sys.stderr.write(f"evalsup: {msg}\n")
    sys.stderr.flush()


def _credentials_off_the_command_line(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Base URLs holding user:password@ (issue 34) go to the child as OPENAI_BASE_URL, not on its command line,
    which any process title shows; (the options without them, the child's extra environment)."""
    urls = options.get("base_url") or []
    if not any("@" in urllib.parse.urlsplit(u).netloc for u in urls) or any("," in u for u in urls):
        return options, {}
    return {**options, "base_url": None}, {"OPENAI_BASE_URL": ",".join(urls)}


def _child_env() -> dict[str, str]:
    """The caller's environment, with this evalsup importable in the child (a source tree as much as a wheel)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run(tasks: str | os.PathLike[str] | Iterable[dict[str, Any]], *, progress: bool = True,
        **options: Any) -> RunResult:
    """Run every task to its record, as ``evalsup run`` does, and return the result (see the module's doc).

    ``tasks``: a task file (.jsonl, .jsonl.gz, .jsonl.zst, a FIFO, "-" for stdin) or any iterable of task dicts
    (a list, a generator, a datasets.Dataset, ``df.to_dict("records")``; then ``out`` is required).
    The keyword options are `evalsup run`'s (``evalsup run --help``), with the same names and defaults; calling
    it again resumes, and a request option left out (model, max_tokens, temperature, stream, scorers...) then
    takes the value the run recorded in its run.json.
    Raises BadInput, BadSettings, RunStopped (``.code``, ``.resumable``) or EndpointUnavailable.
    """
    options = _with_judge(options)  # judge=Judge(...): the judge_* keywords
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
    options, env = _credentials_off_the_command_line(options)
    cmd = [sys.executable, "-m", "evalsup", "run", task_arg, *_argv(options), "--json"]
    if not progress:
        cmd.append("--quiet")
    with tempfile.TemporaryDirectory(prefix="evalsup-run-") as tmp:
        code, summary, err_lines = _supervise(cmd, task_arg == "-", Path(tmp), progress, env)
    err = error_for_exit(code, _last_message(err_lines))
    if err is not None:
        raise err
    if summary is None:
        raise RunStopped(_last_message(err_lines) or "the run printed no summary", code)
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
