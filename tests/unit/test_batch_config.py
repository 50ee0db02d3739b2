"""--batch-api's settings (issue 31): one batch driver in the workers' place, its window two chunks, its
settings in the worker config, bad polling refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsup.config.run_config import ConfigError, build_config

URL = "http://127.0.0.1:9/v1"


def test_batch_api_runs_one_driver_with_two_chunks_of_window(tmp_path: Path) -> None:
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": [URL], "batch_api": True, "batch_max_requests": 300,
                                              "workers": 4, "max_tasks_per_worker": 10})
    assert cfg.workers == 1 and not cfg.autoscale and cfg.window == 600 and cfg.max_tasks_per_worker is None
    b = cfg.worker.batch
    assert b is not None and b["max_requests"] == 300 and b["run_dir"] == str(tmp_path / "t.run")
    assert b["fallback"] == "batch" and b["max_bytes"] == 200 * 1024 * 1024 and not b["cancel"]
    assert build_config(tmp_path / "t.jsonl", {"base_url": [URL]}).worker.batch is None


def test_bad_polling_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--batch-poll-interval"):
        build_config(tmp_path / "t.jsonl", {"base_url": [URL], "batch_api": True, "batch_poll_interval": 0.0})
    with pytest.raises(ConfigError, match="--batch-poll-max"):
        build_config(tmp_path / "t.jsonl", {"base_url": [URL], "batch_api": True, "batch_poll_interval": 9.0,
                                            "batch_poll_max": 1.0})



@pytest.mark.parametrize(("given", "says"), [({"hedge": True}, "--hedge"),
                                             ({"scorers": ["judge"], "judge_base_url": URL, "judge_model": "j"},
                                              "--scorer judge"),
                                             ({"cache": "CACHE"}, "--cache")])
def test_what_acts_on_each_answer_as_it_comes_is_refused_with_batch_api(tmp_path: Path, given: dict[str, object],
                                                                        says: str) -> None:
    given = {k: str(tmp_path / "c") if v == "CACHE" else v for k, v in given.items()}
    with pytest.raises(ConfigError, match=f"{says} cannot go with --batch-api: it works on requests sent one by one"):
        build_config(tmp_path / "t.jsonl", {"base_url": [URL], "batch_api": True, **given})
