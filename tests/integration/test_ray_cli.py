"""`evalsup run --ray`: what is refused in one line before Ray is even imported (the real cluster is in
tests/slow/test_ray_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsup.api.exceptions import BadSettings
from tests.harness import run_cli, write_tasks


@pytest.mark.parametrize(("args", "says"), [
    (["--shards", "4"], "--shards needs --ray: --shards N runs the shards on Ray"),
    (["--ray", "auto"], "--ray needs --shards: how many shards"),
    (["--ray", "auto", "--shards", "4", "--shard", "1/4"], "--shard cannot go with --ray"),
    (["--ray", "auto", "--shards", "2", "--scorer", "judge", "--judge-base-url",
      "http://127.0.0.1:9/v1?code=secret-1"],
     "give the judge's key with --judge-api-key-env VAR instead"),
])
def test_refused_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    r = run_cli("run", *args, str(tasks))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and says in r.stderr
    assert "secret" not in r.stderr
    assert not (tmp_path / "tasks.run").exists()


def test_retry_failed_takes_the_task_file_as_its_value_under_ray_too(tmp_path: Path) -> None:
    """`run --ray --shards N --retry-failed TASKS` (README's form): the file is TASKS, not a missing argument; the
    run gets as far as the first check of its settings (no cluster needed to see that)."""
    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    r = run_cli("run", "--ray", "--shards", "2", "--scorer", "judge", "--judge-base-url",
                "http://u:secret@127.0.0.1:9/v1", "--retry-failed", str(tasks))
    assert r.returncode == 2 and "missing TASKS" not in r.stderr
    assert "--judge-api-key-env VAR instead" in r.stderr and "secret" not in r.stderr


def test_the_task_file_must_be_a_file_every_node_sees(tmp_path: Path) -> None:
    r = run_cli("run", "--ray", "--shards", "2", "-", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1


def test_run_shards_raises_the_commands_line(tmp_path: Path) -> None:
    from evalsup.ray import run_shards

    tasks = write_tasks(tmp_path / "tasks.jsonl", 3)
    with pytest.raises(BadSettings, match="--shards"):
        run_shards(tasks, tmp_path / "o", num_shards=0, progress=False)
    with pytest.raises(TypeError, match="bogus"):
        run_shards(tasks, num_shards=2, bogus=1)
