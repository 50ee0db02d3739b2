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
from evalsup.api.options import credentials_off_the_command_line, schema_inline, with_judge, write_schema
from evalsup.common.child import last_message, run_child
from evalsup.config.options import BY_NAME, argv_of
from evalsup.config.run_config import run_dir_of


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
    ``evalsup.run``'s keywords, in the same forms: ``judge=`` an ``evalsup.Judge`` or a dict of its fields,
    ``response_schema=`` a file's path, a dict or a pydantic model class, ``group_by=``...; --concurrency and the
    rate limits are split among the shards. Calling it again resumes every unfinished shard.

    A schema given as a dict or a model class is written beside the run directory, to
    ``OUT.response_schema.json`` (``OUT`` is ``out``, or TASKS.run), where every node sees it (a temporary file
    would be on the driver's disk only); run.json records the schema itself."""
    options = with_judge(run_options, "run_shards")  # as evalsup.run: the same conversions (evalsup.api.options)
    bad = [k for k in options if k not in BY_NAME or not BY_NAME[k].api]
    if bad:
        raise TypeError(f"run_shards() got unexpected keyword argument(s): {', '.join(sorted(bad))}")
    if isinstance(options.get("base_url"), str):
        options["base_url"] = [options["base_url"]]
    if schema_inline(options.get("response_schema")):
        run_dir = run_dir_of(Path(tasks), None if out is None else Path(out), None).resolve()
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        options["response_schema"] = write_schema(options["response_schema"],
                                                  run_dir.with_name(f"{run_dir.name}.response_schema.json"))
    options |= {"out": None if out is None else os.fspath(out), "ray": address or "default", "shards": num_shards,
                "ray_retries": retries}
    options, env = credentials_off_the_command_line(options)
    cmd = [sys.executable, "-m", "evalsup", "run", os.fspath(tasks), *argv_of(options), "--json"]
    if not progress:
        cmd.append("--quiet")
    with tempfile.TemporaryDirectory(prefix="evalsup-ray-") as tmp:
        code, summary, err_lines = run_child(cmd, False, Path(tmp), progress, env)
    err = error_for_exit(code, last_message(err_lines))
    if err is not None:
        raise err
    if summary is None:
        raise RunStopped(last_message(err_lines) or "the run on Ray printed no summary", code)
    return ShardsResult(summary)
