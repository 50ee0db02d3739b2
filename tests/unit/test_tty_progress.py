"""The offline commands' progress line (`cache import`, `merge`; issue 44 item 7): on a terminal a line that
updates in place and ends with a newline; off a terminal nothing, so a script reads only the final line."""

from __future__ import annotations

import io

from evalsup.common.tty_progress import TtyProgress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_count_updates_in_place_then_ends_its_line() -> None:
    t = [0.0]
    out = Terminal()
    p = TtyProgress("lines read", out, clock=lambda: t[0])
    for _ in range(1000):
        t[0] += 0.002  # 1,000 lines in 2 s: a line every half second
        p.tick()
    p.close()
    text = out.getvalue()
    shown = [x.strip() for x in text.split("\r") if x.strip()]
    assert shown[-1] == "1,000 lines read (500/s)", shown
    assert len(shown) == 4 and text.endswith("\n")


def test_off_a_terminal_nothing_is_written() -> None:
    out = io.StringIO()
    p = TtyProgress("records merged", out, clock=iter(range(10_000)).__next__)
    for _ in range(5000):
        p.tick()
    p.close()
    assert out.getvalue() == "" and p.done == 5000
