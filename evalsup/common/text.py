"""How evalsup writes figures for a person (the progress line, `evalsup status`)."""

from __future__ import annotations


def fmt_duration(seconds: float) -> str:
    """``42s``, ``12m05s``, ``3h07m``."""
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
