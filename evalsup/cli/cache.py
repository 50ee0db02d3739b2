"""`evalsup cache stats|prune|export|import DIR`: the answer cache of `evalsup run --cache DIR` (evalsup.cache),
looked at and tended offline. Safe while runs use the same cache (every change is a short transaction)."""

from __future__ import annotations

import math
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
import orjson

from evalsup.common.tty_progress import TtyProgress

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

    if not (math.isfinite(max_gb) and max_gb >= 0):  # inf and nan too: one line, not an OverflowError
        _fail(f"--max-gb must be a number of GB, 0 or more, got {max_gb:g}")
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
    request_id, model, path, tokens, times. An entry no run would serve (damaged, or no answer: the checks of
    `run --cache`, a cut answer allowed; a value that is not UTF-8 text) is left out and counted, the first of
    each reason named by its key. A file SQLite cannot read on stops the export, exit 2."""
    from evalsup.cache.keep import entry_unfit
    from evalsup.cache.store import Store, describe, entry_json

    store = _open(directory)
    assert isinstance(store, Store)
    out: IO[bytes] = open(output, "wb") if output is not None else sys.stdout.buffer  # noqa: SIM115
    n = 0
    left = Skipped()
    try:
        for e in store.entries():
            why = entry_unfit(e, e.path, keep_length=True)[1]
            if why is not None:
                left.add(why, f"key {e.key.hex()[:12]}")
                continue
            out.write(entry_json(e))
            n += 1
    except sqlite3.Error as e:  # the file itself is damaged past a row's values (a page, the index)
        _fail(f"the cache {store.path} cannot be read ({describe(e)}); {n:,} entries were exported before it"
              + left.text("left out"))
    finally:
        if output is not None:
            out.close()
        store.close()
    click.echo(f"evalsup: {n:,} entries exported" + left.text("left out"), err=True)


class Skipped:
    """Entries left out, by reason, each reason with where it was first seen: one line at the end."""

    def __init__(self) -> None:
        self.n = 0
        self.why: dict[str, tuple[int, str]] = {}

    def add(self, why: str, where: str) -> None:
        self.n += 1
        got = self.why.get(why)
        if got is None and len(self.why) >= 10:
            why, got = "other reasons", self.why.get("other reasons")
        self.why[why] = (got[0] + 1, got[1]) if got else (1, where)

    def text(self, what: str) -> str:
        if not self.n:
            return ""
        parts = ", ".join(f"{k:,} {why} (first: {at})" for why, (k, at) in self.why.items())
        return f"; {self.n:,} {what}: {parts}"


MAX_LINE_MB = 64.0  # an export's line is one answer's body and ~300 bytes; a run keeps none past --max-response-mb


@cache_command.command("import")
@click.argument("directory", type=CACHE_DIR)
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@click.option("--cache-length", is_flag=True,
              help="Add answers cut at their token limit too (as `run --cache-length` keeps them).")
@click.option("--max-line-mb", type=click.FloatRange(min=0.001, max=4096), default=MAX_LINE_MB,
              show_default=True, help="A longer line refuses the import (it is never held whole).")
def import_(directory: Path, source: Path, cache_length: bool, max_line_mb: float) -> None:
    """Add the entries of an export (SOURCE, or - for stdin) to the cache in DIR (made if need be); an entry
    whose key is there already is kept as it is. Each body is stored as compact JSON. An entry a run would not
    keep (a status other than 200, an error body, null, no answer for its path, filtered, cut unless
    --cache-length) is left out and counted; a line that is not an entry (not JSON, a field of the wrong kind,
    a number out of range, a line past --max-line-mb) refuses the whole import, exit 2."""
    from evalsup.cache.keep import why_unfit
    from evalsup.cache.store import BadEntry, Entry, Store, describe, entry_from_json

    if str(source) != "-" and not source.exists():
        _fail(f"{source}: no such file")
    limit = int(max_line_mb * (1 << 20))
    f: IO[bytes] = sys.stdin.buffer if str(source) == "-" else open(source, "rb")  # noqa: SIM115
    name = "stdin" if str(source) == "-" else str(source)
    store = _open(directory, create=True)
    assert isinstance(store, Store)
    left = Skipped()
    progress = TtyProgress("lines read")  # on a terminal only

    def read() -> Iterator[Entry]:
        i = 0
        while line := f.readline(limit + 1):  # bounded: a line past the limit is never held whole
            i += 1
            progress.tick()
            if len(line) > limit and not line.endswith(b"\n"):
                raise BadEntry(f"{name}:{i}: a line longer than {max_line_mb:g} MiB (--max-line-mb); "
                               "nothing was imported")
            if not line.strip():
                continue
            try:
                e = entry_from_json(line)
            except BadEntry as err:
                raise BadEntry(f"{name}:{i}: not a cache entry ({err}); nothing was imported") from None
            why = why_unfit(e.status, e.body, e.path, cache_length)[1]
            if why is not None:
                left.add(why, f"{name}:{i}")
                continue
            yield e

    try:
        added = store.add_missing(read())
    except BadEntry as e:
        _fail(str(e))
    except sqlite3.Error as e:  # (one transaction: nothing was added)
        _fail(f"the cache {store.path} cannot be written ({describe(e)}); nothing was imported")
    finally:
        progress.close()
        if f is not sys.stdin.buffer:
            f.close()
        store.close()
    click.echo(f"evalsup: {added:,} entries added to {directory}"
               + left.text("not added (a run would not keep them)"))
