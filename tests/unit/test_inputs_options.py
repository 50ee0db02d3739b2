"""Run options defined once (one table), an explicit 0 honoured, and the input copy checked by its content.
(Each input kind resumed after a kill -9: integration/test_inputs.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsup.config.options import DEFAULTS, RUN_OPTIONS

# ----------------------------------------------------------------------------------------- each input kind


# --------------------------------------------------------------------------------- options defined once

def test_every_run_option_comes_from_the_one_table() -> None:
    from evalsup.cli.main import run as run_command

    params = {p.name: p for p in run_command.params if p.name != "tasks"}
    assert set(params) == {o.name for o in RUN_OPTIONS} | {"config"}  # --config: where the others come from
    for o in RUN_OPTIONS:
        got = params[o.name].default
        assert (tuple(got) if o.multiple else got) == o.default, o.name
        assert o.flag in params[o.name].opts + params[o.name].secondary_opts


def _config(*args: str) -> object:
    from evalsup.cli.main import run as run_command
    from evalsup.config.run_config import build_config

    ctx = run_command.make_context("run", ["t.jsonl", "--base-url", "http://127.0.0.1:1/v1", *args])
    return build_config(Path("t.jsonl"), {k: v for k, v in ctx.params.items() if k != "tasks"})


def test_an_explicit_zero_is_honoured() -> None:
    from evalsup.config.run_config import RunConfig

    cfg = _config("--max-wait-down", "0", "--scorer-timeout", "0", "--monitor-interval", "0", "--log-interval", "0")
    assert isinstance(cfg, RunConfig)
    assert cfg.max_wait_down_s == 0 and cfg.worker.scorer_timeout_s == 0
    assert cfg.monitor_interval_s == 0 and cfg.log_interval_s == 0
    dflt = _config()
    assert isinstance(dflt, RunConfig)
    assert dflt.max_wait_down_s == DEFAULTS["max_wait_down"] == 600.0
    assert dflt.worker.scorer_timeout_s == DEFAULTS["scorer_timeout"] == 30.0


def test_copy_is_checked_by_its_content_even_without_input_json(tmp_path: Path) -> None:
    """A kill between the copy's rename and input.json's write: the copy is hashed again, not trusted or lost."""
    from evalsup.rundir.inputs import InputError, Source, materialize

    run_dir = tmp_path / "r"
    src = Source("stdin", "stdin")
    copy = materialize(src, run_dir, chunks=[b'{"id": "a", "prompt": "p"}\n'])
    (run_dir / "results.jsonl").write_bytes(b'{"custom_id": "a"}\n')  # the run has results
    mtime = copy.stat().st_mtime_ns
    (run_dir / "input.json").unlink()
    assert materialize(src, run_dir, chunks=[b'{"id": "a", ', b'"prompt": "p"}\n']) == copy  # same bytes
    assert copy.stat().st_mtime_ns == mtime and (run_dir / "input.json").exists()
    (run_dir / "input.json").unlink()
    with pytest.raises(InputError, match="not the tasks the run in"):
        materialize(src, run_dir, chunks=[b'{"id": "b", "prompt": "p"}\n'])
    assert copy.read_bytes() == b'{"id": "a", "prompt": "p"}\n' and not (run_dir / "tasks.jsonl.partial").exists()
