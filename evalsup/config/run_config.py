"""One frozen configuration object for a run, its defaults, and sizing from the container's limit."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from evalsup.config.caps import CapError, Caps, parse_caps
from evalsup.config.options import DEFAULTS as OPT  # every run option's default, defined once (options.py)
from evalsup.config.ratelimits import EndpointRate, RateLimitError, parse_rate_limits
from evalsup.config.shards import shard_dir_name
from evalsup.ipc.messages import WorkerConfig
from evalsup.ipc.ring import ring_budget
from evalsup.tasks.requests import public_url
from evalsup.tasks.secrets import Scrubber, run_scrubber

DEFAULT_MAX_CONCURRENCY: int = OPT["max_concurrency"]  # the adaptive limit's ceiling without --max-concurrency
MIB = 1 << 20

__all__ = ["ConfigError", "RunConfig", "WorkerConfig"]


class ConfigError(Exception):
    """A setting that cannot work; the message says which and how to fix it."""


@dataclass(frozen=True)
class RunConfig:
    """A run's settings. Those that are options take their defaults from evalsup/config/options.py (build_config
    fills them all from there); the rest are internal tunings."""

    tasks_path: Path
    run_dir: Path
    worker: WorkerConfig
    workers: int = 4  # with autoscale, the most there may be
    autoscale: bool = False  # start with one worker, add one while each is CPU-bound (supervisor.scaling)
    # total requests in flight across all workers: --concurrency, or when adaptive (no --concurrency) the most
    # the workers' adaptive limits may reach together (--max-concurrency)
    concurrency: int = DEFAULT_MAX_CONCURRENCY
    adaptive: bool = False  # without --concurrency each worker's limit adapts (evalsup.worker.adaptive)
    # --retry-failed: error codes whose records are taken out and their tasks sent again (empty: every error;
    # None: no retry), see evalsup.rundir.rewrite; --accept-changed-settings: resume across changed request settings
    retry_failed: frozenset[str] | None = None
    accept_changed_settings: bool = False
    window: int = OPT["window"]  # tasks outstanding per worker; 0 = 2 x its concurrency
    max_line_mb: float = OPT["max_line_mb"]
    on_invalid: Literal["error", "skip"] = OPT["on_invalid"]
    fresh: bool = OPT["fresh"]
    flush_interval_s: float = 1.0
    checkpoint_interval_s: float = 2.0
    grace_s: float = OPT["grace"]
    hang_timeout_s: float = OPT["hang_timeout"]
    stall_after_s: float = OPT["stall_after"]  # issue 28: no result this long, requests on the wire: STALL
    max_task_crashes: int = OPT["max_task_crashes"]
    max_restarts: int = OPT["max_restarts"]
    quiet: bool = OPT["quiet"]
    verbose: bool = OPT["verbose"]  # -v: the start's check, estimate and sizing lines in full (issue 44)
    json_summary: bool = OPT["json_summary"]
    log_interval_s: float = OPT["log_interval"]
    log_format: Literal["text", "json"] = OPT["log_format"]
    metrics_port: int | None = OPT["metrics_port"]
    metrics_host: str = OPT["metrics_host"]
    shard: tuple[int, int] | None = None  # (K, N): only lines whose index is K mod N
    # the endpoint
    max_requests_per_s: float | None = None  # the global rate limits (evalsup.config.ratelimits parses the options)
    max_tokens_per_min: float | None = None
    endpoint_rates: tuple[EndpointRate, ...] = ()  # limits of single endpoints (URL=N), see evalsup.config.ratelimits
    arrivals: Literal["uniform", "poisson"] = OPT["arrivals"]
    max_wait_down_s: float = OPT["max_wait_down"]
    # issue 30: the run's caps (a shard's share already taken), and the prices they and the estimate use
    caps: Caps = Caps()  # noqa: RUF009 - frozen, so one shared default is safe
    prices_file: str | None = None
    self_hosted: bool = False
    check: bool = OPT["check"]
    # memory supervision
    monitor_interval_s: float = OPT["monitor_interval"]
    memory_limit: int | None = None  # bytes; overrides the cgroup's limit (or sets one where there is none)
    ring_bytes: int = 16 << 20  # the workers' shared-memory rings together (ipc.ring.ring_budget)
    # the memory the run may use (--memory-limit, else the container's limit, else the machine's; None: unknown):
    # what the results file's cached tail is sized by (rundir.writer.cached_tail)
    memory_bytes: int | None = None
    memory_high: int | None = None  # bytes; default high_frac of the effective limit
    high_frac: float = 0.85
    low_frac: float = 0.70
    psi_threshold: float = 10.0
    max_worker_rss: int | None = None  # bytes; default: a worker's share of the limit, or 1 GiB without one
    hard_rss_factor: float = 1.5
    max_tasks_per_worker: int | None = OPT["max_tasks_per_worker"]
    max_tasks_jitter: int = 0
    # --scorer judge: the template file given (None: the default); its text travels in worker.judge_template
    judge_template_path: str | None = None
    cache_max_bytes: int | None = None  # --cache-max-gb (the cache's other settings are the workers': worker.cache_*)

    @property
    def max_line_bytes(self) -> int:
        return int(self.max_line_mb * MIB)

    @functools.cached_property
    def scrub(self) -> Scrubber:
        """Every secret the run knows (keys, URL passwords and query values, --header env:/@file values), for
        the supervisor's writers: its log, events.jsonl, summary.json (tasks.secrets; issue 39)."""
        w = self.worker
        return run_scrubber(w.endpoints, w.headers, w.api_key_env, w.api_key_file, w.judge_base_url,
                            w.judge_api_key_env)

    @property
    def first_workers(self) -> int:
        """How many workers a run starts with."""
        return 1 if self.autoscale else self.workers

    def per_worker_concurrency(self, workers: int | None = None) -> list[int]:
        """Split the total concurrency evenly among ``workers`` (default: all; the first take the remainder)."""
        n = workers or self.workers
        base, rest = divmod(self.concurrency, n)
        return [base + (1 if i < rest else 0) for i in range(n)]

    def judge_share(self, workers: int) -> list[int]:
        """--judge-concurrency (the run's) split evenly among the ``workers`` running (the first take the
        remainder; each at least 1): the supervisor gives each its share at spawn and as workers are added."""
        base, rest = divmod(self.worker.judge_concurrency, workers)
        return [max(1, base + (1 if i < rest else 0)) for i in range(workers)]

    def window_for(self, concurrency: int) -> int:
        return self.window if self.window > 0 else max(2, 2 * concurrency)


def build_config(tasks: Path, given: dict[str, Any]) -> RunConfig:
    """The RunConfig of a run of ``tasks`` with the options ``given`` (keys of evalsup.config.options.RUN_OPTIONS; the
    rest take their defaults). An explicit value is used as given: 0 is 0. Raises ConfigError."""
    from evalsup.config.options import BY_NAME, clash, out_of_bounds, with_defaults

    kw = with_defaults(given)
    for name, value in given.items():  # numbers past their bounds (options.BOUNDS), before anything uses them
        problem = out_of_bounds(BY_NAME[name], value)
        if problem is not None:
            raise ConfigError(problem)
    if (why := clash(kw)) is not None:  # the option table's needs/conflicts (before --fresh moves anything aside)
        raise ConfigError(why)
    urls = resolve_base_urls(kw["base_url"])  # many endpoints (issue 21 item 1)
    if kw["cache_max_gb"] is not None and not kw["cache_max_gb"] > 0:  # inf and nan: refused by the bounds above
        raise ConfigError(f"--cache-max-gb must be a number of GB more than 0, got {kw['cache_max_gb']:g}")
    cache_flags = [f"--{k.replace('_', '-')}" for k in CACHE_OPTIONS if kw[k] != OPT[k]]
    if cache_flags and cache_dir(kw["cache"]) is None:
        raise ConfigError(f"{', '.join(cache_flags)} without a cache: give --cache DIR (or set ${CACHE_ENV})")
    if len(urls) > 1 and kw["server_metrics"] not in (None, "off"):
        raise ConfigError("--server-metrics URL names one server; with several --base-url each endpoint's own "
                          "/metrics is read (or give --server-metrics off)")
    try:  # global (N) or per endpoint (URL=N), issue 21 item 1
        rates = parse_rate_limits(kw["max_requests_per_s"], kw["max_tokens_per_min"], urls)
    except RateLimitError as e:
        raise ConfigError(str(e)) from None
    group_by = None if kw["group_by"] == "off" else kw["group_by"]  # off: a resume stops grouping (run_json.FREE)
    if group_by is not None:
        from evalsup.tasks.group_key import GroupByError, parse_group_by

        try:
            parse_group_by(group_by)
        except GroupByError as e:
            raise ConfigError(str(e)) from None
    wc = WorkerConfig(
        base_url=urls[0], base_urls=urls, concurrency=0, api_key_env=kw["api_key_env"],
        api_key_file=None if kw["api_key_file"] is None else str(kw["api_key_file"]),
        model=kw["model"], max_tokens=kw["max_tokens"], temperature=kw["temperature"],
        max_attempts=kw["max_attempts"], max_rate_limited_s=kw["max_rate_limited_wait"],
        connect_timeout_s=kw["connect_timeout"],
        read_timeout_s=kw["read_timeout"], total_timeout_s=kw["timeout"],
        max_response_mb=kw["max_response_mb"], insecure=kw["insecure"], plugin=kw["worker_plugin"],
        trace_memory=kw["trace_memory"], stream=kw["stream"],
        scorers=tuple(kw["scorers"]), scorer_timeout_s=kw["scorer_timeout"],
        score_strip=not kw["no_strip"], score_ignore_case=kw["ignore_case"], score_pattern=kw["regex"],
        score_normalize=kw["normalize"],
        adaptive=kw["concurrency"] is None, server_metrics=kw["server_metrics"], headers=tuple(kw["headers"]),
        group_by=group_by, response_schema=response_schema(kw["response_schema"]), max_reasks=kw["max_reasks"],
        validate_schema=kw["validate_schema"],
        hedge=kw["hedge"], hedge_factor=kw["hedge_factor"],
        cache_dir=cache_dir(kw["cache"]), cache_mode=kw["cache_mode"], cache_model_id=kw["cache_model_id"] or None,
        cache_salt=kw["cache_salt"] or "", cache_length=kw["cache_length"],
    )
    if not kw["hedge_factor"] > 0:
        raise ConfigError(f"--hedge-factor must be more than 0 (a multiple of the p95 latency), got "
                          f"{kw['hedge_factor']}")
    _check_requests(wc)
    _check_scorers(wc)
    judge_template_path = None
    if "judge" in wc.scorers:  # the model-graded scorer: its endpoint, model, key and template, checked now
        wc, judge_template_path = _with_judge(wc, kw)  # (its settings without it: the option table's RULES)
    adaptive = wc.adaptive  # without --concurrency each worker's limit adapts (issue 21)

    def mb(name: str) -> int | None:
        v = kw[name]
        return None if v is None else int(v * MIB)
    from evalsup.config.cgroup import container_limit, machine_memory

    limit = mb("memory_limit_mb")
    if limit is None:
        limit = container_limit()[0]
    memory = limit or machine_memory()  # what the run may use: sizes the rings and the results' cached tail
    workers = kw["workers"]
    autoscale = workers is None
    if workers is None:
        workers = default_workers(limit)
        # no more workers than requests in flight: each holds at least one, so -c 1 would mean 4 on the wire
        workers = min(workers, kw["max_concurrency"] if adaptive else kw["concurrency"])
    shard = parse_shard(kw["shard"])
    try:
        caps = parse_caps(kw["max_cost"], kw["max_completion_tokens_total"], kw["max_total_tokens"], shard)
    except CapError as e:
        raise ConfigError(str(e)) from None
    prices_file = None if kw["prices"] is None else str(kw["prices"])
    if prices_file is not None or caps.cost is not None:
        from evalsup.config.prices import PriceError, load_prices

        try:
            load_prices(prices_file, kw["self_hosted"])  # a bad price file: one line, before anything starts
        except PriceError as e:
            raise ConfigError(str(e)) from None
    run_dir = run_dir_of(tasks, kw["out"], shard)
    window = kw["window"]
    if kw["batch_api"] or kw["batch_cancel"]:  # one batch driver in the workers' place (issue 31)
        cache_from = "--cache" if kw["cache"] is not None else f"${CACHE_ENV} (a cache)"  # whence it came
        # (--hedge and --response-schema: the option table's conflicts) each acts on a request as it is
        # answered, which a provider's batch does not let it do; a cache may come from the environment
        online_only = [flag for flag, on in ((cache_from, wc.cache_dir is not None),
                                             ("--scorer judge", "judge" in wc.scorers)) if on]
        if online_only:
            judge = "judge" in online_only[0]
            after = " (grade a batch run afterwards: evalsup score RUN --scorer judge)" if judge else (
                f" (unset {CACHE_ENV}, or give --cache off)" if online_only[0] == cache_from != "--cache" else "")
            raise ConfigError(f"{online_only[0]} cannot go with --batch-api: it works on requests sent one by "
                              f"one{after}")
        if kw["batch_poll_interval"] <= 0 or kw["batch_poll_max"] < kw["batch_poll_interval"]:
            raise ConfigError("--batch-poll-interval must be above 0 and at most --batch-poll-max")
        provider = batch_provider(kw["batch_provider"], wc.endpoints[0])
        if provider == "anthropic" and kw["api_key_env"] == OPT["api_key_env"] and kw["api_key_file"] is None:
            wc = dataclasses.replace(wc, api_key_env="ANTHROPIC_API_KEY")  # Anthropic's own variable by default
        wc = dataclasses.replace(wc, batch={
            "run_dir": str(run_dir), "max_requests": kw["batch_max_requests"],
            "max_bytes": kw["batch_max_bytes"], "poll_s": kw["batch_poll_interval"],
            "poll_max_s": kw["batch_poll_max"], "fallback": kw["batch_fallback"], "cancel": kw["batch_cancel"],
            "completion_window": "24h", "provider": provider, "provider_option": kw["batch_provider"]})
        workers, autoscale = 1, False
        # the driver holds up to two chunks' tasks (one filling while one runs)
        window = window or min(200_000, 2 * kw["batch_max_requests"])
    per_worker = None if wc.batch is not None else kw["max_tasks_per_worker"]  # a driver is not recycled by count
    jitter = kw["max_tasks_jitter"]
    return RunConfig(
        tasks_path=tasks, run_dir=run_dir,
        worker=wc, workers=workers, shard=shard, autoscale=autoscale and workers > 1,
        concurrency=max(kw["max_concurrency"] if adaptive else kw["concurrency"], workers), adaptive=adaptive,
        window=window, max_line_mb=kw["max_line_mb"],
        on_invalid=kw["on_invalid"], fresh=kw["fresh"], grace_s=kw["grace"], hang_timeout_s=kw["hang_timeout"],
        stall_after_s=kw["stall_after"],
        max_task_crashes=kw["max_task_crashes"], max_restarts=kw["max_restarts"], quiet=kw["quiet"],
        verbose=kw["verbose"],
        json_summary=kw["json_summary"], memory_limit=mb("memory_limit_mb"), memory_high=mb("memory_high_mb"),
        ring_bytes=ring_budget(memory), memory_bytes=memory,
        max_worker_rss=mb("max_worker_rss_mb"), max_tasks_per_worker=per_worker,
        max_tasks_jitter=int(jitter) if jitter is not None else int(per_worker or 0) // 10,
        monitor_interval_s=kw["monitor_interval"], max_requests_per_s=rates.rps, max_tokens_per_min=rates.tpm,
        endpoint_rates=rates.endpoints, arrivals=kw["arrivals"], max_wait_down_s=kw["max_wait_down"],
        check=kw["check"], log_interval_s=kw["log_interval"], log_format=kw["log_format"],
        metrics_port=kw["metrics_port"], metrics_host=kw["metrics_host"],
        retry_failed=retry_failed_codes(kw["retry_failed"]), accept_changed_settings=kw["accept_changed_settings"],
        caps=caps, prices_file=prices_file, self_hosted=kw["self_hosted"],
        judge_template_path=judge_template_path,
        cache_max_bytes=None if kw["cache_max_gb"] is None else int(kw["cache_max_gb"] * (1 << 30)),
    )


def batch_provider(option: str, base_url: str) -> str:
    """--batch-provider resolved: ``auto`` is anthropic for an endpoint at api.anthropic.com, else openai."""
    if option != "auto":
        return option
    host = (urlsplit(base_url).hostname or "").lower()
    return "anthropic" if host == "api.anthropic.com" else "openai"


def response_schema(value: Any) -> dict[str, Any] | None:
    """--response-schema: a file's JSON schema, loaded and checked now, before any request (one line naming the
    file when it is not JSON or not a JSON schema); a dict is a schema already loaded (run.json's, on a
    resume, or evalsup.run's)."""
    if value is None:
        return None
    from evalsup.tasks.response_schema import SchemaError, check_schema, load_schema_file

    try:
        if isinstance(value, dict):
            return check_schema(value, "--response-schema")
        return load_schema_file(value)
    except SchemaError as e:
        raise ConfigError(str(e)) from None


def _with_judge(wc: WorkerConfig, kw: dict[str, Any]) -> tuple[WorkerConfig, str | None]:
    """``wc`` with the judge's settings (--scorer judge), each checked before any request: its URL, its model
    (--judge-model, else --model), its key's variable (set, when named) and its template (read and parsed now:
    a missing file, an unknown variable or a bad pattern is refused here, in one line). The template's path
    for run.json."""
    from evalsup.scoring.judge import TemplateError, load_template
    from evalsup.tasks.headers import HeaderError, api_key, build_headers, request_headers
    from evalsup.tasks.requests import url_problem

    url = kw["judge_base_url"]
    if not url:
        raise ConfigError("--scorer judge needs the judge's endpoint: --judge-base-url http://HOST:PORT/v1")
    url = str(url).strip().rstrip("/")
    problem = url_problem(url)
    if problem is not None:
        raise ConfigError(f"--judge-base-url {public_url(url)} {problem}")
    model = kw["judge_model"] or kw["model"]
    if not model:
        raise ConfigError("--scorer judge needs the judge's model: --judge-model MODEL (or --model)")
    env = kw["judge_api_key_env"]
    if env and not os.environ.get(env):
        raise ConfigError(f"--judge-api-key-env {env}: the variable is not set (it holds the judge's API key)")
    path = None if kw["judge_template"] is None else str(kw["judge_template"])
    try:
        template = load_template(path)
    except TemplateError as e:
        raise ConfigError(str(e)) from None
    try:  # (as _check_requests: two sources for the judge's Authorization are refused, never a value shown)
        key = api_key(env, None) if env else None
        request_headers(url, build_headers(()), key, f"${env}" if env else "the API key")
    except (HeaderError, OSError) as e:
        raise ConfigError(f"--judge-base-url: {e}") from None
    return dataclasses.replace(
        wc, judge_base_url=url, judge_model=model, judge_api_key_env=env or None,
        judge_template=None if path is None else template.text, judge_timeout_s=kw["judge_timeout"],
        judge_max_tokens=kw["judge_max_tokens"], judge_concurrency=kw["judge_concurrency"]), path


CACHE_ENV = "EVALSUP_CACHE"  # the cache directory when --cache is left out
CACHE_OPTIONS = ("cache_mode", "cache_model_id", "cache_salt", "cache_length", "cache_max_gb")  # need a cache


def cache_dir(flag: str | None) -> str | None:
    """The cache directory: --cache, else $EVALSUP_CACHE; "off" (or empty) for none."""
    value = flag if flag is not None else os.environ.get(CACHE_ENV)
    if value is None or value.strip() in ("", "off"):
        return None
    return str(Path(value).expanduser().absolute())


RETRY_CODES = re.compile(r"^[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*$")


def retry_failed_codes(value: str | None) -> frozenset[str] | None:
    """--retry-failed's value, parsed here only: "*" (the flag alone) for every error code (an empty set), or
    CODE[,CODE...]; None without the flag."""
    if value is None:
        return None
    return frozenset() if value == "*" else frozenset(c for c in value.split(",") if c)


def retry_failed_task_file(tasks: Path | None, value: str | None) -> tuple[Path | None, str | None]:
    """`run --retry-failed tasks.jsonl`: the option's value is optional, so the task file may come as its
    value. Then (that file, "*"): the flag alone; else (tasks, value) unchanged, to be parsed by
    retry_failed_codes."""
    if value is not None and tasks is None and value != "*" and not RETRY_CODES.match(value):
        return Path(value), "*"
    return tasks, value


def _check_requests(w: WorkerConfig) -> None:
    """What would keep a request from being sent stops the run before it starts, never showing a value: a
    --header that cannot be used, a --base-url that cannot be requested, or two sources for the Authorization
    header (a URL's user:password@ and the API key, or a --header Authorization; issue 34)."""
    from evalsup.tasks.headers import HeaderError, api_key, build_headers, key_source, request_headers
    from evalsup.tasks.requests import url_problem

    for url in w.endpoints:
        problem = url_problem(url)
        if problem is not None:
            raise ConfigError(f"--base-url {public_url(url)} {problem}")
    try:
        common = build_headers(w.headers)
        try:
            key = api_key(w.api_key_env, w.api_key_file)
        except OSError:  # (the key file is read, and its error said, where the key is used)
            key = None
        for url in w.endpoints:
            request_headers(url, common, key, key_source(w.api_key_env, w.api_key_file))
    except HeaderError as e:
        raise ConfigError(str(e)) from None


def _check_scorers(w: WorkerConfig) -> None:
    """A --scorer that cannot load (an unknown name, a file that cannot be read or has a syntax error, a module
    that is not there) stops the run before it starts, in one line (file:LINE for a syntax error); none of
    the user's code runs here (issue 39)."""
    from evalsup.scoring.scorers import check_scorer

    for spec in w.scorers:
        if spec == "judge":  # the model-graded scorer: its settings are checked by _with_judge
            continue
        try:
            check_scorer(spec)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def resolve_base_url(flag: str | None) -> str:
    """One endpoint: --base-url or $OPENAI_BASE_URL (the first of a list)."""
    return resolve_base_urls(flag)[0]


def resolve_base_urls(flags: str | Sequence[str] | None) -> tuple[str, ...]:
    """Every endpoint, in the order given: each --base-url, else $OPENAI_BASE_URL (a comma-separated list)."""
    given = [flags] if isinstance(flags, str) else list(flags or ())
    if not given:
        given = [u for u in os.environ.get("OPENAI_BASE_URL", "").split(",") if u.strip()]
    if not given:
        raise ConfigError(
            "no endpoint: pass --base-url http://HOST:PORT/v1 or set OPENAI_BASE_URL "
            "(try `evalsup demo` for a run against the built-in mock endpoint)"
        )
    urls: list[str] = []
    for url in given:
        url = url.strip()
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url must start with http:// or https://, got {public_url(url)!r}")
        url = url.rstrip("/")
        if url in urls:
            raise ConfigError(f"--base-url {public_url(url)} is given twice")
        urls.append(url)
    return tuple(urls)


RUN_DIR_SUFFIX = ".run"  # TASKS.jsonl -> TASKS.run (evalsup.rundir.layout lists it with the rest)


def run_dir_of(tasks: Path, out: str | Path | None, shard: str | tuple[int, int] | None) -> Path:
    """The run directory: --out, else TASKS.run beside the task file (its shard-K-of-N/ under --shard, given as
    parsed or as the option's text). Raises ConfigError for a bad --shard."""
    if out is not None:
        return Path(out)
    return default_run_dir(tasks, parse_shard(shard) if isinstance(shard, str) else shard)


def default_run_dir(tasks_path: Path, shard: tuple[int, int] | None = None) -> Path:
    name = tasks_path.name
    for ext in (".jsonl.gz", ".jsonl.zst", ".jsonl"):  # tasks.jsonl.gz -> tasks.run
        if name.endswith(ext):
            stem = name[: -len(ext)]
            break
    else:
        stem = tasks_path.stem
    run_dir = tasks_path.with_name(stem + RUN_DIR_SUFFIX)
    return run_dir / shard_dir_name(*shard) if shard else run_dir


def parse_shard(value: str | None, env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """--shard K/N, or "auto" from a scheduler's array-job variables (evalsup.config.shards)."""
    from evalsup.config.shards import ShardError
    from evalsup.config.shards import parse_shard as parse

    try:
        return parse(value, dict(os.environ) if env is None else env)
    except ShardError as e:
        raise ConfigError(str(e)) from None


WORKER_BASELINE = 100 * MIB  # what one idle worker costs (interpreter, aiohttp, uvloop), with headroom


def default_workers(limit: int | None, cpus: int | None = None) -> int:
    """The most workers a run may have without --workers (it starts with one, see supervisor.scaling): 4,
    fewer when the CPUs or the memory limit cannot carry them (half the limit for baselines)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n = min(4, max(1, 2 * cpus))
    if limit:
        n = min(n, max(1, int(limit * 0.5 // WORKER_BASELINE)))
    return n
