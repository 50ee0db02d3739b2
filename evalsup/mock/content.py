"""Deterministic mock content: answers, padding, token counts, embedding vectors.

Everything here is a pure function of (seed, request content). Random fault draws never reach this module,
so the same request always gets the same text whether it is streamed or not and whatever failed before it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import random
import re
import struct
from collections.abc import Iterable, Mapping
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

# ASCII only, no quotes, backslashes or control characters: one character is one JSON byte.
_FILLER_UNIT = " ".join(_WORDS) + ". "
_WORD_RE = re.compile(r"\S*\s*")
_STREAM_PIECE_CHARS = 16384  # long texts stream in pieces of this size instead of word by word
_WORD_STREAM_LIMIT = 4096


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


def natural_text(key: bytes, index: int = 0) -> str:
    """A short, deterministic, sentence-like answer (roughly 10-40 words)."""
    rng = random.Random(key + index.to_bytes(4, "big"))
    sentences = []
    for _ in range(rng.randint(1, 3)):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 14))]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


@functools.lru_cache(maxsize=64)
def filler(n: int) -> str:
    """n characters of JSON-safe ASCII padding; cached per size so big responses cost little CPU."""
    if n <= 0:
        return ""
    reps = n // len(_FILLER_UNIT) + 1
    return (_FILLER_UNIT * reps)[:n]


def pad_text(text: str, total_chars: int) -> str:
    """text followed by padding, total_chars long (or text unchanged if it is already that long)."""
    missing = total_chars - len(text)
    if missing <= 1:
        return text
    return text + " " + filler(missing - 1)


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
    return [text[i : i + _STREAM_PIECE_CHARS] for i in range(0, len(text), _STREAM_PIECE_CHARS)]
