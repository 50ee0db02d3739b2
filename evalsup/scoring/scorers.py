"""Scorers: a score per task from the task (with its metadata) and the parsed response.

Built-ins: ``exact_match``, ``contains``, ``regex``, ``json_valid``, ``choice``, ``math``. A user scorer is
``module:function`` or ``path/to/file.py:function``; it is called as ``fn(task, response)`` with the task's
fields (``id`` plus its record's metadata, e.g. ``expected``) and the parsed response body, and returns a
number, a bool, a dict of named numbers (each kept as ``NAME.KEY``), or None: the task is not scored by it.

A task without what a scorer needs (``expected``; ``pattern`` for regex) is *unscored* by it: the score is left
out of the record and counted apart in the summary, never as a wrong answer or an error. A pure library: the
workers and ``evalsup score`` both use it.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import orjson

from evalsup.scoring import verify

ScoreFn = Callable[[dict[str, Any], Any], Any]


@dataclass(frozen=True)
class ScorerOptions:
    strip: bool = True
    ignore_case: bool = False
    pattern: str | None = None  # for regex, when the task has no "pattern"
    normalize: bool = False  # exact_match/contains/regex: SQuAD's normalize_answer on both sides


# --- the answer's text -------------------------------------------------------------------------------------
# The same rule as evalsup.tasks.routes (the route table's ``text`` rows, read by ``answer_text``); scoring may
# not import tasks, so it is written here again and tests/unit/test_routes.py checks the two agree.


def response_text(body: Any) -> str:
    """The answer's text: chat message content, completion text, or a Responses API answer (its ``output_text``,
    else every ``output_text`` part of every ``message`` item, joined, as the openai SDK's ``output_text``), or an
    Anthropic Message's text blocks, joined;
    "" when the body holds none (embeddings, a tool call)."""
    if not isinstance(body, dict):
        return ""
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        c = choices[0]
        msg = c.get("message")
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            return str(msg["content"])
        if isinstance(c.get("text"), str):
            return str(c["text"])
    if isinstance(body.get("output_text"), str):
        return str(body["output_text"])
    parts = [p["text"] for item in _dicts(body.get("output")) if item.get("type") == "message"
             for p in _dicts(item.get("content")) if p.get("type") == "output_text" and isinstance(p.get("text"), str)]
    if parts:
        return "".join(parts)
    # an Anthropic Message (a --batch-api run to Anthropic keeps it as it came): its text blocks joined
    return "".join(p["text"] for p in _dicts(body.get("content"))
                   if p.get("type") == "text" and isinstance(p.get("text"), str))


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


# --- what the task expects ---------------------------------------------------------------------------------


def _expected_all(task: dict[str, Any]) -> list[str] | None:
    """The task's accepted answers as strings (a list ``expected`` is any of them); None: the task has none."""
    e = task.get("expected")
    if e is None:
        return None
    items = e if isinstance(e, list) else [e]
    out = [x if isinstance(x, str) else orjson.dumps(x).decode() for x in items if x is not None]
    return out or None


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def squad_normalize(s: str) -> str:
    """SQuAD's normalize_answer: lower case, punctuation out, articles (a, an, the) out, white space collapsed."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCT)).split())


def _norm(s: str, o: ScorerOptions) -> str:
    if o.normalize:
        return squad_normalize(s)
    if o.strip:
        s = s.strip()
    return s.casefold() if o.ignore_case else s


# --- exact_match, contains, regex --------------------------------------------------------------------------


def exact_match(task: dict[str, Any], body: Any, o: ScorerOptions) -> float | None:
    expected = _expected_all(task)
    if expected is None:
        return None
    got = _norm(response_text(body), o)
    return float(any(got == _norm(e, o) for e in expected))


def contains(task: dict[str, Any], body: Any, o: ScorerOptions) -> float | None:
    expected = _expected_all(task)
    if expected is None:
        return None
    got = _norm(response_text(body), o)
    return float(any(_norm(e, o) in got for e in expected))


def regex(task: dict[str, Any], body: Any, o: ScorerOptions) -> float | None:
    """Without ``expected``: 1 when the pattern matches. With it: the first match's first group (the whole match
    if the pattern has none) compared to ``expected`` as exact_match compares (lm-evaluation-harness's regex
    filter, group 0 of its matches)."""
    pattern = task.get("pattern") or o.pattern
    if not pattern:
        return None
    m = re.search(pattern, response_text(body), re.IGNORECASE if o.ignore_case else 0)
    expected = _expected_all(task)
    if expected is None:
        return float(m is not None)
    if m is None:
        return 0.0
    got = _norm((m.group(1) if m.groups() else m.group(0)) or "", o)
    return float(any(got == _norm(e, o) for e in expected))


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def json_valid(task: dict[str, Any], body: Any, o: ScorerOptions) -> float:
    text = response_text(body).strip()
    m = _FENCE.match(text)
    if m:
        text = m.group(1)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return 0.0
    schema = task.get("schema")
    if schema is None:
        return 1.0
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)  # a schema that is none: a scorer error, as before
    # references only inside the schema (issue 39): a task's schema never makes a worker fetch a URL or read a
    # file; one that cannot be followed is a scorer error (referencing's Unresolvable)
    return 1.0 if cls(schema, registry=_no_retrieval()).is_valid(value) else 0.0


def _no_retrieval() -> Any:
    """A ``referencing`` registry that retrieves nothing (as ``tasks.response_schema.NO_RETRIEVAL``, which
    scoring may not import)."""
    from referencing import Registry
    from referencing.exceptions import NoSuchResource

    def refuse(uri: str) -> Any:
        raise NoSuchResource(ref=uri)  # type: ignore[call-arg]  # an attrs class

    return Registry(retrieve=refuse)  # type: ignore[call-arg]


# --- choice ------------------------------------------------------------------------------------------------

LETTERS = string.ascii_uppercase
# a letter, as a word of its own: not inside a word, not in an abbreviation ("U.S."), not "I'm" or "X-ray"
_ALONE = r"(?<![\w'’\-])(?<!\w\.)([A-Za-z])(?![\w'’]|-\w|\.\w)"
_OPEN = r"[\s\(\[\{\*_\$\"'`“]*"  # what may wrap a letter before it: ( [ { ** _ $ quotes
# an explicit statement: "Answer: D", "the answer is (d)", "Final answer - **B**", "correct option is C",
# "\boxed{B}" (after simple-evals' ANSWER_PATTERN_MULTICHOICE and Inspect AI's "ANSWER: $LETTER")
_CUE = re.compile(
    r"(?:\b(?:(?:final|correct|right|best)\s+(?:answer|choice|option)|answer|(?:choice|option)(?=\s*(?:[:=]|is\b)))"
    r"(?:\s+(?:is|would\s+be|will\s+be|should\s+be|must\s+be|=))?"
    r"(?:\s*(?:[:=\-–]|is))?\s*(?:\*\*)?\s*(?:[:=]\s*)?(?:(?:option|choice|letter)\s+)?"
    r"|\\boxed\{\s*(?:\\text(?:bf)?\{)?)"
    + _OPEN + _ALONE, re.IGNORECASE)
# the whole answer is one letter, wrapped or not: "d", "(D)", "**B**", "B.", "[C]"
_ONLY = re.compile(r"^[\s\(\[\{\*_\"'`]*([A-Za-z])[\s\)\]\}\*_\"'`\.:;!]*$")
# the answer starts with an option's label: "B) Paris", "**C.** 42", "(A) the first", "d) none"
# (issue 43) or opens with its letter alone on the first line, or in bold: "B\n\nExplanation: A and C are wrong",
# "**B** because ..." (read as B, as a person reads it, not as the last letter standing alone)
_LABEL = re.compile(r"^[\s\*_]*(?:\(([A-Za-z])\)|([A-Z])[\.\):]|([a-z])\))[\*_]*(?:\s|$)"
                    r"|^\s*(?:([A-Z])[ \t]*\n|(?:\*\*|__)\(?([A-Za-z])\)?[\.\):]?(?:\*\*|__)(?:\s|$))")
_ANY = re.compile(_ALONE)
# after "I" or "A" these words still read as an option: "A is wrong", "I and J"
_OPTION_WORDS = frozenset(("is", "was", "and", "or", "seems", "would", "could", "can", "has", "fits", "looks",
                           "matches", "gives", "states", "says", "describes", "because", "since", "as", "only"))
_CLOSE_EOL = re.compile(r"[\)\]\}\*_\$\"'`”\.,;:!?]*[ \t]*(?:\n|$)")


def options_of(task: dict[str, Any]) -> str:
    """The option letters of a task: one per item of its ``choices`` (or ``options``) list, the keys of such a
    dict that are letters, else A-Z."""
    for key in ("choices", "options"):
        opts = task.get(key)
        if isinstance(opts, list) and 0 < len(opts) <= len(LETTERS):
            return LETTERS[: len(opts)]
        if isinstance(opts, dict):
            keys = "".join(sorted({k.strip().upper() for k in opts if isinstance(k, str) and len(k.strip()) == 1}))
            if keys and all(k in LETTERS for k in keys):
                return keys
    return LETTERS


def _a_word(text: str, m: re.Match[str]) -> bool:
    """Is the letter matched here the word "I" or "a"/"A" ("I think", "A good one"), not an option?"""
    letter = m.group(1)
    if letter not in "IAia":
        return False
    nxt = re.match(r"[ \t]+([a-z]+)", text[m.end(1):])
    return nxt is not None and nxt.group(1) not in _OPTION_WORDS


def _lower_ok(text: str, m: re.Match[str]) -> bool:
    """A lower-case letter counts only where it cannot be a word: wrapped ("(d)", "**d**") or ending its line
    ("Answer: d.")."""
    before = text[max(0, m.start(1) - 1):m.start(1)]
    return before in ("(", "[", "{", "*", "_", "$", '"', "'", "`") or _CLOSE_EOL.match(text, m.end(1)) is not None


def extract_choice(text: str, options: str = LETTERS) -> str | None:
    """The option letter an answer gives (upper case), or None. In order: the last explicit statement ("Answer:
    X", "the answer is (X)", "\\boxed{X}"); an answer that is only a letter ("d", "(D)", "**B**"); an answer that
    starts with an option's label ("B) Paris") or with its letter alone on a line or in bold ("B\\n\\nExplanation:
    ...", "**B** because ..."); else the last letter standing alone (upper case, not the word "I"
    or "A") that is one of ``options``. A letter that is not an option never counts."""
    found = None
    for m in _CUE.finditer(text):
        letter = m.group(1)
        if letter.upper() in options and (letter.isupper() or _lower_ok(text, m)) and not _a_word(text, m):
            found = letter.upper()
    if found:
        return found
    only = _ONLY.match(text)
    if only and only.group(1).upper() in options:
        return only.group(1).upper()
    label = _LABEL.match(text)
    if label:
        letter = next(g for g in label.groups() if g).upper()
        if letter in options:
            return letter
    for m in reversed(list(_ANY.finditer(text))):
        letter = m.group(1)
        wrapped = text[m.start(1) - 1:m.start(1)] == "(" and text[m.end(1):m.end(1) + 1] == ")"  # "(c)"
        if (letter.isupper() or wrapped) and letter.upper() in options and not _a_word(text, m):
            return letter.upper()
    return None


def _expected_letters(task: dict[str, Any], options: str) -> set[str] | None:
    expected = _expected_all(task)
    if expected is None:
        return None
    texts = task.get("choices", task.get("options"))
    out = set()
    for e in expected:
        letter = e.strip().strip("()[]*. ").upper()
        if len(letter) == 1 and letter in options:
            out.add(letter)
        elif isinstance(texts, list) and e in texts:  # the option's text: its letter
            out.add(LETTERS[texts.index(e)])
        else:
            raise ValueError(f"'expected' {e!r} is not an option letter ({options[0]}-{options[-1]}) nor the text "
                             "of one of the task's choices")
    return out


def choice(task: dict[str, Any], body: Any, o: ScorerOptions) -> float | None:
    """1 when the letter the answer gives is the expected one, case aside (always: a letter is an option
    whatever its case)."""
    options = options_of(task)
    expected = _expected_letters(task, options)
    if expected is None:
        return None
    got = extract_choice(response_text(body), options)
    return float(got is not None and got in expected)


# --- math --------------------------------------------------------------------------------------------------

# a number as answers write it: -1,234.5  $12.50  3/4  .5  50%  (a period that ends the sentence is not kept)
_NUM = (r"(?<![\w.])[-−]?\$?\s?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"
        r"(?:\s*/\s*\d+(?:\.\d+)?)?")
_NUMBER = re.compile(_NUM)
_FRAC = re.compile(r"\\[dt]?frac\{\s*([-−]?[\d.,]+)\s*\}\{\s*([-−]?[\d.,]+)\s*\}")
_MATH_CUE = re.compile(r"(?:####|\banswer\b(?:\s+is)?\s*[:=]?|\bresult\s+is\b)[^\n\d\-−$.]{0,20}", re.IGNORECASE)


def _boxed(text: str) -> str | None:
    """The contents of the last \\boxed{...} (braces inside it balanced), or None."""
    at = text.rfind("\\boxed")
    if at < 0:
        return None
    i = text.find("{", at)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


# thousands grouped by spaces as SI and many locales write them: "1 000", "1\u2009000 000", LaTeX "1\\,000",
# "1{,}000" (a group of 1-3 digits, then groups of exactly 3; a fourth digit means two numbers: "12 3456")
_SEP = r"(?:\\[,;: !]|\{,\}|[ \u00a0\u2009\u202f])"
_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:" + _SEP + r"\d{3})+(?![\d]|" + _SEP + r"\d)")
_SEP_RE = re.compile(_SEP)
# a power of ten as answers write it: "1.5 \\times 10^3", "2 \\cdot 10^{-2}", "3×10^{4}", "1.5e3"
_SCI = re.compile(r"(?<![\w.])([-−]?(?:\d+(?:\.\d+)?|\.\d+))\s*(?:\\times|\\cdot|×|·|\*|x)\s*10\s*\^\s*"
                  r"(?:\{\s*([-−]?\d{1,3})\s*\}|([-−]?\d{1,3}))"
                  r"|(?<![\w.])([-−]?(?:\d+(?:\.\d+)?|\.\d+))[eE]([-+]?\d{1,3})(?![\w.])")
# a power: "2^{10}", "2^10", "(-3)^3" (the exponent an integer of at most 3 digits)
_POW = re.compile(r"(?<![\w.^])(\d+(?:\.\d+)?|\(\s*[-−]?\d+(?:\.\d+)?\s*\))\s*\^\s*"
                  r"(?:\{\s*([-−]?\d{1,3})\s*\}|([-−]?\d{1,3}))(?![\d.])")
_MAX_DIGITS = 400  # a power past this many digits is left as written (no answer is a 10^400-digit number)


def _exact(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _power(base: Fraction, exp: int) -> Fraction | None:
    if base == 0 and exp < 0:
        return None
    if abs(exp) * max(1, len(str(abs(base.numerator))), len(str(base.denominator))) > _MAX_DIGITS:
        return None
    return base ** exp


def _sci(m: re.Match[str]) -> str:
    mant, exp = (m.group(1), m.group(2) or m.group(3)) if m.group(1) else (m.group(4), m.group(5))
    value = _power(Fraction(10), int(exp.replace("−", "-")))
    return m.group(0) if value is None else _exact(Fraction(mant.replace("−", "-")) * value)


def _pow(m: re.Match[str]) -> str:
    base = Fraction(m.group(1).strip("() ").replace("−", "-"))
    value = _power(base, int((m.group(2) or m.group(3)).replace("−", "-")))
    return m.group(0) if value is None else _exact(value)


def numbers_as_written(text: str) -> str:
    """A text with the ways of writing one number that the number reader does not follow rewritten as plain
    numbers: space-grouped thousands ("1 000" -> "1000"), powers of ten ("1.5 \\times 10^{3}", "1.5e3" ->
    "1500") and integer powers ("2^{10}" -> "1024"), exactly (a negative power of ten gives a fraction)."""
    if not any(c.isdigit() for c in text):
        return text
    text = _GROUPED.sub(lambda m: _SEP_RE.sub("", m.group(0)), text)
    text = _SCI.sub(_sci, text)
    return _POW.sub(_pow, text)


def parse_number(s: str) -> Fraction | None:
    """The value of one number as written ("1,234", "$12.50", "-3/4", "\\frac{1}{2}", "50%": 50, "1 000",
    "2^{10}", "1.5 \\times 10^3"), or None."""
    s = numbers_as_written(s.strip())
    s = s.replace("−", "-").replace("$", "").replace("\\!", "").replace("\\,", "").rstrip("%").strip()
    m = _FRAC.fullmatch(s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    s = s.replace(",", "").replace(" ", "")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            value = Fraction(num) / Fraction(den)
        else:
            value = Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def _numbers(text: str) -> list[str]:
    """The numbers of a text as written, in order (a \\frac{a}{b} as a/b)."""
    return _NUMBER.findall(_FRAC.sub(lambda m: f" {m.group(1)}/{m.group(2)} ", text))


def _last_number(text: str) -> Fraction | None:
    nums = _numbers(text)
    return parse_number(nums[-1]) if nums else None


def extract_number(text: str) -> Fraction | None:
    """The final number of an answer: in the last \\boxed{}, else after the last "####" / "answer is" /
    "Answer:", else the last number of the text (thousands separators, $ and % aside; fractions exact)."""
    text = numbers_as_written(text)
    boxed = _boxed(text)
    if boxed is not None:
        return _last_number(boxed.replace("\\text", " ").replace("\\%", "%"))
    cues = list(_MATH_CUE.finditer(text))
    if cues:  # the first number after the last cue, on its line ("The answer is 18 (after 3 steps)")
        nums = _numbers(text[cues[-1].end():].split("\n", 1)[0])
        if nums:
            return parse_number(nums[0])
    return _last_number(text)


def math_match(task: dict[str, Any], body: Any, o: ScorerOptions) -> float | None:
    """1 when the answer's final expression equals ``expected``'s: read by math-verify when it is installed
    (``evalsup[math]``: LaTeX, symbolic answers), else by the built-in reader (``builtin_math_match``)."""
    expected = _expected_all(task)
    if expected is None:
        return None
    if verify.version() is None:
        return builtin_math_match(task, body, o)
    return float(verify.matches(response_text(body), expected))


def builtin_math_match(task: dict[str, Any], body: Any, o: ScorerOptions) -> float | None:
    """The built-in reader: 1 when the answer's final number (``extract_number``) equals ``expected``'s, exactly
    as fractions (0.5 == 1/2 == 1/2.0; "1 000" == 1000; "1.5 \\times 10^{3}" == 1500; "2^{10}" == 1024)."""
    expected = _expected_all(task)
    if expected is None:
        return None
    want = []
    for e in expected:
        v = parse_number(e)
        if v is None:
            raise ValueError(f"'expected' {e!r} is not a number")
        want.append(v)
    got = extract_number(response_text(body))
    return float(got is not None and got in want)


BUILTINS: dict[str, Callable[[dict[str, Any], Any, ScorerOptions], float | None]] = {
    "exact_match": exact_match, "contains": contains, "regex": regex, "json_valid": json_valid, "choice": choice,
    "math": math_match,
}


def load_scorer(spec: str, options: ScorerOptions) -> tuple[str, ScoreFn]:
    """(name, fn(task, body)) for a built-in name or a module:function / file.py:function."""
    if spec in BUILTINS:
        fn = BUILTINS[spec]
        return spec, lambda task, body: fn(task, body, options)
    if ":" not in spec:
        raise _unknown(spec)
    from evalsup.scoring.plugin import load_callable

    user = load_callable(spec)
    return spec.rpartition(":")[2], user


def check_scorer(spec: str) -> None:
    """Refuse a scorer that cannot load before a run starts, running none of its code (a user's file is compiled,
    not executed): ValueError, one line naming it (``file:LINE`` for a syntax error)."""
    if spec in BUILTINS:
        return
    if ":" not in spec:
        raise _unknown(spec)
    from evalsup.scoring.plugin import check

    check(spec)


def _unknown(spec: str) -> ValueError:
    return ValueError(f"unknown scorer {spec!r}: use one of {', '.join(BUILTINS)}, module:function "
                      "or path/to/file.py:function")


def to_scores(name: str, value: Any) -> tuple[dict[str, float], list[str]]:
    """A scorer's return value as (named numbers, names left unscored). A dict's keys are named ``NAME.KEY``
    (nested: ``NAME.KEY.SUB``) so two scorers' keys never clash; None (at the top or as a dict's value) is
    unscored."""
    if value is None:
        return {}, [name]
    if isinstance(value, bool):
        return {name: float(value)}, []
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"score {value} is not finite")
        return {name: float(value)}, []
    if isinstance(value, dict):
        out: dict[str, float] = {}
        unscored: list[str] = []
        for k, v in value.items():
            got, none = to_scores(f"{name}.{k}", v)
            out.update(got)
            unscored.extend(none)
        return out, unscored
    raise TypeError(f"a scorer must return a number, a bool, a dict of them or None, not {type(value).__name__}")


@dataclass(slots=True)
class Scored:
    """One task's scoring: scores by name (None: the scorer failed, its reason in ``errors``), and the names
    that left it unscored (absent from ``scores``)."""

    scores: dict[str, float | None]
    errors: dict[str, str]
    unscored: list[str]
    # what a scorer keeps beside its score, by name (the judge's reply: ``score_detail`` in the record)
    detail: dict[str, Any] = field(default_factory=dict)

    def take(self, name: str, value: Any) -> None:
        """Add a scorer's return value (a bad one is that scorer's error)."""
        try:
            got, none = to_scores(name, value)
        except (TypeError, ValueError) as e:
            self.fail(name, f"{type(e).__name__}: {e}")
            return
        self.scores.update(got)
        self.unscored.extend(none)

    def fail(self, name: str, reason: str) -> None:
        self.scores[name] = None
        self.errors[name] = reason[:500]


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval for a proportion."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, centre - half), min(1.0, centre + half))


class ScoreStats:
    """Per score name: count, sum, whether every value was 0/1, errors and unscored tasks: constant memory.
    ``count`` (n) is the tasks scored; the mean and accuracy are over them only."""

    def __init__(self) -> None:
        self.n: dict[str, int] = {}
        self.total: dict[str, float] = {}
        self.binary: dict[str, bool] = {}
        self.errors: dict[str, int] = {}
        self.unscored: dict[str, int] = {}

    def add(self, scores: dict[str, float | None], unscored: Iterable[str] = ()) -> None:
        for k, v in scores.items():
            if v is None:
                self.errors[k] = self.errors.get(k, 0) + 1
                continue
            self.n[k] = self.n.get(k, 0) + 1
            self.total[k] = self.total.get(k, 0.0) + v
            self.binary[k] = self.binary.get(k, True) and v in (0.0, 1.0)
        for k in unscored:
            self.unscored[k] = self.unscored.get(k, 0) + 1

    def __bool__(self) -> bool:
        return bool(self.n or self.errors or self.unscored)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in sorted(set(self.n) | set(self.errors) | set(self.unscored)):
            n = self.n.get(k, 0)
            d: dict[str, Any] = {"count": n, "mean": round(self.total.get(k, 0.0) / n, 6) if n else None,
                                 "errors": self.errors.get(k, 0), "unscored": self.unscored.get(k, 0)}
            if n and self.binary.get(k):
                lo, hi = wilson(self.total[k], n)
                d["accuracy"] = d["mean"]
                d["ci95"] = [round(lo, 6), round(hi, 6)]
            if k == "math":  # which reading scored: math-verify's or the built-in one (issue 43)
                d["implementation"] = verify.implementation()
            out[k] = d
        return out


def score_sync(scorers: list[tuple[str, ScoreFn]], task: dict[str, Any], body: Any) -> Scored:
    """Every scorer on one task, in the calling thread (`evalsup score`, which runs in processes of its own; a
    worker runs them in a thread pool with a timeout, worker/scoring.py)."""
    out = Scored({}, {}, [])
    for name, fn in scorers:
        try:
            value = fn(task, body)
        except Exception as e:
            out.fail(name, f"{type(e).__name__}: {e}")
            continue
        out.take(name, value)
    return out
