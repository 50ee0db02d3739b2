"""Deterministic mock content: answers, padding, token counts, embedding vectors.

Everything here is a pure function of (seed, request content). Random fault draws never reach this module,
so the same request always gets the same text whether it is streamed or not and whatever failed before it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# Request fields that change how an answer is delivered or faulted, not what it says.
NON_CONTENT_KEYS = frozenset({"mock", "stream", "stream_options"})

_WORD_TEXT = (
    "the a model answer question careful simple quick small large data result value token batch request "
    "response server client stream process memory network signal pattern system method number reason "
    "example evidence context detail summary review test measure estimate compare explain describe "
    "consider suggest return observe note check build run send read write find keep show follow report "
    "clear brief steady likely useful exact good new early final common key main open short long "
    "first second third often usually also then here there because while before after within across "
    "under over between about"
)
_WORDS = tuple(_WORD_TEXT.split())

_WORD_RE = re.compile(r"\S*\s*")
STREAM_PIECE_CHARS = 16384  # long texts stream in pieces of this size instead of word by word
_WORD_STREAM_LIMIT = 4096
MAX_PAD_CHARS = 256 << 20


def content_key(seed: int, kind: str, body: Mapping[str, Any]) -> bytes:
    """A digest of everything in the request that should decide the answer."""
    stripped = {k: v for k, v in body.items() if k not in NON_CONTENT_KEYS}
    try:
        data = orjson.dumps(stripped, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # e.g. integers beyond 64 bits
        data = json.dumps(stripped, sort_keys=True, separators=(",", ":")).encode()
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{seed}|{kind}|".encode())
    h.update(data)
    return h.digest()


def request_key(body: Mapping[str, Any]) -> bytes:
    """A digest of the whole request body (the "mock" object included): what makes a retry the same request."""
    try:
        data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


INVALID_JSON = '{"answer": oops, not JSON'  # mock.invalid_first's answer


def assistant_turns(body: Mapping[str, Any]) -> int:
    """Assistant turns in a request's conversation (chat ``messages``, Responses ``input``): a re-asked
    request holds one per answer that was asked again."""
    turns = body.get("messages", body.get("input"))
    if not isinstance(turns, list):
        return 0
    return sum(1 for t in turns if isinstance(t, dict) and t.get("role") == "assistant")


def natural_text(key: bytes, index: int = 0) -> str:
    """A short, deterministic, sentence-like answer: 1-3 sentences of 5-14 words (bytes of a hash pick them)."""
    h = hashlib.blake2b(key + index.to_bytes(4, "big"), digest_size=64).digest()
    words = _WORDS
    sentences = []
    pos = 1
    for _ in range(1 + h[0] % 3):
        count = 5 + h[pos] % 10
        picked = [words[b % len(words)] for b in h[pos + 1 : pos + 1 + count]]
        sentences.append(" ".join(picked).capitalize() + ".")
        pos += 1 + count
    return " ".join(sentences)


# Padding: ASCII only, no quotes, backslashes or control characters, so one character is one JSON byte and
# the bytes can be spliced into an encoded body as they are. It starts with a space (it follows the answer).
_PAD_UNIT = (" " + " ".join(_WORDS) + ".").encode("ascii")
_pad_buffer = _PAD_UNIT * 64


def pad_bytes(n: int) -> memoryview:
    """The first n bytes of the padding, without copying (one shared buffer, grown on demand)."""
    global _pad_buffer
    n = max(0, min(n, MAX_PAD_CHARS))
    if n > len(_pad_buffer):
        _pad_buffer = _PAD_UNIT * (2 * n // len(_PAD_UNIT) + 1)
    return memoryview(_pad_buffer)[:n]


def pad_marker(index: int) -> str:
    """Stands in for answer index's padding in a JSON object; `render` swaps in the padding bytes."""
    return f"\x00pad{index}\x00"


@dataclass(frozen=True)
class Answer:
    """One choice's answer: a text, then `pad` characters of padding (to reach a response size)."""

    text: str
    finish: str = "stop"
    pad: int = 0

    @property
    def length(self) -> int:
        return len(self.text) + self.pad

    @property
    def tokens(self) -> int:
        return max(1, self.length // 4)

    def full_text(self) -> str:
        return self.text + bytes(pad_bytes(self.pad)).decode("ascii") if self.pad else self.text

    def json_value(self, index: int) -> str:
        """What to put in a JSON object for this answer before `render`."""
        return self.text + pad_marker(index) if self.pad else self.text

    def pieces(self) -> list[str]:
        """Stream deltas whose concatenation is the full text (see byte_pieces for padded answers)."""
        return stream_pieces(self.full_text())

    def byte_pieces(self) -> list[memoryview]:
        """Deltas of a padded answer as byte slices, JSON-safe as they are (padding only follows our own
        ASCII answers, never mock.text), so they can be spliced into pre-encoded chunks."""
        full = memoryview(b"".join((self.text.encode("ascii"), pad_bytes(self.pad))))
        return [full[i : i + STREAM_PIECE_CHARS] for i in range(0, len(full), STREAM_PIECE_CHARS)]

    def piece_count(self) -> int:
        if self.pad:
            return -(-self.length // STREAM_PIECE_CHARS)
        return len(self.pieces())


def render_parts(obj: Any, answers: Sequence[Answer] = ()) -> list[bytes | memoryview]:
    """orjson-encode obj with each padded answer's marker replaced by its padding: the body as a list of
    buffers (the padding is a view of the shared buffer, not a copy)."""
    body = orjson.dumps(obj)
    if not any(a.pad for a in answers):
        return [body]
    view = memoryview(body)
    parts: list[bytes | memoryview] = []
    pos = 0
    for i, a in enumerate(answers):
        if a.pad:
            marker = orjson.dumps(pad_marker(i))[1:-1]
            at = body.index(marker, pos)
            parts += (view[pos:at], pad_bytes(a.pad))
            pos = at + len(marker)
    parts.append(view[pos:])
    return parts


def render(obj: Any, answers: Sequence[Answer] = ()) -> bytes:
    """render_parts joined into one bytes object."""
    parts = render_parts(obj, answers)
    return parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)


def split_at_marker(obj: Any, index: int = 0) -> tuple[bytes, bytes]:
    """orjson-encode obj, which holds pad_marker(index) once, and return the bytes before and after it."""
    body = orjson.dumps(obj)
    marker = orjson.dumps(pad_marker(index))[1:-1]
    at = body.index(marker)
    return body[:at], body[at + len(marker) :]


def approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    return text[: max(1, max_tokens) * 4]


def _part_texts(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]
            elif isinstance(part, str):
                yield part


def chat_prompt_tokens(messages: list[Any]) -> int:
    chars = 0
    for msg in messages:
        if isinstance(msg, dict):
            for text in _part_texts(msg.get("content")):
                chars += len(text)
    return max(1, chars // 4 + 3 * len(messages))


def input_items(value: Any) -> list[Any] | None:
    """Split a completions `prompt` / embeddings `input` into items (str, or list of token ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if not value:
            return None
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return [value]
        if all(isinstance(x, str) for x in value):
            return list(value)
        if all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in value):
            return list(value)
    return None


def item_tokens(item: Any) -> int:
    if isinstance(item, str):
        return approx_tokens(item)
    if isinstance(item, list):
        return max(1, len(item))
    return 1


def embedding(seed: int, model: str, item: Any, dims: int) -> list[float]:
    """A deterministic unit vector for one input item (same item, same vector, whatever the batch)."""
    h = hashlib.blake2b(digest_size=32)
    h.update(f"{seed}|{model}|{dims}|".encode())
    h.update(orjson.dumps(item))
    rng = random.Random(h.digest())
    vec = [rng.uniform(-1.0, 1.0) for _ in range(dims)]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


def embedding_base64(vec: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")


def stream_pieces(text: str) -> list[str]:
    """Split text into stream deltas whose concatenation is exactly text."""
    if len(text) <= _WORD_STREAM_LIMIT:
        return [p for p in _WORD_RE.findall(text) if p]
    return [text[i : i + STREAM_PIECE_CHARS] for i in range(0, len(text), STREAM_PIECE_CHARS)]
