"""RUN_DIR/concurrency read by the supervisor's ceiling room: set, clamped, ignored when bad, back when removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalsup.supervisor.ceiling import Ceiling, parse


def put(path: Path, text: str) -> None:
    """Written as serve writes it: a temporary file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.mark.parametrize(("text", "want"), [("4", 4), (" 12\n", 12), ("0", 1), ("-3", 1), ("999", 64),
                                            ("64", 64), ("+5", 5)])
def test_parse_clamps_an_integer_into_range(text: str, want: int) -> None:
    assert parse(text, 64) == want


@pytest.mark.parametrize("text", ["", "\n", "four", "4.5", "4 5", "1e3", "99999999999999999999999"])
def test_parse_refuses_what_is_not_one_integer(text: str) -> None:
    assert parse(text, 64) is None


def test_no_file_is_the_runs_concurrency(tmp_path: Path) -> None:
    c = Ceiling(tmp_path / "concurrency", 64)
    assert c.poll() is None
    assert (c.value, c.shown) == (64, None)


def test_a_written_value_is_applied_and_said_once(tmp_path: Path) -> None:
    path = tmp_path / "concurrency"
    c = Ceiling(path, 64)
    put(path, "16\n")
    assert c.poll() == f"concurrency ceiling 16 ({path})"
    assert (c.value, c.shown) == (16, 16)
    assert c.poll() is None  # unchanged file: not read again, nothing said
    put(path, "16")  # rewritten with the same value: nothing to say
    assert c.poll() is None and c.value == 16
    put(path, "4")
    assert c.poll() == f"concurrency ceiling 4 ({path})" and c.value == 4


def test_a_value_above_the_runs_concurrency_is_clamped(tmp_path: Path) -> None:
    path = tmp_path / "concurrency"
    c = Ceiling(path, 64)
    put(path, "1000")
    assert c.poll() is None  # clamped to 64: the ceiling it already had
    assert c.value == 64
    put(path, "0")
    note = c.poll()
    assert note is not None and "clamped into 1..64" in note and c.value == 1


def test_a_bad_value_is_said_once_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "concurrency"
    c = Ceiling(path, 64)
    put(path, "8")
    c.poll()
    put(path, "lots")
    note = c.poll()
    assert note is not None and "'lots', not an integer; ignored (the ceiling stays 8)" in note
    assert c.value == 8
    assert c.poll() is None  # said once while the file stays so
    put(path, "x" * 500)  # not one integer either, however long
    assert c.poll() is not None and c.value == 8


def test_a_removed_file_sets_the_runs_concurrency_back(tmp_path: Path) -> None:
    path = tmp_path / "concurrency"
    c = Ceiling(path, 64)
    put(path, "3")
    c.poll()
    path.unlink()
    note = c.poll()
    assert note is not None and "removed" in note
    assert (c.value, c.shown) == (64, None)
    assert c.poll() is None


def test_an_unreadable_file_is_said_once(tmp_path: Path) -> None:
    path = tmp_path / "concurrency"
    path.mkdir()  # a directory where the file should be: stat works, the read fails
    c = Ceiling(path, 64)
    note = c.poll()
    assert note is not None and "cannot read" in note and c.value == 64
    assert c.poll() is None
