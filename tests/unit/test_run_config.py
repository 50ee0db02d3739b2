"""Settings refused before anything is touched: a combination that cannot work is one line and exit 2, and
the run directory is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from evalsup.cli.main import main
from evalsup.config.run_config import ConfigError, build_config


def test_retry_failed_with_fresh_is_refused_by_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--retry-failed cannot go with --fresh"):
        build_config(tmp_path / "t.jsonl", {"retry_failed": "*", "fresh": True})


def test_retry_failed_with_fresh_leaves_the_run_directory_where_it_is(tmp_path: Path) -> None:
    tasks = tmp_path / "t.jsonl"
    tasks.write_text('{"id": "a", "prompt": "hi"}\n')
    run_dir = tmp_path / "t.jsonl.run"
    run_dir.mkdir()
    (run_dir / "results.jsonl").write_text("")
    got = CliRunner().invoke(main, ["run", "--retry-failed", "--fresh", str(tasks)])
    assert got.exit_code == 2
    assert "cannot go with --fresh" in got.output
    assert (run_dir / "results.jsonl").exists()  # not moved aside before the refusal
    assert [p.name for p in tmp_path.iterdir() if ".old-" in p.name] == []
