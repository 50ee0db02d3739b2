"""The ``math`` scorer's reading by Hugging Face's math-verify, when it is installed (``pip install evalsup[math]``).

math-verify parses an answer's LaTeX and plain expressions into sympy and compares them with the expected answer
as lighteval and open-r1 do: ``$1.5 \\times 10^3$`` equals 1500, ``$2^{10}$`` equals 1024, ``\\frac{1}{2}`` equals
0.5, and a symbolic answer (``x+1``) is compared symbolically. Without it the built-in reader in ``scorers.py``
scores (numbers only); the summary names which one did (``implementation``).

Time limit: math-verify bounds a parse and a comparison with ``signal.alarm``, which works only in a process's
main thread. ``evalsup score`` scores there, so each answer gets ``PARSE_TIMEOUT_S`` to parse and
``VERIFY_TIMEOUT_S`` to compare; a worker scores in a thread pool, where ``--scorer-timeout`` is the bound (a
timed-out call is an error score for that task, and the run moves on).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import threading
from functools import cache
from typing import Any

PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5
_EXPRESSION = re.compile(r"[\d\\+\-*/^=()]")


@cache
def version() -> str | None:
    """math-verify's version when it can be imported, else None (the built-in reader scores)."""
    try:
        import math_verify  # type: ignore[import-untyped,unused-ignore]  # noqa: F401
    except ImportError:
        return None
    # its warning that the timeout is off in a thread is said on every first call: the bound is ours there
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        return importlib.metadata.version("math-verify")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def implementation() -> str:
    """Which reading the ``math`` scorer uses in this process, as the summary says it."""
    v = version()
    return f"math-verify {v}" if v else "built-in"


def matches(answer: str, expected: list[str]) -> bool:
    """Whether the answer's final expression equals one of the expected ones (math-verify must be installed).
    An expected answer math-verify cannot read is a ValueError: the task's error, not a wrong answer."""
    from math_verify import parse, verify  # type: ignore[import-untyped,unused-ignore]

    main = threading.current_thread() is threading.main_thread()
    parse_t: Any = PARSE_TIMEOUT_S if main else None
    verify_t: Any = VERIFY_TIMEOUT_S if main else None
    golds = []
    for e in expected:
        gold = _gold(e, parse_t)
        if not gold:
            raise ValueError(f"'expected' {e!r} is not a number nor an expression math-verify reads")
        golds.append(gold)
    got = parse(answer.replace("\u2212", "-"), parsing_timeout=parse_t)  # a typeset minus sign read as one
    return bool(got) and any(verify(gold, got, timeout_seconds=verify_t) for gold in golds)


def _gold(expected: str, parse_t: Any) -> list[Any]:
    """math-verify's reading of an expected answer: as written ("1,234", "0.5", "\\frac{1}{2}"), else as LaTeX
    math when it holds a digit, an operator or a command ("x+1" reads as an expression only between dollars);
    [] when neither reads: a word such as "many" or "B" is not a math answer."""
    from math_verify import parse  # type: ignore[import-untyped,unused-ignore]

    e = expected.replace("\u2212", "-")
    got = parse(e, parsing_timeout=parse_t)
    if not got and _EXPRESSION.search(e):  # a word ("many", "B") would read as a product of variables
        got = parse(f"${e}$", parsing_timeout=parse_t)
    return list(got)
