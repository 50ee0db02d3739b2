"""A response body checked to be JSON, and read no further than evalsup needs.

Every 200 body is checked before its bytes go into an output line: a proxy's HTML page or a cut body must not
break results.jsonl. orjson checks by building the whole object, a 1 MB answer's text included (~370 us a
megabyte here). When nothing will look at more than the body's ``usage`` (no scorer, no worker plugin) and the
body is large and one line (so it is written as the endpoint's own bytes), simdjson checks it without building
it (~140 us a megabyte) and only ``usage`` is taken out. orjson stays the one that says what is not JSON: any
body simdjson refuses, or has a doubt about, is handed to orjson, which decides.
"""

from __future__ import annotations

from typing import Any

import orjson

try:
    import simdjson

    HAVE_SIMDJSON = True
except ImportError:  # a dependency; without it every body is parsed whole
    HAVE_SIMDJSON = False

#: Bodies at least this large (and at most LARGEST) are only checked when nothing needs them whole. Below it
#: orjson's whole parse costs a few microseconds, no more than simdjson's call.
LARGE = 1 << 16
#: Past this, orjson: simdjson's buffers for a body (its text and a tape of 8 bytes per value, so up to
#: several times the body's size) are not kept around for rare giants.
LARGEST = 16 << 20
#: A parser, and the buffers it grew to, is kept for bodies up to this size; a larger one gets its own.
KEEP = 2 << 20
_BOM = b"\xef\xbb\xbf"  # simdjson skips it; orjson (and a JSON reader of the output) does not


def one_line(raw: bytes) -> bool:
    """Whether the body can go into a JSONL line as it is (~9 us a megabyte for each of the two searches)."""
    return b"\n" not in raw and b"\r" not in raw


class UsageOnly(dict[str, Any]):
    """What was taken out of a body that was checked, not built: its ``usage``, ``service_tier`` and ``model``
    (what it was billed for: ``tasks.billed``, and the model it is priced by), if it has them, and whether it has
    the key an answer must have (``has_answer``)."""

    has_answer = True


_NO = object()  # _usage's answer when simdjson cannot tell: orjson decides


class BodyParser:
    """``parse(raw, single)``: the body parsed by orjson, or, for a large one-line body when ``whole`` is
    False, a UsageOnly. Raises orjson.JSONDecodeError when the body is not JSON, whichever way it was
    checked."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole or not HAVE_SIMDJSON
        self._parser: Any = None

    def parse(self, raw: bytes, single: bool, need: str | None = None) -> Any:
        """``single``: ``one_line(raw)``, which the caller needs too; ``need``: a top-level key whose presence
        a UsageOnly reports (``has_answer``)."""
        if self.whole or not single or not LARGE <= len(raw) <= LARGEST or raw.startswith(_BOM):
            return orjson.loads(raw)
        usage, has, tier, model = self._usage(raw, need)
        if usage is _NO:
            # outside the failed check, whose buffers (as large as the body, or larger) are gone by now
            return orjson.loads(raw)
        out = UsageOnly() if usage is None else UsageOnly(usage=usage)
        if tier is not None:
            out["service_tier"] = tier
        if model is not None:
            out["model"] = model
        if not has:
            out.has_answer = False
        return out

    def _usage(self, raw: bytes, need: str | None = None) -> tuple[Any, bool, str | None, str | None]:
        """The body's usage (None without one), or _NO: refused, a big integer, a parser still in use, or a
        body with two "usage" keys (simdjson would take the first, a reader of the line the last); whether
        the top-level object has the key ``need``; its ``service_tier`` and its ``model`` when each is a string
        (and its only one)."""
        if len(raw) > KEEP:
            parser = simdjson.Parser()  # dropped with its buffers once this body is checked
        else:
            if self._parser is None:
                self._parser = simdjson.Parser()
            parser = self._parser
        try:
            doc = parser.parse(raw)
            if not isinstance(doc, simdjson.Object):
                return None, need is None, None, None
            keys = list(doc)  # the keys only: no value is built
            if any(sum(k == one for k in keys) > 1 for one in ("usage", "service_tier", "model")):
                return _NO, True, None, None
            has = need is None or need in keys
            tier = doc.get("service_tier")
            tier = tier if isinstance(tier, str) else None
            model = doc.get("model")
            model = model if isinstance(model, str) else None
            usage = doc.get("usage")
            if isinstance(usage, simdjson.Object):
                return usage.as_dict(), has, tier, model
            if isinstance(usage, simdjson.Array):
                return usage.as_list(), has, tier, model
            # views into the parser's document go with this frame: the next parse can reuse it
            return usage, has, tier, model
        except Exception:
            if parser is self._parser:
                self._parser = None  # a fresh one next time, should this one be stuck (views of it kept)
            return _NO, True, None, None
