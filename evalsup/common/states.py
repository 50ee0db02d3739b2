"""States written in one process or file and compared in others: one enum each, so that no two places spell a
state their own way. Their values are what the files and --json outputs hold (a StrEnum compares, formats and
serializes as its value)."""

from __future__ import annotations

import enum


class EndpointState(enum.StrEnum):
    """An endpoint in a run with several (the supervisor's memory samples, `evalsup status`, the report)."""

    UP = "up"  # serving: gets requests
    DOWN = "down"  # ejected: its breaker is open, probed until it answers
    OUT = "out"  # left out of the run: it failed the connection check, or refused the API key
