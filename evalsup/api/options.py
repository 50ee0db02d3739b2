"""The Python API's keyword forms beyond `evalsup run`'s options, turned into those options: ``judge=`` (a
``Judge`` or a dict of its fields) becomes the ``judge_*`` options with "judge" among the scorers, and
``response_schema=`` given as a dict or a pydantic model class becomes a JSON schema to write to a file (the CLI
takes a file). One place for ``evalsup.run`` and ``evalsup.ray.run_shards``: this module imports no CLI, so the
ray package may import it (evalsup.api.run imports the CLI, which imports evalsup.ray)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evalsup.tasks.secrets import url_secrets


@dataclass(frozen=True)
class Judge:
    """The model-graded scorer's settings for ``evalsup.run(..., judge=Judge(...))``: the same as the
    ``judge_*`` keywords (``--judge-*`` options), and ``"judge"`` is added to the scorers. ``api_key_env`` names
    the variable that holds the judge's key (never the key itself)."""

    base_url: str
    model: str | None = None
    api_key_env: str | None = None
    template: str | os.PathLike[str] | None = None
    concurrency: int | None = None
    max_tokens: int | None = None
    timeout: float | None = None

    def options(self) -> dict[str, Any]:
        """As ``evalsup.run``'s keywords (those set)."""
        out: dict[str, Any] = {"judge_base_url": self.base_url, "judge_model": self.model,
                               "judge_api_key_env": self.api_key_env,
                               "judge_template": None if self.template is None else os.fspath(self.template),
                               "judge_concurrency": self.concurrency, "judge_max_tokens": self.max_tokens,
                               "judge_timeout": self.timeout}
        return {k: v for k, v in out.items() if v is not None}


def with_judge(options: dict[str, Any], caller: str = "run") -> dict[str, Any]:
    """``judge=Judge(...)`` (or a dict of its fields) as the judge_* keywords, with "judge" among the scorers.
    Raises TypeError (naming ``caller``) for anything else, or for judge= given beside a judge_* keyword."""
    options = dict(options)
    judge = options.pop("judge", None)
    if judge is None:
        return options
    if isinstance(judge, dict):
        judge = Judge(**judge)
    if not isinstance(judge, Judge):
        raise TypeError(f"judge must be evalsup.Judge(...) or a dict of its fields, not {type(judge).__name__}")
    clash = sorted(k for k in judge.options() if k in options)
    if clash:
        raise TypeError(f"{caller}() got both judge= and {', '.join(clash)}")
    scorers = options.get("scorers") or ()
    scorers = [scorers] if isinstance(scorers, str) else list(scorers)
    return {**options, **judge.options(), "scorers": scorers if "judge" in scorers else [*scorers, "judge"]}


def schema_inline(schema: Any) -> bool:
    """Whether ``response_schema=`` was given as a schema (a dict, a model class) rather than a file's path."""
    return schema is not None and not isinstance(schema, str | os.PathLike)


def schema_dict(schema: Any) -> dict[str, Any]:
    """A JSON schema given to evalsup.run: a dict as it is, a pydantic model class as its model_json_schema()."""
    if isinstance(schema, dict):
        return schema
    to_schema = getattr(schema, "model_json_schema", None)
    if isinstance(schema, type) and callable(to_schema):
        return dict(to_schema())
    raise TypeError(f"response_schema must be a path, a dict or a pydantic model class, not {type(schema).__name__}")


def write_schema(schema: Any, path: Path) -> str:
    """Write ``schema`` (schema_dict's forms) to ``path`` as JSON, for --response-schema; its path as a string.
    run.json records the schema itself, not the file: a later call with the same schema resumes, wherever it
    was written."""
    path.write_bytes(orjson.dumps(schema_dict(schema)))
    return str(path)


def credentials_off_the_command_line(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Base URLs holding a credential (user:password@, issue 34; a query value, issue 39) go to the child
    `evalsup run` as OPENAI_BASE_URL, not on its command line, which any process title shows; (the options
    without them, the child's extra environment). ``evalsup.run`` and ``evalsup.ray.run_shards``."""
    urls = options.get("base_url") or []
    if not any(url_secrets(u) for u in urls) or any("," in u for u in urls):
        return options, {}
    return {**options, "base_url": None}, {"OPENAI_BASE_URL": ",".join(urls)}
