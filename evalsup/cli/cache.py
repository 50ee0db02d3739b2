"""`evalsup cache stats|prune|export|import DIR`: the answer cache of `evalsup run --cache DIR` (evalsup.cache),
looked at and tended offline. Safe while runs use the same cache (every change is a short transaction)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
import orjson

CACHE_DIR = click.Path(path_type=Path, file_okay=False)


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"evalsup: {msg}", err=True)
    sys.exit(code)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"


def _open(directory: Path, create: bool = False) -> object:
    from evalsup.cache.store import CacheError, Store, cache_file

    if not create and not cache_file(directory).exists():
        _fail(f"no cache in {directory} (no {cache_file(directory).name}): `evalsup run --cache {directory}` makes one")
    try:
        return Store(directory)
    except CacheError as e:
        _fail(str(e))
    raise AssertionError("unreachable")


@click.group("cache")
def cache_command() -> None:
    """The answer cache across runs (`evalsup run --cache DIR`): one SQLite file, DIR/cache.sqlite.

    \b
    evalsup cache stats DIR                 entries, bytes, tokens, models
    evalsup cache prune DIR --max-gb 2      delete the least recently used entries down to 2 GB
    evalsup cache export DIR -o c.jsonl     every entry as a JSON line (bodies byte for byte)
    evalsup cache import DIR c.jsonl        add an export's entries (those already there are kept)
    """


@cache_command.command("stats")
@click.argument("directory", type=CACHE_DIR)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def stats(directory: Path, as_json: bool) -> None:
    """What the cache in DIR holds."""
    from evalsup.cache.store import Store

    store = _open(directory)
    assert isinstance(store, Store)
    s = store.stats()
    store.close()
    if as_json:
        click.echo(orjson.dumps(s, option=orjson.OPT_INDENT_2).decode())
        return
    click.echo(f"{s['path']}: {s['entries']:,} answers, {_size(s['body_bytes'])} of bodies "
               f"({_size(s['budget_bytes'])} counted against --cache-max-gb; files {_size(s['file_bytes'])})")
    click.echo(f"  tokens kept: {s['prompt_tokens']:,} prompt, {s['completion_tokens']:,} completion")
    if s["models"]:
        click.echo("  models: " + ", ".join(f"{m} {n:,}" for m, n in s["models"].items()))


@cache_command.command("prune")
@click.argument("directory", type=CACHE_DIR)
@click.option("--max-gb", type=float, required=True, help="Delete the least recently used entries down to this.")
def prune(directory: Path, max_gb: float) -> None:
    """Delete the least recently used answers until the cache in DIR fits in --max-gb."""
    from evalsup.cache.store import Store

    if not max_gb >= 0:
        _fail(f"--max-gb must be 0 or more, got {max_gb:g}")
    store = _open(directory)
    assert isinstance(store, Store)
    gone = store.prune(int(max_gb * (1 << 30)), to=1.0)
    left = store.bytes_used()
    store.close()
    click.echo(f"evalsup: {gone:,} entries deleted; {_size(left)} left")


@cache_command.command("export")
@click.argument("directory", type=CACHE_DIR)
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write here (default: stdout).")
def export(directory: Path, output: Path | None) -> None:
    """Every answer in the cache of DIR as JSON lines (oldest use first): key, body (its exact text), status,
    request_id, model, path, tokens, times."""
    from evalsup.cache.store import Store, entry_json

    store = _open(directory)
    assert isinstance(store, Store)
    out: IO[bytes] = open(output, "wb") if output is not None else sys.stdout.buffer  # noqa: SIM115
    n = 0
    try:
        for e in store.entries():
            out.write(entry_json(e))
            n += 1
    finally:
        if output is not None:
            out.close()
        store.close()
    click.echo(f"evalsup: {n:,} entries exported", err=True)


@cache_command.command("import")
@click.argument("directory", type=CACHE_DIR)
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
def import_(directory: Path, source: Path) -> None:
    """Add the entries of an export (SOURCE, or - for stdin) to the cache in DIR (made if need be); an entry
    whose key is there already is kept as it is. A line that is not an entry refuses the whole import."""
    from evalsup.cache.store import Entry, Store, entry_from_json

    if str(source) != "-" and not source.exists():
        _fail(f"{source}: no such file")
    store = _open(directory, create=True)
    assert isinstance(store, Store)
    name = "stdin" if str(source) == "-" else str(source)

    def read(f: IO[bytes]) -> Iterator[Entry]:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield entry_from_json(line)
            except (ValueError, KeyError, TypeError) as e:
                raise click.ClickException(f"{name}:{i}: not a cache entry ({e}); nothing was imported") from None

    f: IO[bytes] = sys.stdin.buffer if str(source) == "-" else open(source, "rb")  # noqa: SIM115
    try:
        added = store.add_missing(read(f))
    except click.ClickException as e:
        _fail(e.message)
    finally:
        if f is not sys.stdin.buffer:
            f.close()
        store.close()
    click.echo(f"evalsup: {added:,} entries added to {directory}")
