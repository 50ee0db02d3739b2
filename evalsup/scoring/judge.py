"""The model-graded scorer's pure half (``--scorer judge``): its prompt template and the grade in a reply.

A template is a text file with ``{prompt}``, ``{messages}``, ``{answer}``, ``{expected}`` and ``{id}`` in it
(``{{`` and ``}}`` for a brace), optionally headed by a block that states how a reply is graded::

    ---
    pattern: GRADE\\s*:\\s*([CPI])\\b
    grades: C=1, P=0.5, I=0
    ---
    ...the prompt...

``pattern`` is searched in the judge's reply (case aside); its first group is the grade, and the *last* match
counts (a judge that reasons "not GRADE: C but ..." ends with its verdict). ``grades`` maps a group to a
number, or is ``number``: the group is the score itself (e.g. 1-10). Without the block, the default pattern and
grades (``GRADE: C`` 1.0, ``GRADE: P`` 0.5, ``GRADE: I`` 0.0) hold. A reply without the pattern is a scorer
error, the reply kept, never a wrong answer. Inspect AI's model_graded_qa grades the same way; its default
template's letters are kept, so a template written for it works here with its variables renamed.

No I/O but ``load_template``'s read of the file; the worker (``worker.judge``) and ``evalsup score`` use it.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

JUDGE = "judge"  # the scorer's name (--scorer judge, scores.judge)
VARIABLES = ("prompt", "messages", "answer", "expected", "id")
DEFAULT_PATTERN = r"GRADE\s*:\s*[*_`\"']*([CPI])\b"
DEFAULT_GRADES: dict[str, float] = {"C": 1.0, "P": 0.5, "I": 0.0}

DEFAULT_TEMPLATE = """\
---
pattern: GRADE\\s*:\\s*[*_`"']*([CI])\\b
grades: C=1, I=0
---
You are grading an answer to a task against a reference answer.

<task>
{prompt}
</task>

<answer>
{answer}
</answer>

<reference>
{expected}
</reference>

Decide whether the answer is correct given the reference. It is correct when its final result is the one the
reference gives, whatever its wording, format or added explanation. It is incorrect when it gives another
result, contradicts the reference, hedges between several results, or gives none.

Explain your decision in a few sentences. Then end your reply with one line, GRADE: C when the answer is
correct or GRADE: I when it is incorrect, and write nothing after that line.
"""


class TemplateError(ValueError):
    """A template that cannot be used: the message names the file (and line) and what is wrong."""


@dataclass(frozen=True)
class Template:
    """A parsed template: its text as parts (a literal, or a variable's name), and how a reply is graded."""

    parts: tuple[tuple[bool, str], ...]  # (is a variable, text or name)
    pattern: re.Pattern[str]
    grades: dict[str, float] | None  # None: the group is a number
    source: str = "the default template"
    text: str = field(default="", repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def render(self, values: dict[str, str]) -> str:
        return "".join(values.get(s, "") if var else s for var, s in self.parts)

    def grade(self, reply: str) -> tuple[float | None, str | None]:
        """(score, the grade as the reply wrote it) from the last match of the pattern; (None, None): no grade
        (or a ``number`` grade that is not a finite number)."""
        last = None
        for m in self.pattern.finditer(reply):
            last = m
        if last is None:
            return None, None
        got = (last.group(1) if last.groups() else last.group(0)) or ""
        if self.grades is None:
            try:
                value = float(got.replace(",", "."))
            except ValueError:
                return None, got
            return (value if math.isfinite(value) else None), got
        return self.grades.get(got.strip().upper()), got


_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_KEYS = ("pattern", "grades")


def parse_template(text: str, source: str = "the default template") -> Template:
    """Parse a template's text (``source`` names it in errors). Raises TemplateError."""
    body, pattern, grades, first = _head(text, source)
    parts: list[tuple[bool, str]] = []
    pos = 0
    for m in _TOKEN.finditer(body):
        if m.start() > pos:
            parts.append((False, body[pos:m.start()]))
        tok = m.group(0)
        line = first + body.count("\n", 0, m.start())
        if tok in ("{{", "}}"):
            parts.append((False, tok[0]))
        elif m.group(1) is None:
            raise TemplateError(f"{source}:{line}: a lone {tok!r}: write {tok * 2} for a brace")
        else:
            name = m.group(1).strip()
            if name not in VARIABLES:
                raise TemplateError(f"{source}:{line}: unknown variable {{{m.group(1)}}}: use "
                                    + ", ".join(f"{{{v}}}" for v in VARIABLES) + " ({{ and }} for a brace)")
            parts.append((True, name))
        pos = m.end()
    if pos < len(body):
        parts.append((False, body[pos:]))
    if not any(var for var, _ in parts):
        raise TemplateError(f"{source}: no variable: the judge would never see the answer (use {{answer}})")
    return Template(tuple(parts), pattern, grades, source, text)


def _head(text: str, source: str) -> tuple[str, re.Pattern[str], dict[str, float] | None, int]:
    """The template's body, its pattern and grades (the head block's, else the defaults), and the line the body
    starts at."""
    pattern = DEFAULT_PATTERN
    grades: dict[str, float] | None = dict(DEFAULT_GRADES)
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return text, re.compile(pattern, re.IGNORECASE), grades, 1
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise TemplateError(f"{source}:1: the head block opened by --- is not closed by a line ---") from None
    given: dict[str, str] = {}
    for i in range(1, end):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep or key not in _KEYS:
            raise TemplateError(f"{source}:{i + 1}: expected 'pattern: REGEX' or 'grades: C=1, I=0' (or "
                                f"'grades: number') in the head block, got {line[:60]!r}")
        given[key] = value.strip()
    if "pattern" in given:
        pattern = given["pattern"]
    try:
        compiled = re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        raise TemplateError(f"{source}: pattern {pattern!r} is not a regular expression ({e})") from None
    if compiled.groups < 1:
        raise TemplateError(f"{source}: pattern {pattern!r} has no group: put the grade in ( )")
    if "grades" in given:
        grades = _grades(given["grades"], source)
    return "\n".join(lines[end + 1:]), compiled, grades, end + 2


def _grades(value: str, source: str) -> dict[str, float] | None:
    if value.strip().lower() == "number":
        return None
    out: dict[str, float] = {}
    for item in value.split(","):
        key, sep, num = item.partition("=")
        try:
            out[key.strip().upper()] = float(num)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise TemplateError(f"{source}: grades {value!r}: expected GRADE=NUMBER, ... (C=1, I=0) or 'number'")
    return out


def load_template(path: str | Path | None) -> Template:
    """The template in the file at ``path`` (None: the default). Raises TemplateError, in one line."""
    if path is None:
        return parse_template(DEFAULT_TEMPLATE)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TemplateError(f"--judge-template {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TemplateError(f"--judge-template {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    return parse_template(text, str(path))


# --- the variables, from a task's request and its answer ---------------------------------------------------


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] if isinstance(p, dict) and isinstance(p.get("text"), str) else
                         p if isinstance(p, str) else "" for p in content).strip("\n")
    return "" if content is None else orjson.dumps(content).decode()


def _messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each message of a request: chat ``messages``, or a Responses API ``input`` list."""
    items = body.get("messages")
    if not isinstance(items, list):
        items = body.get("input")
    if not isinstance(items, list):
        return []
    return [(str(m.get("role", "user")), _text(m.get("content"))) for m in items if isinstance(m, dict)]


def prompt_of(body: dict[str, Any]) -> str:
    """What the task asked: its last user message (chat, Responses API input list), else its ``prompt`` /
    ``input`` text."""
    msgs = _messages(body)
    users = [t for r, t in msgs if r == "user"]
    if users:
        return users[-1]
    for key in ("prompt", "input"):
        v = body.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            return "\n".join(v)
    return msgs[-1][1] if msgs else ""


def messages_of(body: dict[str, Any]) -> str:
    """The whole conversation, one ``role: text`` block a message (the prompt alone for other routes)."""
    msgs = _messages(body)
    return "\n\n".join(f"{r}: {t}" for r, t in msgs) if msgs else prompt_of(body)


def expected_text(expected: Any) -> str:
    """``expected`` as the judge reads it: a string as is, several accepted answers one a line, else JSON."""
    if isinstance(expected, str):
        return expected
    if isinstance(expected, list) and len(expected) > 1:
        return "any of:\n" + "\n".join(f"- {expected_text(e)}" for e in expected)
    if isinstance(expected, list) and expected:
        return expected_text(expected[0])
    return orjson.dumps(expected).decode()


def variables(task_id: str, request: dict[str, Any], answer: str, expected: Any) -> dict[str, str]:
    return {"prompt": prompt_of(request), "messages": messages_of(request), "answer": answer,
            "expected": expected_text(expected), "id": task_id}


@dataclass(slots=True)
class Verdict:
    """One judged answer: the score (None when the reply held no grade or the judge failed: ``error`` says
    why), the judge's reply and grade as written, and the judge's tokens."""

    score: float | None
    reply: str | None
    grade: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def detail(self) -> dict[str, Any]:
        """What the record keeps under ``score_detail.judge``."""
        out: dict[str, Any] = {"reply": self.reply}
        if self.grade is not None:
            out["grade"] = self.grade
        if self.prompt_tokens or self.completion_tokens:
            out["usage"] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        return out


def verdict_of(template: Template, reply: str | None, usage: Any = None, error: str | None = None) -> Verdict:
    """The verdict from the judge's reply text (None: no answer came, ``error`` says why) and its usage."""
    pt = ct = 0
    if isinstance(usage, dict):
        pt = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        ct = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    if reply is None:
        return Verdict(None, None, None, error or "the judge gave no answer", pt, ct)
    score, grade = template.grade(reply)
    if score is None:
        why = (f"the judge's grade {grade!r} is not one of the template's grades" if grade is not None
               else f"no grade in the judge's reply (the template's pattern: {template.pattern.pattern})")
        return Verdict(None, reply, grade, why, pt, ct)
    return Verdict(score, reply, grade, None, pt, ct)


def judge_check_problem(base: str, status: int, served: list[str], model: str, key_source: str,
                        detail: str = "") -> str | None:
    """What the judge endpoint's answer to GET /v1/models says is wrong, in one line (None: nothing): its key
    refused, or its model not among those it serves. Read by `evalsup run`'s check and `evalsup score`'s alike."""
    if status in (401, 403):
        return (f"the judge {base} refused its API key ({key_source}; --judge-api-key-env NAME names another) "
                f"(HTTP {status}{': ' + detail if detail else ''})")
    if served and model not in served:
        return (f"the judge's model {model!r} is not served by {base}; it serves: {', '.join(served[:10])} "
                "(--judge-model)")
    return None
