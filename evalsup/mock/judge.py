"""The mock as a judge (``MockConfig.judge``): it grades by a rule a test knows.

A chat request whose last user message holds an ``<answer>`` and a ``<reference>`` block (as evalsup's default
judge template writes them) is answered ``GRADE: C`` when the answer's text equals the reference's (white space
at the ends aside), else ``GRADE: I``, after a sentence of reasoning. An answer holding ``[no grade]`` gets a
reply with no grade at all (a judge that did not follow its instructions). Other requests are answered as
usual.
"""

from __future__ import annotations

import re
from typing import Any

NO_GRADE = "[no grade]"
_BLOCK = {tag: re.compile(rf"<{tag}>\n?(.*?)\n?</{tag}>", re.DOTALL) for tag in ("answer", "reference")}


def _last_user_text(body: dict[str, Any]) -> str | None:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return None
    for m in reversed(msgs):
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
            return str(m["content"])
    return None


def judge_reply(body: dict[str, Any]) -> str | None:
    """The judge's reply to a grading request, or None when the request is not one (answer it as usual)."""
    text = _last_user_text(body)
    if text is None:
        return None
    answer, reference = _BLOCK["answer"].search(text), _BLOCK["reference"].search(text)
    if answer is None or reference is None:
        return None
    got, want = answer.group(1).strip(), reference.group(1).strip()
    if NO_GRADE in got:
        return "I cannot tell whether this answer is right."
    if got == want:
        return "The answer gives the reference's result.\nGRADE: C"
    return "The answer does not give the reference's result.\nGRADE: I"
