"""evalsup.tools.merge.merged_summary: a sharded (or Ray) run's merged summary sums the shards' scores, groups,
spend, judge usage, structured-output and cache figures, the means and intervals computed again."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from evalsup.scoring.groups import GroupedScores
from evalsup.scoring.scorers import ScoreStats
from evalsup.tools.merge import MergeReport, merged_summary


def test_the_shards_figures_are_summed_as_one_run_would_count_them(tmp_path: Path) -> None:
    rng = random.Random(5)
    whole, whole_groups = ScoreStats(), GroupedScores("metadata.subject")
    dirs = []
    for k in range(3):
        part, part_groups = ScoreStats(), GroupedScores("metadata.subject")
        for _ in range(rng.randint(20, 60)):
            scores: dict[str, float | None] = {"choice": float(rng.random() < 0.6), "f1": round(rng.random(), 3),
                                               "judge": None if rng.random() < 0.1 else 1.0}
            unscored = ["regex"] if rng.random() < 0.2 else []
            group, ok = rng.choice("abc"), rng.random() < 0.9
            for st, gs in ((part, part_groups), (whole, whole_groups)):
                st.add(scores, unscored)
                gs.add(group, ok, scores, unscored)
        d = tmp_path / f"shard-{k}-of-3"
        d.mkdir()
        (d / "summary.json").write_bytes(orjson.dumps({
            "total": 1, "scores": part.summary(), "groups": part_groups.summary(),
            "budget": {"caps": {"cost": 1.5, "completion_tokens": None, "total_tokens": None},
                       "spent": {"prompt_tokens": 10, "completion_tokens": 20, "cost_usd": 0.25},
                       "reserved": {"requests": 3}, "unpriced_results": 0},
            "judge_usage": {"prompt": 100, "completion": 5, "requests": 4},
            "structured": {"reasks": 2, "schema_invalid": 1},
            "cache": {"hits": 3, "misses": 7, "written": 7, "pruned": 0,
                      "tokens_saved": {"prompt": 30, "completion": 9},
                      "tokens_saved_by_model": {"m": {"prompt": 30, "completion": 9}}, "saved_usd": 0.5}}))
        dirs.append(d)
    got = merged_summary(MergeReport(records=3), dirs)
    want = whole.summary()
    assert got["scores"].keys() == want.keys()
    for name, w in want.items():
        for key, v in w.items():
            assert got["scores"][name][key] == pytest.approx(v, abs=2e-6), (name, key)
    assert got["groups"]["by"] == "metadata.subject"
    for g, w in whole_groups.summary()["groups"].items():
        mine = got["groups"]["groups"][g]
        assert (mine["tasks"], mine["failed"]) == (w["tasks"], w["failed"])
        assert mine["scores"]["choice"]["ci95"] == pytest.approx(w["scores"]["choice"]["ci95"], abs=2e-6)
    assert got["budget"] == {"caps": {"cost": 4.5, "completion_tokens": None, "total_tokens": None},
                             "spent": {"prompt_tokens": 30, "completion_tokens": 60, "cost_usd": 0.75},
                             "unpriced_results": 0}
    assert got["judge_usage"] == {"prompt": 300, "completion": 15, "requests": 12}
    assert got["structured"] == {"reasks": 6, "schema_invalid": 3}
    assert got["cache"]["hits"] == 9
    assert got["cache"]["tokens_saved_by_model"] == {"m": {"prompt": 90, "completion": 27}}
    assert got["cache"]["saved_usd"] == pytest.approx(1.5)
    assert "scores_this_session_only" not in got and len(got["shards"]) == 3


def test_a_run_without_scores_has_none_and_a_missing_summary_is_skipped(tmp_path: Path) -> None:
    got = merged_summary(MergeReport(records=0), [tmp_path / "nowhere"])
    assert "scores" not in got and "groups" not in got and got["shards"] == [{"run_dir": str(tmp_path / "nowhere"),
                                                                             "total": None}]


def test_the_merged_summary_says_which_source_priced_each_model() -> None:
    from evalsup.tools.summaries import combined

    gp, table = "genai-prices 0.2.3 (latest price change 2026-12-01)", "evalsup table 2025-06-15"
    out = combined([{"prices": {"sources": [gp, table], "by_model": {"gpt-4o": gp}}},
                    {"prices": {"sources": [gp, table], "by_model": {"my-model": "no price"}}}, {}])
    assert out["prices"] == {"sources": [gp, table], "by_model": {"gpt-4o": gp, "my-model": "no price"}}
    assert "prices" not in combined([{}, {}])
