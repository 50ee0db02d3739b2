"""A worker plugin that reads the whole parsed body: ``--worker-plugin tests/plugins/whole_body.py:needs_text``.

It raises (the worker exits and the task is handed on, then written as worker_crashed) unless the answer's
text is there: a worker with a plugin must build each body whole, large ones included.
"""

from __future__ import annotations

from typing import Any


def needs_text(task: dict[str, Any], outcome: Any) -> None:
    if outcome.error is None:
        text = outcome.parsed["choices"][0]["message"]["content"]
        if not isinstance(text, str) or len(text) < 1000:
            raise ValueError("the plugin did not get the answer's text")
