"""Every option of a run, defined once: its name, flags, type, default and help.

The `evalsup run` command's click options (cli.py), `RunConfig`'s defaults and `build_config` (config.py), and
the keyword arguments of `evalsup.run(...)` (api.py) are all made from ``RUN_OPTIONS``; nothing restates a
default. A value given explicitly is used as given (``--max-wait-down 0`` is 0 s, not the default). An option
left out is not the same as its default given: on a resume, a request setting left out (--model, --max-tokens,
--stream, --scorer...) takes the value the run recorded in run.json (evalsup.rundir.run_json.resume_config), so
build_config's ``given`` holds only what the user gave.

This module is plain data (no click, no evalsup imports), so any side may import it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

OptionKind = Literal["int", "float", "str", "path", "file", "choice", "flag", "bool"]


@dataclass(frozen=True)
class Option:
    """One run option. ``name`` is the keyword of `evalsup.run` and the key in build_config's dict."""

    name: str
    flags: tuple[str, ...]  # click declarations: ("--workers", "-w"), or ("--check/--no-check",)
    kind: OptionKind
    default: Any = None
    help: str = ""
    show_default: bool = False
    lo: int | None = None  # int range (click.IntRange), either end may be open
    hi: int | None = None
    choices: tuple[str, ...] = ()
    multiple: bool = False
    flag_value: str | None = None  # the value of the flag given without one (its value is optional)
    metavar: str | None = None
    hidden: bool = False
    api: bool = True  # a keyword of evalsup.run (output settings of the CLI are not: the API sets them)
    pairs: bool = False  # repeatable N or KEY=N; evalsup.run also takes one number and a dict {KEY: N}

    @property
    def flag(self) -> str:
        """The long flag, e.g. "--max-wait-down" ("--check" for "--check/--no-check")."""
        return next(f for f in self.flags if f.startswith("--")).split("/")[0]

    def argv(self, value: Any) -> list[str]:
        """This option with ``value`` as command-line arguments (for a run in a child process)."""
        if self.kind == "flag":
            return [self.flag] if value else []
        if self.kind == "bool":
            on, off = self.flags[0].split("/")
            return [on if value else off]
        if self.multiple:
            return [a for v in self.values(value) for a in (self.flag, str(v))]
        return [self.flag, str(value)]

    def values(self, value: Any) -> list[Any]:
        """A repeatable option's values, one per flag. A ``pairs`` option also takes one value, a dict
        {KEY: N} (each item as KEY=N) and a list mixing them (evalsup.run's forms)."""
        if value is None:
            return []
        if not self.pairs:
            return list(value)
        if isinstance(value, Mapping):
            return [f"{k}={v}" for k, v in value.items()]
        if isinstance(value, str | int | float):
            return [value]
        return [x for v in value for x in self.values(v)]


RUN_OPTIONS: tuple[Option, ...] = (
    Option("base_url", ("--base-url",), "str", (), multiple=True, metavar="URL",
           help="Endpoint base URL including /v1, e.g. http://localhost:8000/v1 (default: $OPENAI_BASE_URL, which "
                "may be a comma-separated list). Repeatable: requests are spread over the endpoints, each with its "
                "own breaker (a dead one is ejected and probed until it is back)."),
    Option("workers", ("--workers", "-w"), "int", None, lo=1, hi=256,
           help="Worker processes (each an asyncio event loop with its own HTTP connections). "
                "Default: start with 1 and add one while every worker is CPU-bound (large "
                "responses, high rates), up to min(4, 2 x CPUs), fewer under a small memory limit."),
    Option("concurrency", ("--concurrency", "-c"), "int", None, lo=1, hi=100_000,
           help="Requests in flight in total, split evenly among the workers: fixed. Default: adaptive, between 1 "
                "and --max-concurrency, found from the server's latency, 429/503s, timeouts and (when it has them) "
                "its queue metrics."),
    Option("max_concurrency", ("--max-concurrency",), "int", 256, lo=1, hi=100_000, show_default=True,
           help="The most requests in flight the adaptive limit may reach (never past the memory cap)."),
    Option("server_metrics", ("--server-metrics",), "str", metavar="URL",
           help="The server's Prometheus metrics (vLLM, SGLang, TGI queue gauges) for the adaptive limit. Default: "
                "the server root's /metrics, when it has one; off: never."),
    Option("headers", ("--header",), "str", (), multiple=True, metavar="'NAME: VALUE'",
           help="Extra request header (repeatable). VALUE may be env:VAR or @FILE for secrets; values are never "
                "printed."),
    Option("window", ("--window",), "int", 0, lo=0, hi=100_000,
           help="Tasks handed to one worker ahead of its results (default 2 x its concurrency)."),
    Option("out", ("--out", "-o"), "path",
           help="Run directory (default: TASKS.run beside the task file)."),
    Option("fresh", ("--fresh",), "flag", False,
           help="Start over: move an existing run directory aside (never deleted) instead of resuming."),
    Option("retry_failed", ("--retry-failed",), "str", None, flag_value="*", metavar="[CODE,...]",
           help="Send again the tasks whose record is an error (only those with these error codes, e.g. "
                "http_500,timeout_total, when given): their records are replaced, not duplicated (the old ones go "
                "to replaced.jsonl). Works on a finished or a stopped run."),
    Option("accept_changed_settings", ("--accept-changed-settings",), "flag", False,
           help="Resume even though a request setting (--model, --max-tokens, --temperature, --stream, the "
                "endpoint's path, --scorer...) differs from the run's; the change is recorded in run.json."),
    Option("model", ("--model",), "str", help="Model for simple-form lines (and lines whose body has none)."),
    Option("max_tokens", ("--max-tokens",), "int", help="max_tokens for requests that do not set it."),
    Option("temperature", ("--temperature",), "float", help="temperature for requests that do not set it."),
    Option("max_attempts", ("--max-attempts",), "int", 8, lo=1, hi=100, show_default=True,
           help="Attempts a task may use up on failures of its own (connection errors, timeouts, 5xx, broken "
                "answers). Waiting on 429 / Retry-After and parking while the whole endpoint is down use none."),
    Option("max_rate_limited_wait", ("--max-rate-limited-wait",), "float", 1800.0, show_default=True,
           help="Seconds a task may spend waiting on 429 (and 503 with Retry-After) answers, which are the "
                "server's flow control and use no attempt; past it the task is written as failed (rate_limited)."),
    Option("timeout", ("--timeout",), "float", 600.0, show_default=True,
           help="Total seconds one attempt may take."),
    Option("connect_timeout", ("--connect-timeout",), "float", 10.0, show_default=True,
           help="Seconds to open a connection."),
    Option("read_timeout", ("--read-timeout",), "float", 120.0, show_default=True,
           help="Seconds to wait for the first byte, and between chunks."),
    Option("max_response_mb", ("--max-response-mb",), "float", 64.0, show_default=True,
           help="Larger responses become error records."),
    Option("max_line_mb", ("--max-line-mb",), "float", 16.0, show_default=True,
           help="Longer task lines are invalid."),
    Option("on_invalid", ("--on-invalid",), "choice", "error", choices=("error", "skip"), show_default=True,
           help="A bad task line stops the run (error), or is recorded in invalid.jsonl (skip)."),
    Option("api_key_env", ("--api-key-env",), "str", "OPENAI_API_KEY", show_default=True,
           help="Environment variable that holds the API key (sent as a bearer token)."),
    Option("api_key_file", ("--api-key-file",), "file",
           help="File that holds the API key (instead of the environment)."),
    Option("insecure", ("--insecure",), "flag", False, help="Do not verify TLS certificates."),
    Option("grace", ("--grace",), "float", 20.0, show_default=True,
           help="On SIGTERM, seconds to let requests in flight finish before checkpointing."),
    Option("stall_after", ("--stall-after",), "float", 0.0, show_default=True,
           help="When no result has come for this many seconds while requests have been on the wire that long, "
                "those attempts are abandoned and retried (timeout_stall, an attempt used). 0 (the default): "
                "never. An answer still streaming is cut too: set it above your longest generation."),
    Option("hang_timeout", ("--hang-timeout",), "float", 60.0, show_default=True,
           help="A worker silent (no heartbeat) this long is killed and replaced."),
    Option("max_task_crashes", ("--max-task-crashes",), "int", 3, lo=1, hi=100, show_default=True,
           help="A task whose workers died this often is written as failed (worker_crashed)."),
    Option("max_restarts", ("--max-restarts",), "int", 10, lo=0, hi=10_000, show_default=True,
           help="More unplanned worker restarts than this in 60s stops the run (resumably)."),
    Option("shard", ("--shard",), "str", metavar="K/N|auto",
           help="Process only the lines whose index (non-blank lines from 0) is K mod N; auto reads "
                "JOB_COMPLETION_INDEX+EVALSUP_SHARDS, SLURM_ARRAY_TASK_ID+SLURM_ARRAY_TASK_COUNT or "
                "AWS_BATCH_JOB_ARRAY_INDEX+AWS_BATCH_JOB_ARRAY_SIZE. Run dir: TASKS.run/shard-K-of-N/."),
    Option("stream", ("--stream/--no-stream",), "bool", False,
           help="Stream responses (SSE): records ttft_s; the reassembled body is written. --no-stream: one whole "
                "body (the default of a new run)."),
    Option("max_requests_per_s", ("--max-requests-per-s",), "str", (), multiple=True, pairs=True, metavar="N|URL=N",
           help="Request rate limit. N: all requests together, across all workers and endpoints; URL=N: only the "
                "requests sent to that endpoint (one of --base-url). Repeatable; the limits hold together, e.g. "
                "--max-requests-per-s 50 --max-requests-per-s http://gpu2:8000/v1=10."),
    Option("max_tokens_per_min", ("--max-tokens-per-min",), "str", (), multiple=True, pairs=True, metavar="N|URL=N",
           help="Token rate limit (estimated before a request, corrected from usage). N: all requests together; "
                "URL=N: only those sent to that endpoint. Repeatable, e.g. --max-tokens-per-min 200000 "
                "--max-tokens-per-min http://gpu2:8000/v1=50000."),
    Option("arrivals", ("--arrivals",), "choice", "uniform", choices=("uniform", "poisson"), show_default=True,
           help="Spacing of request starts under --max-requests-per-s."),
    Option("max_wait_down", ("--max-wait-down",), "float", 600.0, show_default=True,
           help="Seconds to wait for an endpoint that went down before stopping (resumably)."),
    Option("check", ("--check/--no-check",), "bool", True, show_default=True,
           help="Check the endpoint, key and model with one tiny request before the run."),
    Option("batch_api", ("--batch-api",), "flag", False,
           help="Send the tasks through the endpoint's Files and Batches API (OpenAI's Batch API: half the price, "
                "answers within 24 h) instead of one request each: chunks uploaded, batches created, polled and "
                "collected into results.jsonl, exactly once across crashes. A rerun adopts the batches already "
                "created. Recorded: a resume without the flag stays a batch run."),
    Option("batch_max_requests", ("--batch-max-requests",), "int", 50_000, lo=1, hi=1_000_000, show_default=True,
           help="--batch-api: the most requests one batch holds (OpenAI's limit: 50,000)."),
    Option("batch_max_bytes", ("--batch-max-bytes",), "int", 200 * 1024 * 1024, lo=1024, show_default=True,
           help="--batch-api: the largest input file one batch has, in bytes (OpenAI's limit: 200 MB)."),
    Option("batch_poll_interval", ("--batch-poll-interval",), "float", 5.0, show_default=True,
           help="--batch-api: seconds before the first look at a batch; without news the wait grows 1.5x a look "
                "up to --batch-poll-max."),
    Option("batch_poll_max", ("--batch-poll-max",), "float", 60.0, show_default=True,
           help="--batch-api: the longest wait between two looks at a batch."),
    Option("batch_fallback", ("--batch-fallback",), "choice", "batch", choices=("batch", "online", "fail"),
           show_default=True,
           help="--batch-api: what becomes of a request the batch did not answer (expired, cancelled) or answered "
                "with a retryable error (429, 5xx), within --max-attempts: batch (a follow-up batch), online (one "
                "online request), fail (recorded as failed with the provider's code and message)."),
    Option("batch_cancel", ("--batch-cancel",), "flag", False, hidden=True, api=False,
           help="--batch-api: cancel the run's batches, record what they finished, stop (evalsup cancel RUN)."),
    Option("memory_limit_mb", ("--memory-limit",), "float",
           help="Memory budget in MiB for the whole job (default: the container's cgroup limit)."),
    Option("memory_high_mb", ("--memory-high",), "float",
           help="Pause dispatch above this many MiB in use (default: 85% of the limit); "
                "resume below 70% of the limit (or 70/85 of --memory-high)."),
    Option("max_worker_rss_mb", ("--max-worker-rss",), "float",
           help="Recycle a worker past this RSS in MiB (default: its share of the limit, or 1024); "
                "kill it past 1.5x."),
    Option("max_tasks_per_worker", ("--max-tasks-per-worker",), "int", lo=1,
           help="Recycle a worker after this many tasks (bounds slow leaks)."),
    Option("max_tasks_jitter", ("--max-tasks-jitter",), "int", lo=0,
           help="Add up to this many to --max-tasks-per-worker, per worker, so they do not recycle at once "
                "(default: a tenth of it)."),
    Option("monitor_interval", ("--monitor-interval",), "float", 0.5, show_default=True,
           help="Seconds between memory samples (written to memory.jsonl)."),
    Option("trace_memory", ("--trace-memory",), "flag", False,
           help="Run tracemalloc in workers; one recycled for RSS writes leaks/worker-PID.txt."),
    Option("worker_plugin", ("--worker-plugin",), "str", hidden=True,
           help="module:function called in the worker for each task (testing hooks)."),
    Option("scorers", ("--scorer",), "str", (), multiple=True, metavar="NAME|module:fn|file.py:fn",
           help="Score each successful response in the workers (repeatable): exact_match, contains, "
                "regex, json_valid, choice, math, or your own function fn(task, response) -> number|bool|dict|None."),
    Option("scorer_timeout", ("--scorer-timeout",), "float", 30.0, show_default=True,
           help="Seconds one scorer call may take; past it the task gets an error score."),
    Option("ignore_case", ("--ignore-case",), "flag", False,
           help="exact_match/contains/regex: compare case-insensitively (choice always does)."),
    Option("no_strip", ("--no-strip",), "flag", False,
           help="exact_match/contains/regex: do not strip surrounding white space."),
    Option("normalize", ("--normalize",), "flag", False,
           help="exact_match/contains/regex: compare as SQuAD does (lower case; punctuation, the articles "
                "a/an/the and extra white space left out)."),
    Option("regex", ("--regex",), "str",
           help="Pattern for the regex scorer when a task has no 'pattern' (its first group is compared "
                "to 'expected')."),
    Option("log_interval", ("--log-interval",), "float", 10.0, show_default=True,
           help="Off a terminal, seconds between progress lines."),
    Option("log_format", ("--log-format",), "choice", "text", choices=("text", "json"), show_default=True,
           help="json: one JSON object per log line, for log collectors.", api=False),
    Option("metrics_port", ("--metrics-port",), "int", lo=0, hi=65535,
           help="Serve Prometheus metrics on this port (/metrics)."),
    Option("metrics_host", ("--metrics-host",), "str", "127.0.0.1", show_default=True,
           help="Address for --metrics-port (0.0.0.0 to expose it, e.g. in a pod)."),
    Option("quiet", ("--quiet", "-q"), "flag", False, help="Print only the final summary.", api=False),
    Option("json_summary", ("--json",), "flag", False,
           help="Print the final summary as JSON on stdout.", api=False),
)

BY_NAME: dict[str, Option] = {o.name: o for o in RUN_OPTIONS}
DEFAULTS: dict[str, Any] = {o.name: o.default for o in RUN_OPTIONS}
API_OPTIONS: tuple[Option, ...] = tuple(o for o in RUN_OPTIONS if o.api)


def with_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """Every option's value: those ``given`` (an explicit 0 or "" included), the rest at their defaults."""
    unknown = set(given) - set(BY_NAME)
    if unknown:
        raise TypeError(f"unknown run option(s): {', '.join(sorted(unknown))}")
    return {**DEFAULTS, **given}


def python_type(o: Option) -> str:
    """The option's type as Python spells it (for evalsup.run's signature and docstring)."""
    base = {"int": "int", "float": "float", "str": "str", "path": "str | Path", "file": "str | Path",
            "choice": "str", "flag": "bool", "bool": "bool"}[o.kind]
    if o.pairs:  # N, {URL: N}, or a list of both (the rate limits)
        return "float | dict[str, float] | Sequence[float | str | dict[str, float]]"
    if o.multiple:
        return f"{base} | Sequence[{base}]" if o.name == "base_url" else f"Sequence[{base}]"
    return base if o.default is not None else f"{base} | None"
