"""Shard counts from the environment (issue 19): --shard auto follows the scheduler, refuses what it cannot
know, and a mismatch says which. (Runs, the lock and exit codes: integration/test_sched.py.)"""

from __future__ import annotations

import pytest

from evalsup.config.shards import ShardError, parse_shard, shard_from_env, shard_mismatch

# ------------------------------------------------------------------------------------------------ the lock


# ------------------------------------------------------------------------------------------- exit codes


# ------------------------------------------------------------------------------------------------ shards


@pytest.mark.parametrize(("env", "expect"), [
    ({"JOB_COMPLETION_INDEX": "2", "EVALSUP_SHARDS": "16"}, (2, 16)),
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3",
      "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),  # sbatch --array=0-3
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "1",
      "SLURM_ARRAY_TASK_COUNT": "1", "EVALSUP_SHARDS": "4"}, (1, 4)),  # sbatch --array=1 redoes shard 1 of 4
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "7",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "4", "EVALSUP_SHARDS": "8"}, (3, 8)),
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_MAX": "3"}, (0, 4)),  # no MIN/STEP/COUNT: 0..MAX
    ({"AWS_BATCH_JOB_ARRAY_INDEX": "7", "AWS_BATCH_JOB_ARRAY_SIZE": "8"}, (7, 8)),
    ({"AWS_BATCH_JOB_ARRAY_INDEX": "7", "AWS_BATCH_JOB_ARRAY_SIZE": "8", "EVALSUP_SHARDS": "10"}, (7, 10)),
])
def test_shard_auto_follows_the_user(env: dict[str, str], expect: tuple[int, int]) -> None:
    assert shard_from_env(env) == expect
    assert parse_shard("auto", env) == expect


@pytest.mark.parametrize(("env", "says"), [
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "1",
      "SLURM_ARRAY_TASK_COUNT": "1"}, "not 0..N-1"),  # sbatch --array=1 without EVALSUP_SHARDS
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4",
      "SLURM_ARRAY_TASK_STEP": "1", "SLURM_ARRAY_TASK_COUNT": "4"}, "not 0..N-1"),  # --array=1-4: no shard 0
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, "step 2"),  # --array=0-6:2
    ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3",
      "SLURM_ARRAY_TASK_COUNT": "3"}, "3 task(s)"),  # --array=0,2,3: a gap
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MAX": "4", "EVALSUP_SHARDS": "4"}, "0 <= K < N"),
    ({"SLURM_ARRAY_TASK_ID": "0"}, "EVALSUP_SHARDS"),
    ({"JOB_COMPLETION_INDEX": "1"}, "EVALSUP_SHARDS"),
    ({"JOB_COMPLETION_INDEX": "1", "EVALSUP_SHARDS": "four"}, "EVALSUP_SHARDS='four'"),
    ({"EVALSUP_SHARDS": "4"}, "no array-job index"),
    ({}, "JOB_COMPLETION_INDEX"),
])
def test_shard_auto_refuses_what_it_cannot_know(env: dict[str, str], says: str) -> None:
    with pytest.raises(ShardError, match=f".*{says.replace('(', '.').replace(')', '.')}"):
        shard_from_env(env)


def test_shard_mismatch_says_which() -> None:
    assert shard_mismatch({"size": 1, "shard": [1, 4]}, (1, 4), "d") is None
    assert shard_mismatch({"size": 1}, None, "d") is None
    msg = shard_mismatch({"size": 1, "shard": [1, 4]}, (1, 2), "d")
    assert msg is not None and "shard 1 of 4" in msg and "shard 1 of 2" in msg
    msg = shard_mismatch({"size": 1}, (0, 2), "d")
    assert msg is not None and "without --shard" in msg


# ------------------------------------------------------------------------------------------------- merge
