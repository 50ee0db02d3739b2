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
           help="Start over: move an existing run directory aside (never deleted) instead of resuming. Without "
                "it, rerunning the same command resumes where the run stopped."),
    Option("resume", ("--resume",), "flag", False,
           help="Resume the run in the run directory, and refuse (one line, saying where it looked) when there is "
                "none. A plain rerun of the same command resumes too; --resume only makes sure it does."),
    Option("retry_failed", ("--retry-failed",), "str", None, flag_value="*", metavar="[CODE,...]",
           help="Send again the tasks whose record is an error (only those with these error codes, e.g. "
                "http_500,timeout_total, when given): their records are replaced, not duplicated (the old ones go "
                "to replaced.jsonl). Works on a finished or a stopped run."),
    Option("accept_changed_settings", ("--accept-changed-settings",), "flag", False,
           help="Resume even though a request setting (--model, --max-tokens, --temperature, --stream, the "
                "endpoint's path, --scorer...) differs from the run's; the change is recorded in run.json."),
    Option("model", ("--model",), "str", help="Model for simple-form lines (and lines whose body has none)."),
    Option("max_tokens", ("--max-tokens",), "int", lo=0, help="max_tokens for requests that do not set it."),
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
    Option("hedge", ("--hedge",), "flag", False,
           help="In the tail of the run (no task left to start, free capacity), send a second copy of a request "
                "on the wire --hedge-factor x the p95 latency without a byte of answer, to another endpoint when "
                "there is one; the first answer is the record, the other copy is cancelled. A hedged request "
                "may be billed twice: for endpoints where a duplicate costs little (your own replicas, "
                "temperature 0)."),
    Option("hedge_factor", ("--hedge-factor",), "float", 2.0, show_default=True, metavar="K",
           help="With --hedge: a request is hedged once on the wire K times the p95 of its worker's recent "
                "latencies."),
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
    Option("ray", ("--ray",), "str", flag_value="default", metavar="[ADDRESS]", api=False,
           help="Run --shards N shards as Ray tasks on a Ray cluster (pip install 'evalsup[ray]'): ADDRESS as "
                "ray.init takes it (auto, ray://HOST:10001, HOST:6379); without one, Ray's own choice ($RAY_ADDRESS, "
                "else the cluster `ray start` began on this machine, else a new local one). A shard whose process or "
                "node dies is retried by Ray and resumes; the merge at the end proves coverage. Python: "
                "evalsup.ray.run_shards."),
    Option("shards", ("--shards",), "int", lo=1, hi=100_000, api=False,
           help="With --ray: how many shards (RUN_DIR/shard-K-of-N/); --concurrency and the rate limits are split "
                "evenly among them."),
    Option("ray_retries", ("--ray-retries",), "int", 5, lo=0, hi=1000, show_default=True, api=False,
           help="With --ray: how often Ray retries a shard that ended unfinished (its process or node died, or it "
                "stopped resumably); each retry resumes the shard."),
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
    Option("max_cost", ("--max-cost",), "str", metavar="USD[/shard]",
           help="Stop dispatching before the run's spend could pass this many US dollars: each request reserves its "
                "worst case (prompt + max_tokens, priced) when sent and settles to its usage when it answers; the "
                "requests out finish and the run stops (exit 75, exit_reason budget); rerun with a higher cap to go "
                "on. Needs a price for every model (--prices, --self-hosted): refused otherwise. Under --shard each "
                "shard gets cap/N; USD/shard gives each shard that much."),
    Option("max_completion_tokens_total", ("--max-completion-tokens-total",), "str", metavar="N[/shard]",
           help="As --max-cost, for the completion tokens of the whole run."),
    Option("max_total_tokens", ("--max-total-tokens",), "str", metavar="N[/shard]",
           help="As --max-cost, for prompt + completion tokens of the whole run."),
    Option("prices", ("--prices",), "file", metavar="FILE",
           help="Model prices (YAML or JSON: MODEL: {input, output, cached_input, cache_write, cache_write_1h} in "
                "USD per million tokens) over "
                "evalsup's own table (evalsup/config/prices.json, dated, sources named). For --max-cost and the "
                "estimate at the start."),
    Option("self_hosted", ("--self-hosted",), "flag", False,
           help="The endpoint is your own: every model costs 0 (the token caps still hold)."),
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
    Option("batch_provider", ("--batch-provider",), "choice", "auto", choices=("auto", "openai", "anthropic"),
           show_default=True,
           help="--batch-api: whose batch API: openai (Files and Batches: OpenAI, Azure and the many that speak "
                "it), anthropic (Message Batches: chat tasks translated, the key from $ANTHROPIC_API_KEY unless "
                "--api-key-env names another, answers kept as Anthropic's Messages), auto (anthropic when "
                "--base-url is at api.anthropic.com, else openai). Recorded."),
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
                "regex, json_valid, choice, math, judge (a model grades it: --judge-base-url), or your own "
                "function fn(task, response) -> number|bool|dict|None."),
    Option("scorer_timeout", ("--scorer-timeout",), "float", 30.0, show_default=True,
           help="Seconds one scorer call may take; past it the task gets an error score."),
    Option("judge_base_url", ("--judge-base-url",), "str", metavar="URL",
           help="--scorer judge: the judge's endpoint (an OpenAI-compatible base URL including /v1), asked after "
                "each answer with --judge-template; its own connections, limit (--judge-concurrency), retries and "
                "breaker, apart from --base-url's."),
    Option("judge_model", ("--judge-model",), "str", metavar="MODEL",
           help="--scorer judge: the judge's model (default: --model)."),
    Option("judge_api_key_env", ("--judge-api-key-env",), "str", metavar="VAR",
           help="--scorer judge: environment variable that holds the judge's API key (default: the answers' "
                "key). Only the name is recorded, never the key."),
    Option("judge_template", ("--judge-template",), "path", metavar="FILE",
           help="--scorer judge: the judge's prompt, with {prompt}, {messages}, {answer}, {expected}, {id}; a "
                "head block may set the grade's pattern and values (docs/evaluations.md). Default: is "
                "the answer correct given the reference, graded GRADE: C (1) or GRADE: I (0)."),
    Option("judge_concurrency", ("--judge-concurrency",), "int", 16, lo=1, hi=100_000, show_default=True,
           help="--scorer judge: judge requests in flight at most, in all (split among the workers running)."),
    Option("judge_max_tokens", ("--judge-max-tokens",), "int", lo=1,
           help="--scorer judge: max_tokens of the judge's requests (default: the judge's own)."),
    Option("judge_timeout", ("--judge-timeout",), "float", 900.0, show_default=True,
           help="--scorer judge: the most one answer's judging may take (retries, an outage of the judge); past "
                "it the answer gets a scorer error, not a failed task."),
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
    Option("group_by", ("--group-by",), "str", metavar="metadata.KEY",
           help="Scores per group too: the value of this key of each task's metadata (e.g. metadata.subject), in "
                "the summary, summary.json, the report and Prometheus (at most 10,000 groups, then '(other)'). "
                "Recorded in run.json: a resume without it groups as before; another value on a resume is taken "
                "(it changes no request; the summary groups that session's records, the report the whole run's), "
                "'off' stops grouping."),
    Option("response_schema", ("--response-schema",), "file", metavar="SCHEMA.json",
           help="Validate each answer's text as JSON against this JSON schema (a task's own response_format "
                "json_schema is validated without it, by default); an invalid answer is asked again with the "
                "error (--max-reasks), still invalid it is the error schema_invalid (which --retry-failed sends "
                "again)."),
    Option("max_reasks", ("--max-reasks",), "int", 2, lo=0, hi=20, show_default=True,
           help="Times an answer that fails its JSON schema is asked again, the validation error added as a "
                "user turn after it (chat and Responses API tasks). 0: validate, never ask again (an invalid "
                "answer is schema_invalid at once), as --batch-api always does (a batch cannot ask again)."),
    Option("validate_schema", ("--validate-schema/--no-validate-schema",), "bool", True, show_default=True,
           help="Validate the answers of tasks that carry their own response_format (or text.format) JSON "
                "schema. --no-validate-schema: the schema is only sent, the answer recorded as it comes (no "
                "re-ask, no schema_invalid); it cannot go with --response-schema."),
    Option("cache", ("--cache",), "str", metavar="DIR",
           help="Keep answers in DIR/cache.sqlite and answer a request already answered from it, in this run and "
                "later ones (no request sent, no rate budget used; the record says metrics.cache \"hit\"). "
                "Default: $EVALSUP_CACHE, else off; 'off' turns it off. Errors, filtered answers and answers cut "
                "at max_tokens are never kept. DIR must be on a local disk."),
    Option("cache_mode", ("--cache-mode",), "choice", "rw", choices=("rw", "ro", "refresh"), show_default=True,
           help="rw: read and keep; ro: read only (the cache is not changed); refresh: send every request and "
                "replace what is kept."),
    Option("cache_model_id", ("--cache-model-id",), "str", metavar="NAME",
           help="The model's identity in cache keys, instead of the request's model name: give the same NAME to "
                "replicas or renamed deployments of one model so they share answers, or a new one when the "
                "weights behind a name changed."),
    Option("cache_salt", ("--cache-salt",), "str", "", metavar="TEXT",
           help="Mixed into every cache key: a new salt gets new samples (and new answers) instead of the kept "
                "ones."),
    Option("cache_length", ("--cache-length",), "flag", False,
           help="Keep answers cut at their token limit (finish_reason length) too."),
    Option("cache_max_gb", ("--cache-max-gb",), "float", metavar="GB",
           help="Byte budget of the cache (answers' bytes plus ~128 a row): past it the least recently used "
                "entries are deleted, in batches, down to 90%. Default: no limit."),
    Option("log_interval", ("--log-interval",), "float", 10.0, show_default=True,
           help="Off a terminal, seconds between progress lines."),
    Option("log_format", ("--log-format",), "choice", "text", choices=("text", "json"), show_default=True,
           help="json: one JSON object per log line, for log collectors.", api=False),
    Option("metrics_port", ("--metrics-port",), "int", lo=0, hi=65535,
           help="Serve Prometheus metrics on this port (/metrics)."),
    Option("metrics_host", ("--metrics-host",), "str", "127.0.0.1", show_default=True,
           help="Address for --metrics-port (0.0.0.0 to expose it, e.g. in a pod)."),
    Option("quiet", ("--quiet", "-q"), "flag", False, help="Print only the final summary.", api=False),
    Option("verbose", ("--verbose", "-v"), "flag", False, api=False,
           help="Say the endpoint check, the whole estimate and the sizing at the start, each on its own line "
                "(without it: one start line of the endpoint, model, tasks, workers x limit and cost)."),
    Option("json_summary", ("--json",), "flag", False,
           help="Print the final summary as JSON on stdout.", api=False),
)

BY_NAME: dict[str, Option] = {o.name: o for o in RUN_OPTIONS}
DEFAULTS: dict[str, Any] = {o.name: o.default for o in RUN_OPTIONS}
API_OPTIONS: tuple[Option, ...] = tuple(o for o in RUN_OPTIONS if o.api)


@dataclass(frozen=True)
class Group:
    """A section of `evalsup run --help`: what a person wants to do, and its options in the order shown."""

    key: str
    title: str
    help: str
    names: tuple[str, ...]


# `evalsup run --help`, by what a person wants to do (issue 44); the first options of the first groups are the
# handful a first run needs. Every option of RUN_OPTIONS is in exactly one group (tests/unit/test_cli_help.py).
GROUPS: tuple[Group, ...] = (
    Group("endpoint", "Endpoint and model", "where requests go, and what they ask for",
          ("base_url", "model", "max_tokens", "temperature", "stream", "api_key_env", "api_key_file", "headers",
           "check", "insecure")),
    Group("io", "Input and output", "the task file, the run directory, resuming and starting over",
          ("out", "resume", "fresh", "retry_failed", "accept_changed_settings", "on_invalid", "max_line_mb",
           "max_response_mb", "arrivals")),
    Group("speed", "Speed", "workers, requests in flight, rates",
          ("workers", "concurrency", "max_concurrency", "server_metrics", "max_requests_per_s",
           "max_tokens_per_min", "window", "hedge", "hedge_factor")),
    Group("retries", "Retries and timeouts", "how long to wait, how often to try again, when to give up",
          ("max_attempts", "timeout", "connect_timeout", "read_timeout", "max_rate_limited_wait", "max_wait_down",
           "stall_after", "hang_timeout", "max_task_crashes", "max_restarts", "grace")),
    Group("cost", "Cost and cache", "caps on spending, prices, answers kept across runs",
          ("max_cost", "max_total_tokens", "max_completion_tokens_total", "prices", "self_hosted", "cache",
           "cache_mode", "cache_model_id", "cache_salt", "cache_length", "cache_max_gb")),
    Group("scoring", "Scoring", "scorers, the judge, structured answers",
          ("scorers", "group_by", "scorer_timeout", "ignore_case", "no_strip", "normalize", "regex",
           "judge_base_url", "judge_model", "judge_api_key_env", "judge_template", "judge_concurrency",
           "judge_max_tokens", "judge_timeout", "response_schema", "max_reasks", "validate_schema",
           "worker_plugin")),
    Group("batch", "Provider Batch APIs", "send the tasks as OpenAI's or Anthropic's batches instead",
          ("batch_api", "batch_provider", "batch_max_requests", "batch_max_bytes", "batch_poll_interval",
           "batch_poll_max", "batch_fallback", "batch_cancel")),
    Group("memory", "Memory", "the container's limit, the workers' size, recycling",
          ("memory_limit_mb", "memory_high_mb", "max_worker_rss_mb", "max_tasks_per_worker", "max_tasks_jitter",
           "monitor_interval", "trace_memory")),
    Group("scale", "Scale-out", "shards on Kubernetes, Slurm or Ray",
          ("shard", "ray", "shards", "ray_retries")),
    Group("logging", "Logging", "what is printed, and where metrics go",
          ("quiet", "verbose", "json_summary", "log_interval", "log_format", "metrics_port", "metrics_host")),
)
GROUP_OF: dict[str, str] = {n: g.key for g in GROUPS for n in g.names}


@dataclass(frozen=True)
class Rule:
    """One option needs another (``needs``), or cannot go with it (``conflicts``): a run given ``name`` (a value
    other than its default) without ``other`` (or with it) is refused in one line, ``why`` after it. ``value``:
    ``name`` counts only with this value (among its values, for a repeatable one); ``other_value``: likewise
    ``other`` (``--judge-model`` needs ``--scorer judge``)."""

    name: str
    kind: Literal["needs", "conflicts"]
    other: str
    why: str = ""
    value: str | None = None
    other_value: str | None = None


# Every plain "A needs B" and "A cannot go with B" between run options (issue 44), checked by ``clash`` in one
# place (config.run_config.build_config, and `evalsup run` before a Ray run); refusals that need more than two
# options' presence (the cache's options and $EVALSUP_CACHE, the judge's and --scorer judge, number bounds)
# stay written out where the values are read.
RULES: tuple[Rule, ...] = (
    Rule("resume", "conflicts", "fresh", "one resumes the run, the other starts it over; give one"),
    Rule("retry_failed", "conflicts", "fresh", "--retry-failed needs the run to retry"),
    Rule("shards", "needs", "ray", "--shards N runs the shards on Ray (on other schedulers: --shard K/N)"),
    Rule("ray", "needs", "shards", "how many shards (Ray runs each as a task)"),
    Rule("shard", "conflicts", "ray", "--ray runs every shard itself (give --shards N)"),
    Rule("validate_schema", "conflicts", "response_schema",
         "--no-validate-schema turns off the validation --response-schema asks for; give one of them"),
    Rule("hedge", "conflicts", "batch_api", "it works on requests sent one by one"),
    Rule("response_schema", "conflicts", "batch_api", "it works on requests sent one by one"),
    Rule("batch_provider", "needs", "batch_api", "it is for --batch-api runs"),
    Rule("verbose", "conflicts", "quiet", "one says more at the start, the other only the end; give one"),
    *(Rule(n, "needs", "scorers", "the judge's settings are for the model-graded scorer", other_value="judge")
      for n in ("judge_base_url", "judge_model", "judge_api_key_env", "judge_template", "judge_max_tokens")),
)


def is_set(o: Option, value: Any) -> bool:
    """Whether ``value`` sets option ``o`` (anything but its default, or nothing)."""
    return value is not None and value != o.default and not (o.multiple and not value)


def shown(o: Option, value: Any) -> str:
    """The flag as a user gives it for ``value`` (``--no-validate-schema`` for a bool turned off)."""
    if o.kind == "bool" and not value:
        return o.flags[0].split("/")[1]
    return o.flag


def clash(values: Mapping[str, Any]) -> str | None:
    """The first rule of ``RULES`` that ``values`` (option name -> value; a name left out is at its default)
    break, in one line; None when they break none."""
    def on(name: str, value: str | None) -> bool:
        o = BY_NAME[name]
        v = values.get(name, o.default)
        if value is not None:
            return v == value or (o.multiple and v is not None and value in v)
        return is_set(o, v)

    def flag(name: str, value: str | None, has: bool) -> str:
        o = BY_NAME[name]
        return shown(o, values.get(name, o.default) if has else True) + (f" {value}" if value is not None else "")

    for r in RULES:
        if not on(r.name, r.value) or on(r.other, r.other_value) == (r.kind == "needs"):
            continue
        verb = "needs" if r.kind == "needs" else "cannot go with"
        return (f"{flag(r.name, r.value, True)} {verb} {flag(r.other, r.other_value, r.kind == 'conflicts')}"
                + (f": {r.why}" if r.why else ""))
    return None

# EVALSUP_<OPTION> in the environment sets a run option (issue 44), but for these, whose variable already
# means something else: $EVALSUP_CACHE is --cache's own default (read with the cache's rules), $EVALSUP_SHARDS is
# the shard count of an indexed Kubernetes Job for --shard auto (not --shards, which starts Ray)
NO_ENV = frozenset(("cache", "shards", "shard"))


def env_var(o: Option) -> str | None:
    """The environment variable that sets ``o`` (None: none does)."""
    return None if o.name in NO_ENV else f"EVALSUP_{o.name.upper()}"


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


def argv_of(options: Mapping[str, Any]) -> list[str]:
    """Run options (evalsup.run's keywords: {name: value}) as `evalsup run` arguments, for a run in a child
    process. None, and a flag that is off, are left out."""
    args: list[str] = []
    for name, value in options.items():
        o = BY_NAME[name]
        if value is None or (o.kind == "flag" and not value):
            continue
        args += o.argv(value)
    return args


# ----- the numeric options' bounds (issue 39) -----------------------------------------------------------------
# Beyond the int ranges above (click's), every number given must be finite and within a bound with a reason, so
# that an absurd value is one line and exit 2 (``out_of_bounds``, asked by build_config), never an overflow where
# it is used: ``--max-total-tokens 1e30`` or ``--max-tokens 1e23`` (no 64-bit integer holds them: run.json, the
# checkpoint and summary.json are written by orjson, the cache is SQLite), ``--connect-timeout 1e300`` (past
# time_t), ``--memory-limit 1e30``, ``--max-line-mb 1e30`` (a read's size past ssize_t).

INT64_MAX = (1 << 63) - 1  # what orjson (run.json, the checkpoint, summary.json) and SQLite keep an integer in
YEAR_S = 365 * 86_400  # seconds: no wait or timeout of a run is longer (its timers overflow time_t far past it)
PIB_MIB = 1 << 30  # 1 PiB in MiB: more than any machine holds (sizes are kept in bytes, in 64-bit integers)


@dataclass(frozen=True)
class Bound:
    lo: float
    hi: float
    unit: str  # how the bound is said: "seconds", "MiB", "" (a count)
    why: str  # the reason, in a few words


SECONDS = Bound(0, YEAR_S, "seconds", "a year: no wait or timeout of a run is longer")
MIB = Bound(0, PIB_MIB, "MiB", "1 PiB: more than any machine holds")
INT64 = Bound(-INT64_MAX, INT64_MAX, "", "a 64-bit integer: run.json, the checkpoint and the cache keep it as one")
FINITE = Bound(-float("inf"), float("inf"), "", "")  # only finite: no inf, no nan

BOUNDS: dict[str, Bound] = {
    **dict.fromkeys(("max_rate_limited_wait", "timeout", "connect_timeout", "read_timeout", "grace", "stall_after",
                     "hang_timeout", "max_wait_down", "batch_poll_interval", "batch_poll_max", "scorer_timeout",
                     "judge_timeout", "monitor_interval", "log_interval"), SECONDS),
    **dict.fromkeys(("max_response_mb", "max_line_mb", "memory_limit_mb", "memory_high_mb", "max_worker_rss_mb"),
                    MIB),
}


def bound_of(o: Option) -> Bound | None:
    """The bound of a numeric option: its own (BOUNDS), else a 64-bit integer's (int) or only finite (float)."""
    if o.kind not in ("int", "float"):
        return None
    return BOUNDS.get(o.name, INT64 if o.kind == "int" else FINITE)


def out_of_bounds(o: Option, value: Any) -> str | None:
    """Why ``value`` of ``o`` is refused (one line naming the flag and its bound), or None."""
    b = bound_of(o)
    if b is None or value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value in (float("inf"), -float("inf")):
        return f"{o.flag} must be a finite number, got {value}"
    if b.lo <= value <= b.hi:
        return None
    unit = f" {b.unit}" if b.unit else ""
    got = value if isinstance(value, int) else f"{value:g}"
    if b.lo == -INT64_MAX:
        return f"{o.flag} must be at {'most' if value > 0 else 'least'} {b.hi if value > 0 else b.lo:,}{unit} " \
               f"({b.why}), got {got}"
    return f"{o.flag} must be from {b.lo:g} to {b.hi:,}{unit} ({b.why}), got {got}"
