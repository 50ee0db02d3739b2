"""Watching a run, the parts without one (issue 23): the line counter follows a growing file, the rate window,
help for every option, and the result scan's bounded tables. (Status, progress and the report of real runs:
integration/test_watch.py.)"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from evalsup.cli.main import main as cli_main
from evalsup.supervisor.progress import LineCounter, RateWindow
from evalsup.tools.report.scan import MAX_FAILED_ROWS, SLOWEST, ResultScan

# --------------------------------------------------------------------------------------- the live figures


def test_line_counter_follows_a_growing_file(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"a\n" * 10)
    c = LineCounter(p, 1)
    c.count_once()
    assert c.total == 10
    with open(p, "ab") as f:
        f.write(b"b\n" * 5 + b"partial")
    c.count_once()
    assert c.total == 16  # the unfinished last line counts once
    with open(p, "ab") as f:
        f.write(b" line\nc\n")
    c.count_once()
    assert c.total == 17
    p.write_bytes(b"x\n" * 3)  # replaced by a shorter file: counted again
    c.count_once()
    assert c.total == 3
    s = LineCounter(tmp_path / "t.jsonl", 2)
    s.count_once()
    assert s.total == 2  # 3 lines in 2 shards: the larger share


def test_rate_window_has_a_rate_from_the_first_sample_and_slides() -> None:
    w = RateWindow(100.0, window_s=10.0)
    assert w.rate(101.0, 50) == pytest.approx(50.0)  # one second in: 50 a second, not 0
    for t in range(2, 30):
        w.rate(100.0 + t, 50 * t)
    assert w.rate(130.0, 1500 + 1000) == pytest.approx((2500 - 50 * 20) / 10, rel=0.11)  # the last ~10 s only


# --------------------------------------------------------------------------------------- status


# --------------------------------------------------------------------------------------- the CLI


def test_every_option_of_every_command_has_help() -> None:
    for name, cmd in cli_main.commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert p.help, f"evalsup {name} {p.opts[0]} has no help"


# --------------------------------------------------------------------------------------- the report


def test_result_scan_keeps_bounded_tables_and_exact_counts() -> None:
    s = ResultScan()
    n = 20_000
    for i in range(n):
        failed = i % 7 == 0
        s.add({"custom_id": f"t{i}", "error": {"code": "http_500", "message": "x" * 1000} if failed else None,
               "response": None if failed else {"status_code": 200, "body": {
                   "choices": [{"finish_reason": "length" if i % 3 == 0 else "stop"}],
                   "usage": {"completion_tokens": 1 + i % 500}}},
               "metrics": {"latency_s": 0.001 * (i % 997) + (5.0 if i in (1234, 777) else 0), "attempts": 1}})
    assert s.failed == len(range(0, n, 7)) and len(s.failed_rows) == MAX_FAILED_ROWS
    assert all(len(r["message"]) <= 240 for r in s.failed_rows)
    ok = [i for i in range(n) if i % 7]
    assert s.finish == {"length": sum(i % 3 == 0 for i in ok), "stop": sum(i % 3 != 0 for i in ok)}
    slow = s.slowest()
    assert len(slow) == SLOWEST and {slow[0]["id"], slow[1]["id"]} == {"t1234", "t777"}
    assert s.lat_ok.n + s.lat_failed.n == n and sum(s.out_tokens.counts) + s.out_tokens.zero == len(ok)
