"""The run's request settings, in ``run.json``, and the guard that keeps a resume from mixing them.

Every setting that changes a request or a record (model, max tokens, temperature, stream, the endpoint's
path, the scorers and their options) is written to ``RUN_DIR/run.json`` as ``{"version": 1, "settings":
{...}}`` when a run starts; never a secret (the key's source is not even named). A resume with different
settings is refused (exit 2), one line per difference and the way out; ``--accept-changed-settings`` takes
the new ones and records the change in ``run.json["changes"]``. Settings that change no request (workers,
concurrency, timeouts, attempts, logging) are not recorded and change freely. ``run.json["endpoints"]`` keeps
the last session's endpoints (public URLs), and a resume with others says so in one line (``note_endpoints``).

A resume continues with the recorded settings (invariant 9): ``resume_config`` builds the run's config with
every request flag left out at run.json's value (saying so in one line), so only a flag given with another
value is a change. A key an older run.json lacks takes today's default, in that merge and in the guard's
comparison alike. The endpoint's path is not a flag that can be left out (the endpoint always comes from
--base-url or $OPENAI_BASE_URL); it is only compared.

A few settings change no request and no record, only how the summary reads them (``FREE``: ``--group-by``):
they are recorded and, left out, restored like the others, but another value on a resume is no change to
refuse: it is taken, and run.json keeps it for the next resume (the summary, summary.json and Prometheus group
this session's records by it, as their scores are this session's; the report, which reads every record, groups
the whole run by it, and ``evalsup report --group-by`` regroups any run afterwards).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from evalsup.config.options import BY_NAME, DEFAULTS
from evalsup.config.run_config import ConfigError, RunConfig, build_config, run_dir_of
from evalsup.rundir.checkpoint import JournalError, write_atomic
from evalsup.rundir.layout import RUN_JSON
from evalsup.tasks.requests import public_url

RUN_JSON_VERSION = 1


class SettingsChanged(JournalError):
    """A resume with request settings that differ from the run's: exit 2; the message lists them."""


def request_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings that change what is sent or what is recorded."""
    w = cfg.worker
    out = {
        "model": w.model,
        "max_tokens": w.max_tokens,
        "temperature": w.temperature,
        "stream": w.stream,
        "endpoint_path": endpoint_paths(w.endpoints),
        "scorers": list(w.scorers),
        "score_strip": w.score_strip,
        "score_ignore_case": w.score_ignore_case,
        "score_pattern": w.score_pattern,
        "score_normalize": w.score_normalize,
        "response_schema": w.response_schema,  # the schema itself: a resume compares what is validated
        "max_reasks": w.max_reasks,
        "validate_schema": w.validate_schema,  # off: a task's own schema is not validated (no schema_invalid)
        "batch_api": w.batch is not None,  # a resume of a batch run stays one: its batches are adopted
        # whose batch API, as given (auto: by the base URL): a resume's batches are at the same provider
        "batch_provider": "auto" if w.batch is None else str(w.batch.get("provider_option", "auto")),
        "group_by": w.group_by,  # FREE: how the summary groups the records; another value on a resume is taken
    }
    if w.judge_base_url is not None:
        # --scorer judge (only then): its key's variable by name, never the key; the template's file, and its
        # content's hash, so an edited template is a change
        out |= {"judge_base_url": public_url(w.judge_base_url), "judge_model": w.judge_model,
                "judge_api_key_env": w.judge_api_key_env, "judge_template": cfg.judge_template_path,
                "judge_template_sha256": None if w.judge_template is None
                else sha256(w.judge_template.encode()).hexdigest(),
                "judge_max_tokens": w.judge_max_tokens}
    return out


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


@dataclass(frozen=True)
class _Flag:
    """The option (evalsup.config.options) that sets one request setting, and what run.json may hold for it."""

    option: str
    kinds: tuple[type, ...]  # the types a recorded value may have (exactly: True is no max_tokens)
    inverted: bool = False  # the option says the opposite (--no-strip is score_strip False)

    def to_option(self, value: Any) -> Any:
        if self.inverted:
            return not value
        return tuple(value) if isinstance(value, list) else value

    def to_setting(self, value: Any) -> Any:
        if self.inverted:
            return not value
        return list(value) if isinstance(value, tuple) else value

    def valid(self, value: Any) -> bool:
        return type(value) in self.kinds and (not isinstance(value, list) or all(type(v) is str for v in value))


# Each request setting a flag sets (request_settings' keys but endpoint_path): left out on a resume, it takes
# run.json's value; a key an older run.json lacks takes the option's default.
FLAGGED: dict[str, _Flag] = {
    "model": _Flag("model", (str, type(None))),
    "max_tokens": _Flag("max_tokens", (int, type(None))),
    "temperature": _Flag("temperature", (float, int, type(None))),
    "stream": _Flag("stream", (bool,)),
    "scorers": _Flag("scorers", (list,)),
    "score_strip": _Flag("no_strip", (bool,), inverted=True),
    "score_ignore_case": _Flag("ignore_case", (bool,)),
    "score_pattern": _Flag("regex", (str, type(None))),
    "score_normalize": _Flag("normalize", (bool,)),
    "response_schema": _Flag("response_schema", (dict, type(None))),
    "max_reasks": _Flag("max_reasks", (int,)),
    "validate_schema": _Flag("validate_schema", (bool,)),
    "judge_base_url": _Flag("judge_base_url", (str, type(None))),
    "judge_model": _Flag("judge_model", (str, type(None))),
    "judge_api_key_env": _Flag("judge_api_key_env", (str, type(None))),
    "judge_template": _Flag("judge_template", (str, type(None))),
    "judge_max_tokens": _Flag("judge_max_tokens", (int, type(None))),
    "batch_api": _Flag("batch_api", (bool,)),
    "batch_provider": _Flag("batch_provider", (str,)),
    "group_by": _Flag("group_by", (str, type(None))),
}
# Recorded and restored, but free to change on a resume: they change no request and no record (the module's doc)
FREE = frozenset({"group_by"})
SETTING_DEFAULTS: dict[str, Any] = {k: f.to_setting(DEFAULTS[f.option]) for k, f in FLAGGED.items()}
_FLAGS = {**{k: BY_NAME[f.option].flag for k, f in FLAGGED.items()}, "endpoint_path": "--base-url (its path)",
          "judge_template_sha256": "--judge-template (its content)"}


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
    """One line per request setting that differs. A setting ``old`` (an older run.json) lacks counts as today's
    default; one with no default (the endpoint's path) as unknown, so not a difference. A ``FREE`` setting's
    change is none."""
    old = {**SETTING_DEFAULTS, **old}
    out = []
    for k in sorted(set(old) | set(new)):
        if k not in old or k in FREE:
            continue
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
    if diff and not accept:
        raise SettingsChanged(_refusal(run_dir, diff))
    if not diff:
        # an older run.json: the settings it lacked, at their defaults; a FREE setting's new value, kept
        if {**rec["settings"], **settings} != rec["settings"]:
            write_atomic(run_dir / RUN_JSON, orjson.dumps(
                {**rec, "settings": {**rec["settings"], **settings}}, option=orjson.OPT_INDENT_2))
        return []
    changes = list(rec.get("changes", []))
    changes.append({"time": now, "from": rec["settings"], "to": settings})
    write_atomic(run_dir / RUN_JSON, orjson.dumps(
        {**rec, "settings": settings, "changes": changes}, option=orjson.OPT_INDENT_2))
    return diff


def _refusal(run_dir: Path, diff: list[str]) -> str:
    lines = [f"{run_dir}: the run was started with other request settings; resuming would mix them in one "
             "results file:"]
    lines += [f"  {d}" for d in diff]
    lines.append("  rerun without those flags (a request flag left out takes the run's value), with --fresh to "
                 "start over (the old run directory is moved aside), with --out for a new one, or with "
                 "--accept-changed-settings to go on with the new ones (recorded in run.json)")
    return "\n".join(lines)


def refusal(run_dir: Path, settings: dict[str, Any], accept: bool) -> str | None:
    """What ``guard`` will refuse on a resume, said before anything else (issue 44: before the endpoint check's
    request): the changed request settings' lines, or None (nothing to refuse, or a run.json that cannot be
    read, which the guard refuses in its own words under the run's lock). Reads only."""
    try:
        rec = read_run_json(run_dir)
    except (JournalError, OSError):
        return None
    if rec is None or accept:
        return None
    diff = differences(rec["settings"], settings)
    return _refusal(run_dir, diff) if diff else None


def recorded_settings(run_dir: Path) -> dict[str, Any] | None:
    """run.json's settings (for summary.json and `evalsup status`), None when there is none or it is bad."""
    try:
        rec = read_run_json(run_dir)
    except (JournalError, OSError):
        return None
    return None if rec is None else dict(rec["settings"])


# ---------------------------------------------------------------------------------- a resume's settings


def recorded_options(run_dir: Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """The request options left out of ``given`` (option name -> value) as run.json records them: what a resume
    continues with. Empty without a run.json (a new run), and for one that cannot be read (the guard refuses
    it, under the run directory's lock). A key an older run.json lacks is left out: it takes today's default.
    Raises ConfigError for a recorded value that no flag could have set (a hand-edited run.json)."""
    try:
        rec = read_run_json(run_dir)
    except (JournalError, OSError):
        return {}
    if rec is None:
        return {}
    out: dict[str, Any] = {}
    for key, flag in FLAGGED.items():
        if flag.option in given or key not in rec["settings"]:
            continue
        value = rec["settings"][key]
        if not flag.valid(value):
            raise ConfigError(f"{run_dir / RUN_JSON}: settings.{key} is {value!r}, which {_FLAGS[key]} cannot "
                              f"be; give {_FLAGS[key]}, restore run.json, or start over with --fresh")
        out[flag.option] = flag.to_option(value)
    return out


def resume_config(tasks: Path, given: dict[str, Any]) -> tuple[RunConfig, str | None]:
    """`evalsup run`'s config: build_config(tasks, given), where on a resume (a run.json in the run directory,
    and no --fresh) every request option left out of ``given`` takes the run's recorded value (invariant 9).
    ``given`` holds only the options the user gave: a default click filled in is not given. This is the one
    place the recorded settings are merged, before the config is frozen and the supervisor (whose guard
    compares them with run.json) starts.

    Returns the config, and the line that says so when it took a setting that is not today's default (None
    otherwise, and when the guard will refuse the resume for a flag given with another value)."""
    if given.get("fresh"):
        return build_config(tasks, given), None
    run_dir = run_dir_of(tasks, given.get("out"), given.get("shard"))
    taken = recorded_options(run_dir, given)
    if "judge" not in (given.get("scorers") or taken.get("scorers") or ()):  # the judge's settings go with it
        taken = {k: v for k, v in taken.items() if not k.startswith("judge_")}
    cfg = build_config(tasks, {**given, **taken})
    shown = {k: f.to_setting(taken[f.option]) for k, f in FLAGGED.items()
             if f.option in taken and f.to_setting(taken[f.option]) != SETTING_DEFAULTS[k]}
    if not shown or (differences(recorded_settings(run_dir) or {}, request_settings(cfg))
                     and not cfg.accept_changed_settings):
        return cfg, None
    return cfg, (f"resuming with the settings of {run_dir / RUN_JSON}: "
                 + ", ".join(f"{k}={v!r}" for k, v in shown.items()))
