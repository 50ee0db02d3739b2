"""evalsup on Ray (an optional extra: ``pip install 'evalsup[ray]'``; evalsup never requires Ray).

``evalsup.ray.run_shards(tasks, out, num_shards=N, **run_options)`` is ``evalsup run --ray --shards N``: each
shard a Ray task, a retry a resume, the merge at the end proving coverage (evalsup.ray.driver). Like
``evalsup.run`` it runs the command in a child process and returns its summary, or raises BadInput,
BadSettings or RunStopped with the command's one line.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsup.api.exceptions import RunStopped, error_for_exit
from evalsup.common.child import last_message, run_child
from evalsup.config.options import BY_NAME, argv_of


@dataclass(frozen=True)
class ShardsResult:
    """A finished run on Ray: the merged summary (``merged.summary.json`` plus ``run_dir`` and ``merged``)."""

    summary: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        return Path(self.summary["run_dir"])

    @property
    def merged(self) -> Path:
        """The merged results file, every task once: ``RUN_DIR/merged.jsonl``."""
        return Path(self.summary["merged"])

    @property
    def total(self) -> int:
        return int(self.summary["total"])


def run_shards(tasks: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *, num_shards: int,
               address: str | None = None, retries: int | None = None, progress: bool = True,
               **run_options: Any) -> ShardsResult:
    """Run ``tasks`` (a file on a path every node sees) as ``num_shards`` Ray tasks on the cluster at ``address``
    (Ray's own default without one) and merge them into ``out/merged.jsonl``. ``run_options`` are
    ``evalsup.run``'s keywords; --concurrency and the rate limits are split among the shards. Calling it again
    resumes every unfinished shard."""
    bad = [k for k in run_options if k not in BY_NAME or not BY_NAME[k].api]
    if bad:
        raise TypeError(f"run_shards() got unexpected keyword argument(s): {', '.join(sorted(bad))}")
    if isinstance(run_options.get("base_url"), str):
        run_options["base_url"] = [run_options["base_url"]]
    options = {**run_options, "out": None if out is None else os.fspath(out), "ray": address or "default",
               "shards": num_shards, "ray_retries": retries}
    cmd = [sys.executable, "-m", "evalsup", "run", os.fspath(tasks), *argv_of(options), "--json"]
    if not progress:
        cmd.append("--quiet")
    with tempfile.TemporaryDirectory(prefix="evalsup-ray-") as tmp:
        code, summary, err_lines = run_child(cmd, False, Path(tmp), progress)
    err = error_for_exit(code, last_message(err_lines))
    if err is not None:
        raise err
    if summary is None:
        raise RunStopped(last_message(err_lines) or "the run on Ray printed no summary", code)
    return ShardsResult(summary)
