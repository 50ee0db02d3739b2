"""The cache's figures for a person (issue 30): the money its hits saved, and one line of the summary's
``cache`` object, as the final table, the HTML report and `evalsup status` say them."""

from __future__ import annotations

from typing import Any


def saved_text(c: dict[str, Any]) -> str:
    """The money the hits saved: "$1.20 saved", with the models that have no price named (never $0 silently);
    "" when no price table was asked (summary.json without ``saved_usd``)."""
    usd, unpriced = c.get("saved_usd"), c.get("saved_usd_no_price") or []
    if usd is None:
        return f"money saved unknown (no price for {', '.join(unpriced)})" if unpriced else ""
    more = f" (plus the unknown price of {', '.join(unpriced)}: no price)" if unpriced else ""
    return (f"${usd:,.2f}" if usd >= 0.1 or usd == 0 else f"${usd:,.4f}") + f" saved{more}"


def cache_text(c: dict[str, Any]) -> str:
    """summary.json's ``cache`` in one line: hits, requests sent, answers kept, tokens and money saved."""
    t = c.get("tokens_saved") or {}
    usd = saved_text(c)
    bad = int(c.get("unusable") or 0)
    return (f"{int(c.get('hits') or 0):,} answered from it, {int(c.get('misses') or 0):,} sent"
            + (f" ({bad:,} of them had an unusable entry)" if bad else "") + "; "
            f"{int(c.get('written') or 0):,} answers kept; {int(t.get('prompt') or 0):,} prompt + "
            f"{int(t.get('completion') or 0):,} completion tokens saved" + (f"; {usd}" if usd else "")
            + (f" (not written: {c['error']})" if c.get("error") else ""))
