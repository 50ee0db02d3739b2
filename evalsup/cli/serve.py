"""`evalsup serve`: the command. Imports the server (aiohttp) only when the command runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from evalsup.config.exitcodes import BAD_INPUT

if TYPE_CHECKING:
    from evalsup.serve.runner import Settings

# `evalsup run` options serve gives each batch's run itself, and why one given after -- cannot be
SERVE_SETS = {
    "out": "each batch's run directory is under --data",
    "base_url": "its endpoints are serve's --upstream",
    "api_key_env": "the upstream's key is serve's --upstream-api-key-env",
    "max_concurrency": "each run's live share of serve's --concurrency is written to its run directory",
    "json_summary": "serve reads the run's summary",
    "quiet": "serve reads the run's output",
    "check": "an upstream down when a run starts is waited for, never a failed batch",
}
# and those that cannot go to it, and why
SERVE_REFUSES = {
    "fresh": "a batch's run resumed after a restart would start over and pay again",
    "resume": "serve resumes each batch's run itself; a new batch has nothing to resume",
    "retry_failed": "each restart of serve reruns a batch's run, which would send its failed lines again each time",
    "shard": "a batch is one run on this machine; its output file needs every line",
    "ray": "a batch is one run on this machine, sharing serve's live limit per upstream",
    "shards": "a batch is one run on this machine, sharing serve's live limit per upstream",
    "metrics_port": "every batch's run would bind the same port (serve's own /metrics counts the batches)",
}


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.option("--upstream", "upstreams", multiple=True, required=True, metavar="URL",
              help="An OpenAI-compatible endpoint's base URL with /v1 (repeatable: requests are spread over them).")
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory of the server's state: files, batches and each batch's run directory.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (anything but loopback needs --api-keys).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: any free one).")
@click.option("--api-keys", "api_keys", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="File of the keys clients may use, one a line (or its SHA-256): each key sees only its own files "
                   "and batches.")
@click.option("--upstream-api-key-env", default="OPENAI_API_KEY", show_default=True, metavar="NAME",
              help="Environment variable holding the upstream's key (never printed or stored).")
@click.option("--max-running-batches", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Batches whose runs go at once; the others wait, keys served in turn.")
@click.option("--concurrency", type=click.IntRange(1, 100_000), default=256, show_default=True,
              help="Requests in flight per upstream, shared live by the running batches: max-min fair by key, "
                   "then by batch, an idle share lent to the others (docs/serve.md).")
@click.option("--max-file-mb", type=click.FloatRange(0, None, min_open=True), default=200.0, show_default=True,
              help="Largest upload (413 past it).")
@click.option("--max-file-lines", type=click.IntRange(1), default=1_000_000, show_default=True,
              help="Most lines in an upload (413 past it).")
@click.option("--retention-hours", type=click.FloatRange(0, None, min_open=True), default=720.0, show_default=True,
              help="Files expire this long after their upload; ended batches (their run directories) are removed "
                   "this long after their end.")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- RUN_OPTION ...]")
def serve_command(upstreams: tuple[str, ...], data: Path, host: str, port: int, api_keys: Path | None,
                  upstream_api_key_env: str, max_running_batches: int, concurrency: int, max_file_mb: float,
                  max_file_lines: int, retention_hours: float, run_args: tuple[str, ...]) -> None:
    """Serve OpenAI's Files and Batches API in front of OpenAI-compatible endpoints: each batch is an evalsup
    run (exactly once, resumed after any crash of the server). Options after -- go to each batch's `evalsup run`
    (e.g. -- --max-attempts 3). See docs/serve.md.

    Exit codes: 0 after SIGTERM or SIGINT (drained: every run checkpointed); 2 bad settings (a key file, a host
    beyond loopback without keys, a port in use, a run option after -- that evalsup run refuses or that serve sets
    itself: checked at the start); 73 another evalsup serve holds DIR; 1 DIR's state unreadable."""
    from evalsup.serve.app import Limits
    from evalsup.serve.auth import KeysError, read_keys
    from evalsup.serve.runner import Settings
    from evalsup.serve.server import ServeConfig, ServeError, is_loopback, serve_forever

    owners = None
    if api_keys is not None:
        try:
            owners = read_keys(api_keys)
        except KeysError as e:
            click.echo(f"evalsup: {e}", err=True)
            sys.exit(BAD_INPUT)
    elif not is_loopback(host):
        click.echo(f"evalsup: --host {host} is not a loopback address: serving beyond this machine needs "
                   "--api-keys FILE", err=True)
        sys.exit(BAD_INPUT)
    settings = Settings(upstreams=upstreams, api_key_env=upstream_api_key_env, max_running=max_running_batches,
                        concurrency=concurrency, retention_s=int(retention_hours * 3600), run_args=run_args)
    problem = run_options_problem(click.get_current_context(), data, settings)
    if problem is not None:  # before anything is made or bound, not as the failure of every batch
        click.echo(f"evalsup: {problem}", err=True)
        sys.exit(BAD_INPUT)
    limits = Limits(max_bytes=int(max_file_mb * (1 << 20)), max_lines=max_file_lines)
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        click.echo(f"evalsup: --data {data}: {e.strerror}", err=True)
        sys.exit(BAD_INPUT)
    try:
        sys.exit(serve_forever(ServeConfig(host, port, data, settings, limits, owners)))
    except ServeError as e:
        click.echo(f"evalsup: {e}", err=True)
        sys.exit(e.code)


def run_options_problem(ctx: click.Context, data: Path, settings: Settings) -> str | None:
    """Why the `evalsup run` options after -- cannot go to a batch's run (one line naming the option), or None.
    They are parsed by the `run` command itself (found through ``ctx``'s root: cli.main imports this module, so
    it is not imported back), then built into a run's config with serve's own options as each batch's run gets
    them, as `evalsup run` does before it starts: nothing is read from --data, nothing is started."""
    from evalsup.config.run_config import ConfigError, build_config

    root = ctx.find_root()
    run = root.command.get_command(root, "run") if isinstance(root.command, click.Group) else None
    if run is None:  # serve_command called on its own, outside `evalsup`: each run says what it refuses
        return None
    home = data / "runs" / "batch"  # a placeholder: never created
    try:
        # --help is no option of a batch's run: refused as any unknown one (not the run's help and exit 0)
        alone = run.make_context("evalsup run", [str(home / "input.jsonl"), *settings.run_args], help_option_names=[])
        for name, why in (*SERVE_SETS.items(), *SERVE_REFUSES.items()):
            source = alone.get_parameter_source(name)
            p = next(p for p in run.params if p.name == name)
            flag = "/".join([p.opts[0], *p.secondary_opts])
            if source is ParameterSource.COMMANDLINE:
                return f"after --: {flag} " + (f"is set by evalsup serve ({why})" if name in SERVE_SETS
                                               else f"cannot go to a batch's run: {why}")
            # serve's own options come last on a run's command line and win over these; a refused one would not
            if name in SERVE_REFUSES and source is ParameterSource.ENVIRONMENT:
                return f"{p.envvar} in serve's environment sets {flag} for every batch's run, which cannot take " \
                       f"it: {why}"
            if name in SERVE_REFUSES and source is ParameterSource.DEFAULT_MAP:
                return f"after --: --config sets {name.replace('_', '-')} ({flag}), which a batch's run cannot " \
                       f"take: {why}"
        ups = [x for u in settings.upstreams for x in ("--base-url", u)]
        full = run.make_context("evalsup run", [
            str(home / "input.jsonl"), "--out", str(home / "run"), *ups, "--api-key-env", settings.api_key_env,
            "--max-concurrency", str(settings.concurrency), "--no-check",
            *settings.run_args, "--json", "--quiet"], help_option_names=[])
        build_config(home / "input.jsonl", {k: v for k, v in full.params.items() if k != "tasks"
                                            and full.get_parameter_source(k) not in (None, ParameterSource.DEFAULT)})
    except click.ClickException as e:
        return f"after --: {e.format_message()} (see evalsup run --help)"
    except ConfigError as e:
        return f"after --: {e}"
    return None
