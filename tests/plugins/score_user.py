"""User scorers for tests/integration/test_scorers.py (and test_batch_cap.py)."""

from __future__ import annotations

import time
from typing import Any


def length_and_hit(task: dict[str, Any], response: Any) -> dict[str, float]:
    text = response["choices"][0]["message"]["content"]
    return {"length": float(len(text)), "hit": float(task.get("expected", "") in text)}


def boom(task: dict[str, Any], response: Any) -> float:
    if task["id"].endswith("3"):
        raise ValueError("cannot score this one")
    return 1.0


def slow(task: dict[str, Any], response: Any) -> bool:
    if task["id"] == "t0":
        time.sleep(3)
    return True


def cpu_heavy(task: dict[str, Any], response: Any) -> float:
    x = 0
    for i in range(300_000):
        x = (x * 31 + i) % 1_000_003
    return float(x % 2)


def paced(task: dict[str, Any], response: Any) -> bool:
    """A scorer that takes 0.4 s an answer (tests/integration/test_batch_cap.py: results go out with pauses)."""
    time.sleep(0.4)
    return True
