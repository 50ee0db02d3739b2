"""The one line a run says at its start (issue 44 item 4): endpoint, model, tasks, workers x limit and the cost
when priced, in at most ~120 characters; the rest with -v."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from evalsup.config.prices import load_prices
from evalsup.config.run_config import build_config
from evalsup.supervisor.first_line import MAX_WIDTH, first_line
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import Tally, figures

URL = "http://127.0.0.1:9/v1"


def _estimate(n: int, model: str, max_tokens: int, self_hosted: bool = False) -> dict[str, Any]:
    table = load_prices(None, self_hosted, maintained=False)
    tally = Tally()
    for i in range(n):
        f = figures({"id": f"t{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]},
                    RequestDefaults(model=model, max_tokens=max_tokens))
        tally.add(f, None)
    return tally.summary(table.lookup)


def _said(line: str) -> str:
    out = f"evalsup: {line}"
    assert len(out) <= MAX_WIDTH and "\n" not in out, out
    return out


def test_the_demo_says_one_short_line(tmp_path: Path) -> None:
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [URL], "workers": 4, "concurrency": 64,
                                              "model": "mock-model", "self_hosted": True, "max_tokens": 512})
    line = _said(first_line(cfg, _estimate(2000, "mock-model", 512, self_hosted=True)))
    assert line == f"evalsup: {URL}: mock-model, 2,000 tasks, 4 workers x 16, no cost"


def test_a_priced_run_says_its_expected_cost_and_its_most(tmp_path: Path) -> None:
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [URL], "model": "gpt-4o-mini", "max_tokens": 1000})
    line = _said(first_line(cfg, _estimate(100_000, "gpt-4o-mini", 1000)))
    m = re.fullmatch(rf"evalsup: {re.escape(URL)}: gpt-4o-mini, 100,000 tasks, 1-\d+ workers, adaptive ≤256, "
                     r"≈ \$([\d.,]+) \(max \$([\d.,]+)\)", line)
    assert m, line
    expected, most = (float(g.replace(",", "")) for g in m.groups())
    assert 0 < expected < most  # half of max_tokens expected, all of it at most


def test_an_unpriced_model_says_so_and_many_endpoints_are_counted(tmp_path: Path) -> None:
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [URL, "http://127.0.0.1:10/v1"], "workers": 2,
                                              "concurrency": 8, "model": "my-own-model"})
    line = _said(first_line(cfg, _estimate(10, "my-own-model", 100), resumed=True))
    assert line == f"evalsup: {URL} (+1): my-own-model, 10 unread, 2 workers x 4, cost unknown (no price)"


def test_a_long_endpoint_gives_way_to_the_figures(tmp_path: Path) -> None:
    url = "https://a-very-long-gateway-name.inference.example.com/openai/deployments/some-deployment/v1"
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [url], "workers": 4, "concurrency": 64,
                                              "model": "mock-model", "self_hosted": True})
    line = _said(first_line(cfg, _estimate(2000, "mock-model", 512, self_hosted=True)))
    assert line.startswith("evalsup: https://a-very-long-gateway-name.inference.example.com/…: mock-model, 2,000 tasks")
