"""What an answer says it was billed for (issue 40), read from its body in any of the shapes evalsup meets: its
prompt and completion tokens (chat's ``prompt_tokens``/``completion_tokens``, the Responses API's and Anthropic's
``input_tokens``/``output_tokens``), the part of the prompt read from the provider's prompt cache and the part
written to it (OpenAI's ``prompt_tokens_details``/``input_tokens_details`` ``cached_tokens`` and
``cache_write_tokens``; Anthropic's ``cache_read_input_tokens``/``cache_creation_input_tokens``, whose
``input_tokens`` are the uncached part only, and its ``cache_creation`` split of the writes by how long they are
kept: ``ephemeral_5m_input_tokens`` and ``ephemeral_1h_input_tokens``, billed at different rates), and the
``service_tier`` the response names.

One reading for both sides, so they price alike: the worker puts these counts in a RESULT's meta (``pt``, ``ct``,
``cr``, ``cw``, ``w1``, ``tr``: the budget settles the task with them while the run goes) and ``rundir.usage`` reads the
records back with it (a resume's spend). Pure; a count that is not a whole number >= 0 is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Billed", "billed", "by_batch", "tier_of"]


@dataclass(frozen=True, slots=True)
class Billed:
    """One answer's tokens as billed. ``cached`` and ``written`` are parts of ``prompt`` (every prompt token),
    ``written_1h`` a part of ``written``."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0  # read from the provider's prompt cache (a cheaper rate where the price has one)
    written: int = 0  # written to it (Anthropic's cache writes: a dearer rate where the price has one)
    # of them, those kept an hour (Anthropic's ``ephemeral_1h_input_tokens``: 2x the input rate, where the
    # 5-minute writes are 1.25x); the rest of ``written`` are the 5-minute kind, the default
    written_1h: int = 0


NOTHING = Billed()


def count(v: Any) -> int:
    """A token count as the body gives it: a whole number >= 0, else 0 (a bool, a float, a string...)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def billed(usage: Any) -> Billed:
    """The tokens of a body's ``usage`` (anything: not a mapping is nothing billed)."""
    if not isinstance(usage, dict):
        return NOTHING
    pt = count(usage.get("prompt_tokens", usage.get("input_tokens")))
    ct = count(usage.get("completion_tokens", usage.get("output_tokens")))
    read = count(usage.get("cache_read_input_tokens"))
    written = count(usage.get("cache_creation_input_tokens"))
    hour = 0
    split = usage.get("cache_creation")  # Anthropic's writes by how long they are kept (5 minutes, 1 hour)
    if isinstance(split, dict):
        hour = count(split.get("ephemeral_1h_input_tokens"))
        # the total is the sum of the kinds; a body whose total says less is taken at its parts (the dearer)
        written = max(written, count(split.get("ephemeral_5m_input_tokens")) + hour)
    if read or written:
        if "prompt_tokens" not in usage:  # Anthropic's own shape: input_tokens are the uncached part
            return Billed(pt + read + written, ct, read, written, min(hour, written))
        # an OpenAI-shaped gateway in front of Anthropic (LiteLLM's proxy): prompt_tokens has them already
        read = min(read, pt)
        written = min(written, pt - read)
        return Billed(pt, ct, read, written, min(hour, written))
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    if isinstance(details, dict):
        read, written = count(details.get("cached_tokens")), count(details.get("cache_write_tokens"))
        read = min(read, pt)
        written = min(written, pt - read)
    return Billed(pt, ct, read, written)


def tier_of(body: Any) -> str | None:
    """The ``service_tier`` a body names (a response's: the tier it was served at; a request's: the one asked)."""
    tier = body.get("service_tier") if isinstance(body, dict) else None
    return tier if isinstance(tier, str) and tier else None


def by_batch(batch: Any) -> bool:
    """Whether a record's ``metrics.batch`` (--batch-api) says its answer was billed at the batch API's rates: it
    came from the provider's batch, not from the online request ``--batch-fallback online`` sent after it
    (``"fallback": "online"``: a request of its own, at the standard rates). The batch driver's RESULT meta
    (``bt``) and the read-back ask this, so the live spend and a resume's agree."""
    return isinstance(batch, dict) and batch.get("fallback") != "online"
