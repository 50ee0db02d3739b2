"""The input's content fingerprint: what makes a rerun the same run (the same content; a file that only grew is
the same run, extended)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_FAST_KEYS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def fingerprint(path: Path, known: dict[str, Any] | None = None) -> dict[str, Any]:
    """The input's identity: its size and the SHA-256 of its content. ``known`` is the fingerprint recorded
    by the run being resumed: when size, mtime, ctime, inode and device all match it, the file was not
    written since and the hash is not recomputed (the only use of the times: a ``touch`` or a copy is
    hashed, and is the same input when its bytes are). When the file is longer than ``known`` says, the
    hash of its first ``known["size"]`` bytes is taken in the same pass (``prefix``), so a file that only
    grew by appending is recognised without reading it twice (see same_input)."""
    import hashlib

    st = os.stat(path)
    fast = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}
    if known is not None and "sha256" in known and all(known.get(k) == fast[k] for k in _FAST_KEYS):
        return {k: v for k, v in known.items() if k != "prefix"}
    cut = known.get("size") if known is not None else None
    cut = cut if isinstance(cut, int) and 0 < cut < st.st_size else None
    h = hashlib.sha256()
    prefix: dict[str, Any] | None = None
    done = 0
    with open(path, "rb") as f:
        if cut is not None:  # the old length first, to know the hash of what was there before
            while done < cut and (chunk := f.read(min(1 << 20, cut - done))):
                h.update(chunk)
                done += len(chunk)
            if done == cut:
                prefix = {"size": cut, "sha256": h.copy().hexdigest()}
        while chunk := f.read(1 << 20):
            h.update(chunk)
            done += len(chunk)
    fp: dict[str, Any] = {**fast, "size": done, "sha256": h.hexdigest()}
    if prefix is not None and done > cut:  # type: ignore[operator]
        fp["prefix"] = prefix
    return fp


def _legacy_fingerprint(path: Path) -> dict[str, Any]:
    """The fingerprint of evalsup before content hashing (size, mtime, the first and last MiB)."""
    import hashlib

    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if st.st_size > 1 << 20:
            f.seek(max(1 << 20, st.st_size - (1 << 20)))
            h.update(f.read(1 << 20))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256_ends": h.hexdigest()}


def same_input(old: dict[str, Any], new: dict[str, Any], path: Path | None = None) -> str:
    """"same" (the same bytes), "grown" (the old bytes with lines appended) or "changed"."""
    if old.get("shard") != new.get("shard"):
        return "changed"
    if old.get("sha256") is None:  # a run directory of an older evalsup: its own, stricter test
        legacy = {k: v for k, v in old.items() if k != "shard"}
        return "same" if path is not None and _legacy_fingerprint(path) == legacy else "changed"
    if old.get("size") == new.get("size") and old.get("sha256") == new.get("sha256"):
        return "same"
    if new.get("prefix") == {"size": old.get("size"), "sha256": old.get("sha256")}:
        return "grown"
    return "changed"


def grew_at_line_end(path: Path, old_size: int) -> bool:
    """A grown file whose old part ended a line (or whose new part starts one): the old last line is intact."""
    if old_size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(old_size - 1)
        two = f.read(2)
    return two[:1] == b"\n" or two[1:2] in (b"\n", b"\r")
