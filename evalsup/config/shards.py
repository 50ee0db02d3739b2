"""Which shard a run is: ``--shard K/N`` or ``auto`` from a scheduler's array-job variables, as a pure function of
the environment (no I/O), and the check that a run directory belongs to the same shard count.

The shard count follows the user, not the submission: ``EVALSUP_SHARDS`` is honoured under every scheduler, so
resubmitting one index (``sbatch --array=1``) with ``EVALSUP_SHARDS=4`` redoes shard 1 of 4. Without it, a Slurm
array must be exactly 0..N-1 (N = ``SLURM_ARRAY_TASK_MAX`` + 1); anything else is refused rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SHARDS_VAR = "EVALSUP_SHARDS"

# (index variable, count variable used without EVALSUP_SHARDS or None, what it is)
SCHEDULERS: tuple[tuple[str, str | None, str], ...] = (
    ("JOB_COMPLETION_INDEX", None, "Kubernetes Indexed Job"),
    ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MAX", "Slurm job array"),
    ("AWS_BATCH_JOB_ARRAY_INDEX", "AWS_BATCH_JOB_ARRAY_SIZE", "AWS Batch array job"),
)


_SHARD_DIR = re.compile(r"shard-([0-9]+)-of-([0-9]+)")


def shard_dir_name(k: int, n: int) -> str:
    """The directory of shard ``k`` of ``n`` (0 <= k < n) in the run's directory: ``shard-K-of-N``. Its one
    parser is parse_shard_dir; both are reached through evalsup.rundir.layout."""
    return f"shard-{k}-of-{n}"


def parse_shard_dir(name: str) -> tuple[int, int] | None:
    """(K, N) of a directory named as shard_dir_name names it, else None: not ``shard-3-of-2`` (K >= N), not
    ``shard-01-of-2`` (not the name shard_dir_name gives), not a moved-aside ``shard-0-of-2.old-TIME``."""
    m = _SHARD_DIR.fullmatch(name)
    if m is None:
        return None
    k, n = int(m.group(1)), int(m.group(2))
    return (k, n) if 0 <= k < n and shard_dir_name(k, n) == name else None


class ShardError(ValueError):
    """The shard cannot be told from the settings; the message says why and what to set."""


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw.strip())
    except ValueError:
        raise ShardError(f"--shard auto: {name}={raw!r} is not a whole number") from None


def _slurm_count(env: Mapping[str, str]) -> int:
    """N of a Slurm array that is exactly 0..N-1 (no step, no gaps); otherwise a ShardError."""
    if "SLURM_ARRAY_TASK_MAX" not in env:
        raise ShardError(f"--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_MAX is not; set "
                         f"{SHARDS_VAR} to the number of shards")
    top = _int(env, "SLURM_ARRAY_TASK_MAX")
    low = _int(env, "SLURM_ARRAY_TASK_MIN") if "SLURM_ARRAY_TASK_MIN" in env else 0
    step = _int(env, "SLURM_ARRAY_TASK_STEP") if "SLURM_ARRAY_TASK_STEP" in env else 1
    count = _int(env, "SLURM_ARRAY_TASK_COUNT") if "SLURM_ARRAY_TASK_COUNT" in env else top + 1
    if low != 0 or step != 1 or count != top + 1:
        shape = f"min {low}, max {top}, step {step}, {count} task(s)"
        raise ShardError(
            f"--shard auto: this Slurm array ({shape}) is not 0..N-1, so it does not say how many shards there "
            f"are; set {SHARDS_VAR}=N (e.g. sbatch --export=ALL,{SHARDS_VAR}=4 --array=1 ... to redo shard 1 of 4)")
    return top + 1


def shard_from_env(env: Mapping[str, str]) -> tuple[int, int]:
    """``--shard auto``: (K, N) from the first scheduler whose index variable is set."""
    for idx_var, count_var, what in SCHEDULERS:
        if idx_var not in env:
            continue
        k = _int(env, idx_var)
        if env.get(SHARDS_VAR, "").strip():
            n, source = _int(env, SHARDS_VAR), SHARDS_VAR
        elif idx_var == "SLURM_ARRAY_TASK_ID":
            n, source = _slurm_count(env), "SLURM_ARRAY_TASK_MAX + 1"
        elif count_var is not None and count_var in env:
            n, source = _int(env, count_var), count_var
        else:
            raise ShardError(f"--shard auto: {idx_var} is set ({what}) but {SHARDS_VAR} is not; "
                             f"set {SHARDS_VAR} to the number of shards")
        if n < 1 or not 0 <= k < n:
            raise ShardError(f"--shard auto: {idx_var}={k} is not a shard of {n} (from {source}): need "
                             f"0 <= K < N")
        return k, n
    names = ", ".join(i for i, _, _ in SCHEDULERS)
    raise ShardError(f"--shard auto: no array-job index found (looked for {names}, with {SHARDS_VAR} for the count)")


def parse_shard(value: str | None, env: Mapping[str, str]) -> tuple[int, int] | None:
    """``--shard K/N``, ``auto`` (see shard_from_env) or nothing."""
    if not value:
        return None
    if value == "auto":
        return shard_from_env(env)
    k_s, sep, n_s = value.partition("/")
    try:
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise ShardError(f"--shard must be K/N (e.g. 0/4) or auto, got {value!r}") from None
    if not sep or n < 1 or not 0 <= k < n:
        raise ShardError(f"--shard {value}: need 0 <= K < N")
    return k, n


def _name(shard: tuple[int, int] | None) -> str:
    return f"shard {shard[0]} of {shard[1]} (--shard {shard[0]}/{shard[1]})" if shard else "a run without --shard"


def shard_mismatch(fingerprint: Mapping[str, Any], shard: tuple[int, int] | None, run_dir: str) -> str | None:
    """Why a run directory (whose checkpoint holds ``fingerprint``) is not this shard's, or None if it is."""
    raw = fingerprint.get("shard")
    had = (int(raw[0]), int(raw[1])) if isinstance(raw, list | tuple) and len(raw) == 2 else None
    if had == shard:
        return None
    return (f"{run_dir} was created for {_name(had)}, not {_name(shard)}: a different shard count selects other "
            "lines; use the shard's own directory (drop --out), or --fresh to start this one over")
