"""Loading a user's callable into a worker: ``package.module:function`` or ``path/to/file.py:function``.

Whatever goes wrong is one line naming the spec and, for the user's file, ``file:LINE`` (issue 39): a syntax
error, a file that cannot be read, a module that is not there, or an exception while the module runs (the
line of the user's file it was raised at), never a traceback. ``check`` finds the first three before a run
starts without running the user's code (the file is compiled, not executed); ``load_callable`` runs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class PluginError(ValueError):
    """A user's callable that cannot be loaded; the message is one line."""


def _split(spec: str) -> tuple[str, str, bool]:
    """(module or file, function, whether it is a file)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise PluginError(f"{spec!r} is not module:function or file.py:function")
    return target, attr, target.endswith(".py") or "/" in target


def _syntax(spec: str, e: SyntaxError) -> PluginError:
    where = f"{e.filename}:{e.lineno}" if e.lineno else str(e.filename)
    text = f" ({' '.join(e.text.split())!r})" if e.text and e.text.strip() else ""
    return PluginError(f"{where}: {type(e).__name__}: {e.msg}{text} ({spec})")


def check(spec: str) -> None:
    """Refuse a spec that cannot load, without running its code: a file that cannot be read or does not
    compile, a top-level module that is not there. PluginError (one line)."""
    target, _attr, is_file = _split(spec)
    if is_file:
        path = Path(target)
        try:
            source = path.read_bytes()
        except OSError as e:
            raise PluginError(f"{spec}: cannot read {path} ({e.strerror})") from None
        try:
            compile(source, str(path), "exec", dont_inherit=True)
        except SyntaxError as e:
            raise _syntax(spec, e) from None
        except ValueError as e:  # source code string cannot contain null bytes
            raise PluginError(f"{path}: {e} ({spec})") from None
    else:
        top = target.split(".")[0]
        if importlib.util.find_spec(top) is None:  # only the top level: a package's import runs its code
            raise PluginError(f"{spec}: no module named {top!r}")


def load_callable(spec: str) -> Callable[..., Any]:
    target, attr, is_file = _split(spec)
    try:
        if is_file:
            path = Path(target).resolve()
            if not path.is_file():
                raise PluginError(f"{spec}: cannot read {path} (no such file)")
            name = f"evalsup_user_{path.stem}"
            mod_spec = importlib.util.spec_from_file_location(name, path)
            if mod_spec is None or mod_spec.loader is None:
                raise PluginError(f"{spec}: cannot import {path}")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except PluginError:
        raise
    except SyntaxError as e:
        raise _syntax(spec, e) from None
    except ModuleNotFoundError as e:
        raise PluginError(f"{spec}: no module named {e.name!r}") from None
    except Exception as e:  # the user's module raised while it ran: its line, not a traceback
        raise PluginError(f"{_raised_at(e)}importing it raised {type(e).__name__}: {e} ({spec})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise PluginError(f"{spec!r}: {attr} is not a callable in {target}")
    return fn  # type: ignore[no-any-return]


def _raised_at(e: BaseException) -> str:
    """``file:LINE: `` of the last frame outside Python's import machinery that ``e`` passed, or ""."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<frozen")
              and f.filename != __file__]
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""
