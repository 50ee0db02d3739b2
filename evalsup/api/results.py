"""Reading a run's results from Python: ``read_results`` streams them, ``to_pandas`` makes a DataFrame.

The file is checked as `evalsup status`, `score` and `report` check it, by the same code
(``rundir.results_file``): before the first record, the lines a run directory's checkpoint covers against its
CRC, and a second record for a task (``refuse_second_record``: with the checkpoint only the records after it
are held, as the resume does); then each line as it is read (one that is no record). Either is
``ResultsDamaged``, the message `evalsup status` prints. The records still stream: nothing is held but that
check's ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import orjson

from evalsup.api.exceptions import BadInput, ResultsDamaged
from evalsup.rundir import layout
from evalsup.rundir.checkpoint import RunDirDamaged
from evalsup.rundir.results_file import LineAt, iter_records, refuse_second_record
from evalsup.tasks.group_key import group_of, parse_group_by
from evalsup.tasks.routes import answer_text


@dataclass(frozen=True, slots=True)
class Record:
    """One line of results.jsonl, typed. ``raw`` is the whole record as a dict."""

    custom_id: str
    ok: bool  # the request succeeded (HTTP 200); scores may still be low
    status_code: int | None
    body: Any  # the endpoint's response body (a dict), or None
    error: dict[str, Any] | None  # {"code", "message"} of a task that finally failed
    scores: dict[str, Any]
    metadata: dict[str, Any]
    metrics: dict[str, Any]
    raw: dict[str, Any]

    @property
    def text(self) -> str | None:
        """The answer's text, for every route (evalsup.tasks.routes.answer_text): the first choice's message
        content (chat) or text (completions), a Responses answer's output text; None for embeddings, a tool
        call, or no body."""
        return answer_text(self.body)

    @classmethod
    def from_dict(cls, rec: dict[str, Any]) -> Record:
        resp = rec.get("response") or {}
        return cls(custom_id=str(rec["custom_id"]), ok=rec.get("error") is None and resp.get("status_code") == 200,
                   status_code=resp.get("status_code"), body=resp.get("body"), error=rec.get("error"),
                   scores=rec.get("scores") or {}, metadata=rec.get("metadata") or {},
                   metrics=rec.get("metrics") or {}, raw=rec)


def _results_path(where: str | Path) -> tuple[Path, Path | None]:
    """(results file, its run directory or None)."""
    p = Path(where)
    if p.is_dir():
        if not (p / layout.RESULTS).is_file():
            raise BadInput(f"{p}: no {layout.RESULTS} in it (not a run directory)")
        return p / layout.RESULTS, p
    if not p.is_file():
        raise BadInput(f"{p}: no such file or run directory")
    return p, None


def _refuse_second_record(path: Path) -> None:
    """ResultsDamaged for a second record of a task (or a line before it that is no record)."""
    try:
        refuse_second_record(path, verify=True)
    except RunDirDamaged as e:
        raise ResultsDamaged(str(e)) from None


def _records(path: Path) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """(offset, line, record) of each complete line, each checked to be a record (ResultsDamaged, naming
    ``file:LINE``, if not); a torn last line (a run killed mid-write, or still writing) is not a result."""
    pos = 0
    try:
        for _n, line, rec in iter_records(path):
            yield pos, line, rec
            pos += len(line)
    except RunDirDamaged as e:
        raise ResultsDamaged(str(e)) from None


def _task_file(run_dir: Path | None, tasks: str | Path | None) -> Path:
    if tasks is not None:
        return Path(tasks)
    if run_dir is not None:
        from evalsup.rundir.inputs import load_info

        info = load_info(run_dir)
        if info and Path(info["tasks"]).is_file():
            return Path(info["tasks"])
        if info and (run_dir / layout.INPUT_COPY).is_file():  # the run directory's own copy, moved with it
            return run_dir / layout.INPUT_COPY
        suffix = layout.RUN_DIR_SUFFIX
        name = run_dir.name[: -len(suffix)] if run_dir.name.endswith(suffix) else None
        if name and (run_dir.parent / f"{name}.jsonl").is_file():  # the CLI's default: TASKS.run beside TASKS
            return run_dir.parent / f"{name}.jsonl"
    raise BadInput(f"ordered=True needs the task file (the input order): pass tasks=PATH ({run_dir or 'a file'} "
                   "does not say where it is)")


def _in_input_order(results: Path, tasks: Path) -> Iterator[bytes]:
    """The result lines in the order of the task file, via a compact id -> offset index (16 bytes an id, no
    strings kept) of the results; tasks without a result are skipped."""
    from evalsup.tasks.idset import IdSet
    from evalsup.tasks.reader import TaskError, TaskReader

    index = IdSet()
    with LineAt(results) as id_at:
        for pos, _line, rec in _records(results):
            index.add(rec["custom_id"], pos, id_at)
        try:
            reader = TaskReader(tasks, 1 << 30)
        except OSError as e:
            raise BadInput(f"{tasks}: {e.strerror}") from None
        with reader:
            while True:
                try:
                    got = reader.next()
                except TaskError:
                    continue  # an invalid line has no result
                if got is None:
                    return
                at = index.find(got[0].id, id_at)
                if at is not None:
                    yield id_at.line(at)


@overload
def read_results(where: str | Path, *, ordered: bool = ..., typed: Literal[False] = ...,
                 tasks: str | Path | None = ...) -> Iterator[dict[str, Any]]: ...
@overload
def read_results(where: str | Path, *, ordered: bool = ..., typed: Literal[True],
                 tasks: str | Path | None = ...) -> Iterator[Record]: ...


def read_results(where: str | Path, *, ordered: bool = False, typed: bool = False,
                 tasks: str | Path | None = None) -> Iterator[dict[str, Any]] | Iterator[Record]:
    """Stream the records of a run directory (or a results.jsonl file), one at a time.

    ``ordered=False``: in file order (the order tasks finished). ``ordered=True``: in the task file's order,
    without loading either file (``tasks`` defaults to the run directory's own copy, or TASKS beside
    TASKS.run). ``typed=True`` yields ``Record`` objects (``.custom_id``, ``.ok``, ``.body``, ``.error``,
    ``.scores``, ``.text``) instead of dicts. A run still going can be read: its last line is read only once
    complete.

    Raises ``ResultsDamaged`` (the line `evalsup status` prints: ``results.jsonl:LINE: ...``, and what
    `evalsup repair` does) at once when the file holds a second record for a task, and while reading at a line
    that is no record.
    """
    results, run_dir = _results_path(where)
    task_file = _task_file(run_dir, tasks) if ordered else None
    _refuse_second_record(results)

    def recs() -> Iterator[dict[str, Any]]:
        if task_file is not None:
            for line in _in_input_order(results, task_file):
                yield orjson.loads(line)
        else:
            for _, _line, rec in _records(results):
                yield rec

    if typed:
        return (Record.from_dict(rec) for rec in recs())
    return recs()


def _flat(rec: dict[str, Any], group_path: tuple[str, ...] | None = None) -> dict[str, Any]:
    r = Record.from_dict(rec)
    row: dict[str, Any] = {"custom_id": r.custom_id, "ok": r.ok, "status_code": r.status_code, "text": r.text,
                           "error_code": (r.error or {}).get("code"), "error_message": (r.error or {}).get("message"),
                           "latency_s": r.metrics.get("latency_s"), "attempts": r.metrics.get("attempts")}
    usage = r.body.get("usage") if isinstance(r.body, dict) else None
    if isinstance(usage, dict):
        row["prompt_tokens"] = usage.get("prompt_tokens")
        row["completion_tokens"] = usage.get("completion_tokens")
    for k, v in r.scores.items():
        row[f"score.{k}"] = v
    for k, v in r.metadata.items():
        row[f"metadata.{k}"] = v
    if group_path is not None:
        row["group"] = group_of(r.metadata, group_path)
    return row


def to_pandas(where: str | Path, *, ordered: bool = False, tasks: str | Path | None = None,
              group_by: str | None = None) -> Any:
    """A pandas DataFrame of a run's records, one row each: custom_id, ok, status_code, text, error_code,
    error_message, latency_s, attempts, tokens, ``score.NAME`` and ``metadata.KEY`` columns. ``group_by``
    (``metadata.KEY``, as ``--group-by``) adds a ``group`` column, the group each task is counted in
    (``(none)`` without the key): ``df.groupby("group")["score.choice"].mean()`` is the run's table. Needs
    pandas (``pip install pandas``; evalsup does not require it)."""
    import importlib

    path = parse_group_by(group_by) if group_by is not None else None  # a bad one: GroupByError, a ValueError
    try:
        pd = importlib.import_module("pandas")  # optional: not a dependency of evalsup
    except ImportError:
        raise ImportError("evalsup.to_pandas needs pandas: pip install pandas") from None
    return pd.DataFrame.from_records(_flat(r, path) for r in read_results(where, ordered=ordered, tasks=tasks))
