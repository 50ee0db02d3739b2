"""Every provider call of the batch driver goes through here: tried again with backoff while it fails transiently
(no answer, flow control, the server's fault), its other failures sorted once (``classify``) into a listing the
provider does not offer (the caller does without: an upload is sent again, for one) or a refusal, which stops the
run in one line naming what to check and what to run next (``Stop``). One loop for the upload, the create, the
listings, the polling and the downloads of both providers, so that a change to how a failure is read (issue 39:
a gateway's 405 on ``GET /v1/files``) lands in one place.
"""

from __future__ import annotations

import asyncio
import enum
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from evalsup.batch.client import ProviderError
from evalsup.config import exitcodes as ex

T = TypeVar("T")

TRANSIENT_WAIT_S = (0.2, 30.0)  # a call that failed transiently is tried again after these waits, doubling
LIST_TRIES = 4  # a listing that keeps failing transiently is given up after this many tries (the caller does without)
RESUME = "rerun the same command: the run resumes from its journal (batches.jsonl) and pays for nothing twice"


class Stop(Exception):
    """The run must stop: ``code`` is its exit code (FATAL carries it to the supervisor). The message names what
    went wrong and what to run next."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Unlisted(Exception):
    """A listing the provider does not offer (404, 405, 501, or refused for the key), or that kept failing: the
    caller goes on without it."""

    def __init__(self, error: ProviderError) -> None:
        super().__init__(str(error))
        self.error = error


class Failure(enum.Enum):
    TRANSIENT = "transient"  # try again after a wait
    UNLISTED = "unlisted"  # a listing the provider or gateway does not serve: the caller does without it
    REFUSED = "refused"  # the provider said no: stop


def classify(e: ProviderError, listing: bool) -> Failure:
    """What a failed call means. A listing (files, batches) that is refused for any reason is not served to this
    key: a gateway without the route (404, 405, 501) or a key scoped to exclude it (401, 403)."""
    if listing and e.status in (404, 405, 501):  # 501 Not Implemented is no server fault to wait out
        return Failure.UNLISTED
    if e.transient:
        return Failure.TRANSIENT
    return Failure.UNLISTED if listing else Failure.REFUSED


def hint(e: ProviderError) -> str:
    """What to check for a refusal, by its status."""
    if e.status in (401, 403):
        return "check the key (--api-key-env, --api-key-file) and that it may use the Batch API"
    if e.status in (404, 405, 501):
        return "check --base-url: does the provider serve the Batch API there?"
    return "check the provider's reason above"


def backoff(first: float = TRANSIENT_WAIT_S[0], most: float = TRANSIENT_WAIT_S[1]) -> Callable[[], float]:
    """Waits from ``first``, doubling up to ``most``."""
    wait = first / 2

    def nxt() -> float:
        nonlocal wait
        wait = min(most, wait * 2)
        return wait

    return nxt


async def call(what: str, fn: Callable[[], Awaitable[T]], *, listing: bool = False,
               waits: Callable[[], float] | None = None,
               again: Callable[[], Awaitable[T | None]] | None = None) -> T:
    """``fn()`` until it answers. A transient failure waits (``waits``: doubling from 0.2 s to 30 s unless given),
    then, with ``again``, asks it first whether the failed call took effect after all (a create whose answer was
    lost: what it finds is returned instead of calling again, so nothing is paid twice). ``listing``: a refusal,
    or LIST_TRIES transient failures, raise ``Unlisted`` for the caller to do without; any other refusal raises
    ``Stop`` (exit 2) naming what to check, then to rerun."""
    nxt = waits or backoff()
    tries = 0
    e: ProviderError
    while True:
        try:
            return await fn()
        except ProviderError as err:
            e = err
            tries += 1
            kind = classify(e, listing)
            if kind is Failure.UNLISTED or (listing and tries >= LIST_TRIES):
                raise Unlisted(e) from None
            if kind is Failure.REFUSED:
                raise Stop(f"the provider refused {what}: {str(e).rstrip('.')}; {hint(e)}, then {RESUME}",
                           ex.BAD_INPUT) from None
            wait = nxt()
            print(f"evalsup batch: {what}: {e}; trying again in {wait:g}s", file=sys.stderr, flush=True)
        await asyncio.sleep(wait)
        if again is not None and (e.status is None or e.status >= 500):  # a 429 or 408 made nothing
            found = await again()
            if found is not None:
                return found
