"""The batch driver's one loop for provider calls (evalsup.batch.calls): what is tried again, what a listing the
provider does not serve becomes, what a refusal tells the user to do next, and a lost create found instead of
made twice."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from evalsup.batch.calls import LIST_TRIES, Stop, Unlisted, call
from evalsup.batch.client import ProviderError
from evalsup.config import exitcodes as ex


def calls_failing(*errors: ProviderError, answer: Any = "ok") -> tuple[Callable[[], Awaitable[Any]], list[int]]:
    """A call that fails with ``errors`` in turn, then answers; and the count of times it was made."""
    made = [0]

    async def fn() -> Any:
        made[0] += 1
        if made[0] <= len(errors):
            raise errors[made[0] - 1]
        return answer

    return fn, made


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def test_transient_failures_are_tried_again_until_it_answers() -> None:
    fn, made = calls_failing(ProviderError(None, "reset"), ProviderError(429, "slow down"),
                             ProviderError(503, "busy"))
    assert run(call("the upload of chunk 1", fn, waits=lambda: 0.0)) == "ok"
    assert made[0] == 4


@pytest.mark.parametrize("status", [404, 405, 501, 403])
def test_a_listing_the_provider_does_not_serve_is_done_without(status: int) -> None:
    fn, made = calls_failing(ProviderError(status, f"HTTP {status}"))
    with pytest.raises(Unlisted, match=str(status)):
        run(call("listing files", fn, listing=True, waits=lambda: 0.0))
    assert made[0] == 1


def test_a_listing_that_keeps_failing_is_given_up_not_waited_on_for_ever() -> None:
    fn, made = calls_failing(*[ProviderError(500, "HTTP 500")] * 10)
    with pytest.raises(Unlisted):
        run(call("listing files", fn, listing=True, waits=lambda: 0.0))
    assert made[0] == LIST_TRIES


@pytest.mark.parametrize(("status", "check"), [(401, "--api-key-env"), (404, "--base-url"), (400, "reason")])
def test_a_refusal_stops_naming_what_to_check_and_to_rerun(status: int, check: str) -> None:
    fn, _ = calls_failing(ProviderError(status, f"HTTP {status}: no"))
    with pytest.raises(Stop) as got:
        run(call("creating the batch of chunk 3", fn, waits=lambda: 0.0))
    msg = str(got.value)
    assert got.value.code == ex.BAD_INPUT
    assert "chunk 3" in msg and f"HTTP {status}" in msg and check in msg
    assert "rerun" in msg and "twice" in msg and "--fresh" not in msg


def test_a_create_whose_answer_was_lost_is_found_not_made_again() -> None:
    fn, made = calls_failing(ProviderError(None, "timeout"), ProviderError(None, "timeout"))
    looked = [0]

    async def find() -> dict[str, str] | None:
        looked[0] += 1
        return {"id": "batch_1"}

    assert run(call("creating", fn, waits=lambda: 0.0, again=find)) == {"id": "batch_1"}
    assert made[0] == 1 and looked[0] == 1


def test_a_create_refused_for_flow_control_is_made_again_without_looking() -> None:
    fn, made = calls_failing(ProviderError(429, "slow down"), answer={"id": "batch_2"})
    looked = [0]

    async def find() -> dict[str, str] | None:
        looked[0] += 1
        return None

    assert run(call("creating", fn, waits=lambda: 0.0, again=find)) == {"id": "batch_2"}
    assert made[0] == 2 and looked[0] == 0
