"""Loading a user's callable into a worker: ``package.module:function`` or ``path/to/file.py:function``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_callable(spec: str) -> Callable[..., Any]:
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"{spec!r} is not module:function or file.py:function")
    if target.endswith(".py") or "/" in target:
        path = Path(target).resolve()
        name = f"evalsup_user_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ValueError(f"cannot import {path}")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {attr} is not a callable in {target}")
    return fn  # type: ignore[no-any-return]
