"""The Python API's exceptions, and the one place that maps a run's exit code and message to them.

    EvalsupError
    ├── BadInput              the task input (a line, the file, a changed input): fix it, rerun
    ├── BadSettings           an option, the endpoint's URL, key or model: fix it, rerun
    ├── ResultsDamaged        a results file read back holds a line that is no record, or a second record for
    │                         a task: `evalsup repair RUN_DIR`
    └── RunStopped            the run stopped before every task had its record; .code, .resumable
        └── EndpointUnavailable   the endpoint could not be reached, or stayed down past --max-wait-down

``str(e)`` is the one line the CLI prints (without its ``evalsup: `` prefix).
"""

from __future__ import annotations

import re

from evalsup.config.exitcodes import BAD_INPUT as EXIT_BAD
from evalsup.config.exitcodes import LOCKED as EXIT_LOCKED
from evalsup.config.exitcodes import OK as EXIT_OK
from evalsup.config.exitcodes import RESUMABLE as EXIT_RESUMABLE


class EvalsupError(Exception):
    """Every error evalsup's Python API raises for something a user can cause or fix."""

    def __init__(self, message: str, code: int = EXIT_BAD) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class BadInput(EvalsupError):
    """The task input is wrong: a bad line (``file:line: reason``), a missing or unreadable file, an input that
    differs from the one the run directory was started with."""


class BadSettings(EvalsupError):
    """An option or the endpoint's settings are wrong (a value out of range, no --base-url, a wrong key or
    model): nothing was sent."""


class ResultsDamaged(EvalsupError):
    """A results file read back (``read_results``, ``to_pandas``) is damaged: a line that is no record, or a
    second record for a task. The message is the one `evalsup status` prints (``results.jsonl:LINE: ...``,
    naming the first line too for a second record) and says what `evalsup repair` does; ``code`` is 2, its exit
    code."""


class RunStopped(EvalsupError):
    """The run stopped before every task had its record. ``resumable``: the same call again carries on."""

    def __init__(self, message: str, code: int, resumable: bool = True) -> None:
        super().__init__(message, code)
        self.resumable = resumable


class EndpointUnavailable(RunStopped):
    """The endpoint could not be reached, or was down longer than --max-wait-down; no task was failed for it."""


# Messages of exit code 2 that are about the input rather than the settings.
_INPUT = re.compile(
    r"^\S.*:\d+: "  # file:line: reason (a bad task line)
    r"|: no such file|: not a regular file|: not a (gzip|zstandard) file|: not a valid (gzip|zstandard) stream"
    r"|^tasks\[\d+\]: |: not the tasks the run in |changed since the run in|: cannot read: "
    r"|is shorter than its checkpoint|stdin \(-\) is a terminal|reading \.zst needs|: no task in it|^bad input: "
)
_ENDPOINT = re.compile(r"cannot reach the endpoint|the endpoint has been down")


def error_for_exit(code: int, message: str) -> EvalsupError | None:
    """The exception for a finished `evalsup run` with this exit code and last message; None for success."""
    if code == EXIT_OK:
        return None
    if code < 0:  # killed by a signal (kill -9, the OOM killer): the checkpoint stands, a rerun carries on
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        # (its last line, if any, is progress, not a reason)
        return RunStopped(f"the run was killed by {name}; call again with the same tasks and out to resume", code)
    message = message or f"evalsup run exited with code {code}"
    if _ENDPOINT.search(message):
        return EndpointUnavailable(message, code)
    if code == EXIT_BAD:
        return BadInput(message, code) if _INPUT.search(message) else BadSettings(message, code)
    # 75: stopped before the end, a rerun carries on from the checkpoint; 73: another run holds the run
    # directory (call again once it is done); 1 and anything else: a rerun alone will not fix it
    return RunStopped(message, code, resumable=code in (EXIT_RESUMABLE, EXIT_LOCKED))
