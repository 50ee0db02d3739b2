"""The run's request settings, in ``run.json``, and the guard that keeps a resume from mixing them.

Every setting that changes a request or a record (model, max tokens, temperature, stream, the endpoint's
path, the scorers and their options) is written to ``RUN_DIR/run.json`` as ``{"version": 1, "settings":
{...}}`` when a run starts; never a secret (the key's source is not even named). A resume with different
settings is refused (exit 2), one line per difference and the way out; ``--accept-changed-settings`` takes
the new ones and records the change in ``run.json["changes"]``. Settings that change no request (workers,
concurrency, timeouts, attempts, logging) are not recorded and change freely. ``run.json["endpoints"]`` keeps
the last session's endpoints (public URLs), and a resume with others says so in one line (``note_endpoints``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from evalsup.config.run_config import RunConfig
from evalsup.rundir.checkpoint import JournalError, write_atomic
from evalsup.rundir.layout import RUN_JSON

RUN_JSON_VERSION = 1


class SettingsChanged(JournalError):
    """A resume with request settings that differ from the run's: exit 2; the message lists them."""


def request_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings that change what is sent or what is recorded."""
    w = cfg.worker
    return {
        "model": w.model,
        "max_tokens": w.max_tokens,
        "temperature": w.temperature,
        "stream": w.stream,
        "endpoint_path": endpoint_paths(w.endpoints),
        "scorers": list(w.scorers),
        "score_strip": w.score_strip,
        "score_ignore_case": w.score_ignore_case,
        "score_pattern": w.score_pattern,
    }


def endpoint_paths(urls: tuple[str, ...]) -> str | list[str]:
    """The endpoints' path (``/v1``; sorted, when they differ): a different path may be another API or
    deployment, while another host or port for the same path is another replica and changes freely."""
    paths = sorted({urlsplit(u).path.rstrip("/") or "/" for u in urls})
    return paths[0] if len(paths) == 1 else paths


def note_endpoints(run_dir: Path, urls: list[str], log: Callable[[str], None]) -> None:
    """Keep the endpoints (public URLs) in run.json; on a resume with other ones, say so in one line."""
    rec = read_run_json(run_dir)
    if rec is None or rec.get("endpoints") == urls:
        return
    if isinstance(rec.get("endpoints"), list):
        log(f"resuming with other endpoints than the last session: {', '.join(urls)} "
            f"(was {', '.join(map(str, rec['endpoints']))}); records name the endpoint that served them")
    write_atomic(run_dir / RUN_JSON, orjson.dumps({**rec, "endpoints": urls}, option=orjson.OPT_INDENT_2))


_FLAGS = {"model": "--model", "max_tokens": "--max-tokens", "temperature": "--temperature", "stream": "--stream",
          "endpoint_path": "--base-url (its path)", "scorers": "--scorer", "score_strip": "--no-strip",
          "score_ignore_case": "--ignore-case", "score_pattern": "--regex"}


def read_run_json(run_dir: Path) -> dict[str, Any] | None:
    p = run_dir / RUN_JSON
    try:
        d = orjson.loads(p.read_bytes())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as e:
        raise JournalError(f"{p}: unreadable ({e}); restore it, or start over with --fresh") from None
    if not isinstance(d, dict) or d.get("version") != RUN_JSON_VERSION or not isinstance(d.get("settings"), dict):
        raise JournalError(f"{p}: not a version {RUN_JSON_VERSION} run.json; restore it, or start over with --fresh")
    return d


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        if old.get(k) != new.get(k):
            out.append(f"{k} ({_FLAGS.get(k, k)}): {old.get(k)!r} then, {new.get(k)!r} now")
    return out


def guard(run_dir: Path, settings: dict[str, Any], resuming: bool, accept: bool) -> list[str]:
    """Check ``settings`` against ``run.json`` on a resume (raises SettingsChanged unless ``accept``), and write
    run.json when it is new or changed. Returns the differences accepted (empty if none). Writes nothing
    when it refuses."""
    rec = read_run_json(run_dir) if resuming else None
    now = round(time.time(), 3)
    if rec is None:  # a new run, or one from before run.json was kept: what it runs with from now on
        write_atomic(run_dir / RUN_JSON, orjson.dumps(
            {"version": RUN_JSON_VERSION, "settings": settings, "created": now}, option=orjson.OPT_INDENT_2))
        return []
    diff = differences(rec["settings"], settings)
    if not diff:
        return []
    if not accept:
        lines = [f"{run_dir}: the run was started with other request settings; resuming would mix them in one "
                 "results file:"]
        lines += [f"  {d}" for d in diff]
        lines.append("  rerun with --fresh to start over (the old run directory is moved aside), with --out for a new "
                     "one, with the old settings, or with --accept-changed-settings to go on with the new ones "
                     "(recorded in run.json)")
        raise SettingsChanged("\n".join(lines))
    changes = list(rec.get("changes", []))
    changes.append({"time": now, "from": rec["settings"], "to": settings})
    write_atomic(run_dir / RUN_JSON, orjson.dumps(
        {**rec, "settings": settings, "changes": changes}, option=orjson.OPT_INDENT_2))
    return diff


def recorded_settings(run_dir: Path) -> dict[str, Any] | None:
    """run.json's settings (for summary.json and `evalsup status`), None when there is none or it is bad."""
    try:
        rec = read_run_json(run_dir)
    except (JournalError, OSError):
        return None
    return None if rec is None else dict(rec["settings"])
