"""--api-keys FILE: who a request is. One key a line, or its SHA-256 (64 hex digits), so the file need not hold
the keys themselves; blank lines and # comments skipped. A key's owner is its SHA-256: what the store records,
never the key."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

HEX64 = re.compile(r"^[0-9a-f]{64}$")


class KeysError(ValueError):
    pass


def owner_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: Path) -> frozenset[str]:
    """The owners (SHA-256 of each key) that the file allows."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise KeysError(f"--api-keys {path}: {e.strerror if isinstance(e, OSError) else 'not text'}") from None
    owners = set()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        owners.add(line.lower() if HEX64.match(line.lower()) else owner_of(line))
    if not owners:
        raise KeysError(f"--api-keys {path}: no key in the file")
    return frozenset(owners)


def bearer(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header."""
    if not header:
        return None
    scheme, _, key = header.partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None
