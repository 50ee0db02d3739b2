"""`evalsup run --config FILE`: run options kept in a TOML file (issue 44).

The file holds any run option by its flag's name (``max-tokens = 256``, ``scorer = ["choice", "math"]``,
``hedge = true``; the option's Python name, ``max_tokens``, is read too)::

    base-url = "http://gpu-1:8000/v1"
    model = "llama-3.1-8b"
    max-tokens = 512
    scorer = ["choice"]
    api-key-env = "MY_KEY"

Precedence, highest first: a flag on the command line, ``$EVALSUP_<OPTION>`` in the environment, the config
file, on a resume the run's recorded settings (run.json), the option's default. The file is read by click's
``default_map``, so a value is checked and converted by the option's own type, as a flag's is. A secret never goes
in it (a config file is copied, committed and shared): a key, a password in a URL, or a literal credential header
is refused with a hint to ``api-key-env`` / ``api-key-file`` / ``env:VAR``.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import click

from evalsup.config.options import RUN_OPTIONS, Option

META_KEY = "evalsup.config"  # where the file used is kept in the click context (the start line names it)
_SECRET_KEYS = re.compile(r"^(?:openai[-_])?(?:judge[-_])?(?:api[-_]?key|key|password|secret|token)$", re.I)
_SECRET_HEADERS = re.compile(r"authorization|api[-_]?key|token|secret|cookie", re.I)


def _names() -> dict[str, Option]:
    """Every name a file may use for an option: its flag without dashes ("max-tokens"; "scorer" for --scorer),
    with underscores, and its Python name."""
    out: dict[str, Option] = {}
    for o in RUN_OPTIONS:
        stem = o.flag[2:]
        for n in (stem, stem.replace("-", "_"), o.name, o.name.replace("_", "-")):
            out[n] = o
    return out


def settings_of(path: Path) -> dict[str, Any]:
    """The run options a config file sets, by option name. Raises click.BadParameter with one line naming the
    file (and the key) for a file that is not TOML, an unknown key, a wrong type or a secret."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise click.BadParameter(f"{path}: not TOML: {e}") from None
    names = _names()
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if _SECRET_KEYS.match(key):
            raise click.BadParameter(f"{path}: {key!r}: a key does not belong in a config file (it is copied and "
                                     "shared); name where it is instead: api-key-env = \"VAR\" or api-key-file = "
                                     "\"PATH\"")
        o = names.get(key)
        if o is None:
            near = difflib.get_close_matches(key, list(names), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else " (a run option's flag name, e.g. max-tokens)"
            raise click.BadParameter(f"{path}: {key!r} is not an option of evalsup run{hint}")
        if o.name in out:
            raise click.BadParameter(f"{path}: {key!r} sets {o.flag} a second time")
        out[o.name] = _value(path, key, o, value)
    return out


def _value(path: Path, key: str, o: Option, value: Any) -> Any:
    if isinstance(value, dict):
        raise click.BadParameter(f"{path}: {key!r} is a table; {o.flag} takes a value")
    if o.kind in ("flag", "bool") and not isinstance(value, bool):
        raise click.BadParameter(f"{path}: {key!r} must be true or false")
    if o.multiple:
        values = value if isinstance(value, list) else [value]
        for v in values:
            _no_secret(path, key, o, v)
        return [str(v) if not isinstance(v, int | float) else v for v in values]
    if isinstance(value, list):
        raise click.BadParameter(f"{path}: {key!r} takes one value, not a list")
    _no_secret(path, key, o, value)
    return value


def _no_secret(path: Path, key: str, o: Option, value: Any) -> None:
    if not isinstance(value, str):
        return
    if o.name in ("base_url", "judge_base_url"):
        parts = urllib.parse.urlsplit(value)
        if parts.password or parts.query:
            raise click.BadParameter(f"{path}: {key!r}: a URL with a password or a query (a possible credential) "
                                     "does not belong in a config file; set it in $OPENAI_BASE_URL")
    if o.name == "headers" and ":" in value:
        name, _, val = value.partition(":")
        val = val.strip()
        if _SECRET_HEADERS.search(name) and not (val.startswith("env:") or val.startswith("@")):
            raise click.BadParameter(f"{path}: {key!r}: the header {name.strip()!r} holds a credential; write it "
                                     "as 'NAME: env:VAR' or 'NAME: @FILE' (read when the run starts, never kept)")


def _load(ctx: click.Context, param: click.Parameter, value: Path | None) -> None:
    if value is None:
        return
    ctx.default_map = {**(ctx.default_map or {}), **settings_of(value)}
    ctx.meta[META_KEY] = str(value)


def config_option() -> Any:
    """The --config option: read first (eager), its settings become the defaults of the options after it."""
    return click.option("--config", type=click.Path(path_type=Path, dir_okay=False, exists=True), is_eager=True,
                        expose_value=False, callback=_load, metavar="FILE",
                        help="Run options from a TOML file, by flag name (max-tokens = 256; scorer = [\"choice\"]). "
                             "A flag given wins, then $EVALSUP_<OPTION> (e.g. EVALSUP_MAX_TOKENS), then the file, "
                             "then (on a resume) the run's recorded settings. Keys never go in it.")
