"""The input fingerprint (evalsup.tasks.fingerprint / same_input): content, not times; growth told apart from
an edit by the hash of the old length, taken in the same pass. Pure functions on real files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from evalsup.tasks.fingerprint import fingerprint, grew_at_line_end, same_input


def _file(p: Path, data: bytes) -> Path:
    p.write_bytes(data)
    return p


def test_times_and_copies_do_not_count_content_does(tmp_path: Path) -> None:
    data = b"".join(b'{"id": "t%d", "prompt": "q"}\n' % i for i in range(5000))
    a = _file(tmp_path / "a.jsonl", data)
    old = fingerprint(a)
    assert old["size"] == len(data) and len(old["sha256"]) == 64
    os.utime(a, ns=(1, 1))
    assert same_input(old, fingerprint(a, old)) == "same"
    b = tmp_path / "b.jsonl"
    shutil.copyfile(a, b)
    assert same_input(old, fingerprint(b, old)) == "same"
    st = a.stat()
    _file(a, data.replace(b'"t7"', b'"x7"'))  # same size
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: the ctime tells
    assert same_input(old, fingerprint(a, old)) == "changed"


def test_growth_is_recognised_in_one_pass_and_an_edit_plus_growth_is_not(tmp_path: Path) -> None:
    data = b'{"id": "a", "prompt": "q"}\n' * 3  # (duplicates do not matter to a fingerprint)
    a = _file(tmp_path / "a.jsonl", data)
    old = fingerprint(a)
    with open(a, "ab") as f:
        f.write(b'{"id": "b", "prompt": "q"}\n')
    new = fingerprint(a, old)
    assert new["prefix"] == {"size": old["size"], "sha256": old["sha256"]}
    assert same_input(old, new) == "grown" and grew_at_line_end(a, old["size"])
    assert same_input(new, fingerprint(a, new)) == "same"  # the fast path: nothing written since
    _file(a, b"X" + a.read_bytes()[1:])
    assert same_input(old, fingerprint(a, old)) == "changed"
    assert same_input({**old, "shard": [0, 2]}, fingerprint(_file(a, data), old)) == "changed"


def test_a_last_line_without_newline_that_goes_on_is_not_growth(tmp_path: Path) -> None:
    a = _file(tmp_path / "a.jsonl", b'{"id": "a", "prompt": "q"}')
    old = fingerprint(a)
    with open(a, "ab") as f:
        f.write(b' \n{"id": "b", "prompt": "q"}\n')
    assert same_input(old, fingerprint(a, old)) == "grown"  # the bytes agree...
    assert not grew_at_line_end(a, old["size"])  # ...but the old last line went on: journal refuses it
    _file(a, b'{"id": "a", "prompt": "q"}\n{"id": "b", "prompt": "q"}\n')
    assert grew_at_line_end(a, old["size"])  # a newline first: the old last line is intact
