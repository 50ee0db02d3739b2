"""Large response bodies checked without being built (worker.bodies): the same answers as a whole parse, and
only large one-line bodies taken that way. (Bodies through real runs: integration/test_bodies.py.)"""

from __future__ import annotations

import orjson
import pytest

from evalsup.worker.bodies import HAVE_SIMDJSON, LARGE, BodyParser, UsageOnly, one_line

PAD = "x" * (2 * LARGE + 100)  # still LARGE when cut in half
USAGE = {"prompt_tokens": 3, "completion_tokens": 70_000, "total_tokens": 70_003}


def _big(extra: bytes = b"") -> bytes:
    return b'{"choices":[{"message":{"content":"%s"}}]%s,"usage":%s}' % (PAD.encode(), extra, orjson.dumps(USAGE))


# (body, is JSON): each refused one must be refused by the check as by orjson, whatever simdjson thinks
BODIES = {
    "valid": (_big(), True),
    "cut in half": (_big()[: len(_big()) // 2], False),
    "trailing garbage": (_big() + b" x", False),
    "NaN": (_big(b',"n":NaN'), False),
    "invalid UTF-8": (_big(b',"s":"\xff"'), False),
    "lone surrogate": (_big(b',"s":"\\ud800"'), False),
    "control character": (_big(b',"s":"\x01"'), False),
    "byte order mark": (b"\xef\xbb\xbf" + _big(), False),  # simdjson skips it; in a JSONL line it is garbage
    "NUL after": (_big() + b"\x00", False),
    "integer past 64 bits": (_big(b',"n":123456789012345678901234567890'), True),  # simdjson refuses, orjson not
    "an array": (b'["%s"]' % PAD.encode(), True),
    "too deep": (b"[" * 2000 + b"1" + b"]" * 2000 + b" " * LARGE, False),
    # simdjson's get() takes the first "usage", orjson (and a reader of the line) the last: built whole
    "two usage keys": (_big(b',"usage":{"total_tokens":1}'), True),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_checked_body_is_json_exactly_when_orjson_says_so(name: str) -> None:
    raw, is_json = BODIES[name]
    assert len(raw) >= LARGE
    p = BodyParser(whole=False)
    if not is_json:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
        with pytest.raises(orjson.JSONDecodeError):
            p.parse(raw, one_line(raw))
        return
    got = p.parse(raw, one_line(raw))
    full = orjson.loads(raw)
    if isinstance(got, UsageOnly):  # only what evalsup reads is taken out
        assert got == ({"usage": full["usage"]} if isinstance(full, dict) else {})
    else:
        assert got == full
    assert isinstance(got, UsageOnly) == (name in ("valid", "an array")), "checked, or built when in doubt"


@pytest.mark.skipif(not HAVE_SIMDJSON, reason="pysimdjson is a dependency; without it every body is whole")
def test_only_large_one_line_bodies_are_checked_without_being_built() -> None:
    p = BodyParser(whole=False)
    got = p.parse(_big(), True)
    assert isinstance(got, UsageOnly) and got == {"usage": USAGE}
    small = b'{"choices":[],"usage":{"total_tokens":1}}'
    got = p.parse(small, True)  # small: orjson's whole parse is as cheap
    assert not isinstance(got, UsageOnly) and got == orjson.loads(small)
    pretty = orjson.dumps(orjson.loads(_big()), option=orjson.OPT_INDENT_2)
    # several lines: re-encoded into the record, so built whole
    assert not one_line(pretty)
    got = p.parse(pretty, False)
    assert not isinstance(got, UsageOnly) and got == orjson.loads(pretty)
    for _ in range(3):  # the parser is used again and again (its document's views are gone each time)
        assert p.parse(_big(), True) == {"usage": USAGE}
    held = p._parser.parse(_big())  # a view of the kept parser's document left alive: it cannot parse again
    got = p.parse(_big(), True)
    assert not isinstance(got, UsageOnly) and got == orjson.loads(_big())  # orjson answered instead
    assert isinstance(p.parse(_big(), True), UsageOnly)  # and the next body has a parser of its own
    del held
    got = BodyParser(whole=True).parse(_big(), True)
    assert not isinstance(got, UsageOnly) and got == orjson.loads(_big())


@pytest.mark.skipif(not HAVE_SIMDJSON, reason="pysimdjson is a dependency; without it every body is whole")
def test_a_checked_body_keeps_the_service_tier_it_was_billed_at() -> None:
    """What an answer was billed for (tasks.billed) is read from a checked body as from a built one: its usage
    and its service tier; two tiers (simdjson would read the first, a reader of the line the last): built whole."""
    p = BodyParser(whole=False)
    got = p.parse(_big(b',"service_tier":"flex"'), True)
    assert isinstance(got, UsageOnly) and got == {"usage": USAGE, "service_tier": "flex"}
    twice = _big(b',"service_tier":"flex","service_tier":"priority"')
    got = p.parse(twice, True)
    assert not isinstance(got, UsageOnly) and got["service_tier"] == "priority"
    # and the model it names, which prices it (a snapshot's name: rundir.usage.billed_price)
    got = p.parse(_big(b',"model":"gpt-4o-2024-08-06"'), True)
    assert isinstance(got, UsageOnly) and got == {"usage": USAGE, "model": "gpt-4o-2024-08-06"}
    got = p.parse(_big(b',"model":"a","model":"b"'), True)
    assert not isinstance(got, UsageOnly) and got["model"] == "b"
