"""`evalsup score RUN --scorer judge`: grade a finished run's answers with the judge, without asking the model.

The records are read from results.jsonl in their order and written, with their new scores, to
results.scored.jsonl (as `evalsup score` does for the other scorers, which run here too, in this process). Each
answer's task (its prompt, for the template) is found in the run's task file through a compact id -> offset
index (``tasks.idset.IdSet``, 16 bytes an id; the file is read once to build it). The judge is asked through
``worker.judge`` (the workers' client: retries, its breaker, the key kept out of every output), at most
``concurrency`` requests in flight, and the records go out in order with at most twice that many held.
Nothing is sent to the run's answer endpoints.

A rescoring is a run of its own (issue 43): the judge is checked first (reachable, its key taken, its model
served: one line, exit 2, before any answer is judged); each record goes to results.scored.jsonl.partial in one
write as soon as it is in order (it reaches the OS: a kill -9 loses none of it), beside
results.scored.jsonl.partial.json, the settings it was scored with. A rerun with the same settings reads the
partial file back in step with results.jsonl, keeps every complete line whose record is the same task (their
scores and judge tokens counted again, not asked again), cuts a torn last line, and judges from there; with other
settings it starts over and says so. On a terminal, a progress line.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from evalsup.common.tty_progress import TtyProgress
from evalsup.rundir import layout
from evalsup.rundir.checkpoint import RunDirDamaged
from evalsup.rundir.results_file import iter_records
from evalsup.scoring.judge import JUDGE, TemplateError, Verdict, judge_check_problem, load_template
from evalsup.scoring.scorers import Scored, ScoreFn, ScorerOptions, ScoreStats, load_scorer, response_text, score_sync
from evalsup.tasks.headers import api_key, build_headers, key_source, request_headers
from evalsup.tasks.idset import IdSet
from evalsup.tasks.reader import TaskError, TaskReader, read_line_at, task_id_of
from evalsup.tasks.requests import credentials, join_url, public_url, url_problem
from evalsup.tasks.routes import served_models
from evalsup.tools.judge_caps import JudgeCaps, Need
from evalsup.worker.judge import Judge, JudgeSettings

MAX_LINE = 1 << 30


class JudgeStopped(Exception):
    """The judge cannot be used at all (its key refused, a request that cannot be sent): one line."""


class CapReached(Exception):
    """--max-cost or --max-total-tokens would be passed by the next judge request: stopped, what was scored kept
    (exit 75: a rerun with a higher cap goes on)."""


def task_file(run_dir: Path, tasks: Path | None) -> Path:
    """The run's task file: ``tasks`` when given, else where input.json says, the run directory's own copy, or
    TASKS.jsonl beside TASKS.run."""
    if tasks is not None:
        return tasks
    from evalsup.rundir.inputs import load_info

    info = load_info(run_dir)
    if info and Path(str(info.get("tasks"))).is_file():
        return Path(str(info["tasks"]))
    if (run_dir / layout.INPUT_COPY).is_file():
        return run_dir / layout.INPUT_COPY
    suffix = layout.RUN_DIR_SUFFIX
    if run_dir.name.endswith(suffix) and (run_dir.parent / (run_dir.name[: -len(suffix)] + ".jsonl")).is_file():
        return run_dir.parent / (run_dir.name[: -len(suffix)] + ".jsonl")
    raise ValueError(f"{run_dir}: cannot find the run's task file (the judge reads each task's prompt): "
                     "pass --tasks PATH")


class TaskIndex:
    """The task file's lines by id, through an ``IdSet`` of offsets (no line kept)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ids = IdSet()
        self._f = open(path, "rb")  # noqa: SIM115 - closed in close()
        try:
            reader = TaskReader(path, MAX_LINE, ids=self.ids, log_ids=False)
        except OSError as e:
            raise ValueError(f"{path}: {e.strerror}") from None
        with reader:
            while True:
                try:
                    if reader.next() is None:
                        break
                except TaskError:
                    continue  # an invalid line (or a duplicate id) has no answer to grade

    def _id_at(self, offset: int) -> str | None:
        self._f.seek(offset)
        try:
            obj = orjson.loads(self._f.readline())
        except orjson.JSONDecodeError:
            return None
        return task_id_of(obj) if isinstance(obj, dict) else None

    def request(self, task_id: str) -> dict[str, Any] | None:
        """The task's request as the judge reads it (a batch line's body, else the simple line), or None."""
        at = self.ids.find(task_id, self._id_at)
        if at is None:
            return None
        obj = orjson.loads(read_line_at(self.path, at, MAX_LINE))
        body = obj.get("body")
        return body if isinstance(body, dict) else obj

    def close(self) -> None:
        self._f.close()


@dataclass
class Rescored:
    line: bytes
    scored: Scored | None
    judged: Verdict | None
    need: Need | None = None  # its reservation under a cap


def _asks_judge(line: bytes) -> bool:
    """Whether this record's scoring asks the judge (an answer, and an ``expected`` to grade it against)."""
    rec = orjson.loads(line)
    expected = (rec.get("metadata") or {}).get("expected")
    return rec.get("error") is None and bool(rec.get("response")) and expected is not None and expected != []


def _records(path: Path) -> Iterator[bytes]:
    try:
        for _n, line, _rec in iter_records(path, once=True):  # a second record for an id: refused too
            yield line
    except RunDirDamaged as e:
        raise ValueError(str(e)) from None


async def _one(line: bytes, scorers: list[tuple[str, ScoreFn]], judge: Judge, tasks: TaskIndex,
               key: int, need: Need | None = None) -> Rescored:
    rec = orjson.loads(line)
    for k in ("scores", "score_errors", "score_detail"):
        rec.pop(k, None)
    scored: Scored | None = None
    verdict: Verdict | None = None
    if rec.get("error") is None and rec.get("response"):
        metadata = rec.get("metadata") or {}
        task = {"id": rec["custom_id"], **metadata}
        body = rec["response"].get("body")
        scored = score_sync(scorers, task, body)
        expected = metadata.get("expected")
        request = tasks.request(str(rec["custom_id"]))
        if expected is None or expected == []:
            scored.unscored.append(JUDGE)
        elif request is None:
            scored.fail(JUDGE, f"the task {rec['custom_id']!r} is not in {tasks.path}: its prompt is unknown")
        else:
            verdict = await judge.judge(str(rec["custom_id"]), request, response_text(body), expected, key)
            if verdict.score is None:
                scored.fail(JUDGE, verdict.error or "no grade")
            else:
                scored.scores[JUDGE] = verdict.score
            if verdict.reply is not None:
                scored.detail[JUDGE] = verdict.detail()
        rec["scores"] = scored.scores
        # the judge's key and URL secrets out, wherever an error quoted them (issue 39)
        if scored.errors:
            rec["score_errors"] = judge.scrub.json(scored.errors)
        if scored.detail:
            rec["score_detail"] = judge.scrub.json(scored.detail)
    return Rescored(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE), scored, verdict, need)


async def check_judge(settings: JudgeSettings, session: aiohttp.ClientSession) -> None:
    """The judge before any answer is judged, as `evalsup run` checks it (GET /v1/models with the judge's key):
    reachable, its key taken, its model served. Raises JudgeStopped with one line."""
    base = public_url(settings.url)
    headers = request_headers(settings.url, build_headers(()), settings.key, settings.key_source)
    try:
        async with session.get(join_url(credentials(settings.url)[0], "/v1/models"), headers=headers,
                               timeout=aiohttp.ClientTimeout(total=30, sock_connect=10)) as r:
            status, data = r.status, await r.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        why = type(e).__name__ if isinstance(e, TimeoutError) else (getattr(e, "strerror", None) or type(e).__name__)
        raise JudgeStopped(f"cannot reach the judge {base}: {why} (is --judge-base-url right?)") from None
    problem = judge_check_problem(base, status, served_models(status, data), settings.model, settings.key_source)
    if problem is not None:
        raise JudgeStopped(problem)


async def _run(src: Path, dest: Path, scorers: list[tuple[str, ScoreFn]], settings: JudgeSettings,
               tasks: TaskIndex, stats: ScoreStats, usage: dict[str, int], insecure: bool,
               keep: int = 0, check: bool = True, caps: JudgeCaps | None = None) -> None:
    """Score ``src``'s records into ``dest`` (appended: its first ``keep`` lines are the first ``keep`` records',
    kept from a killed rescoring, and are not judged again)."""
    fatal: list[str] = []
    stop = asyncio.Event()

    def told(message: str) -> None:  # the judge cannot be used: stop at once, in one line
        fatal.append(message)
        stop.set()

    timeout = aiohttp.ClientTimeout(total=600, sock_connect=10, sock_read=120)
    connector = aiohttp.TCPConnector(limit=settings.concurrency, ssl=not insecure)
    # on a terminal only: the records scored this time (the kept ones are said when the run starts)
    progress = TtyProgress("records scored" + (f" after the {keep:,} kept" if keep else ""))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if check:
            await check_judge(settings, session)
        judge = Judge(settings, session, told)
        pending: deque[asyncio.Task[Rescored]] = deque()

        def done(r: Rescored) -> None:
            w.write(r.line)  # unbuffered: one write, in the OS at once (a kill -9 keeps it)
            if r.scored is not None:
                stats.add(r.scored.scores, r.scored.unscored)
            if r.judged is not None:
                usage["requests"] += 1
                usage["prompt"] += r.judged.prompt_tokens
                usage["completion"] += r.judged.completion_tokens
            if caps is not None and r.need is not None:
                caps.settle(r.need, *((r.judged.prompt_tokens, r.judged.completion_tokens) if r.judged else (0, 0)))
            progress.tick()

        async def first() -> Rescored:
            """The oldest record's result, or JudgeStopped as soon as the judge cannot be used."""
            head = pending[0]
            waiter = asyncio.create_task(stop.wait())
            await asyncio.wait([head, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not head.done():
                raise JudgeStopped(fatal[0])
            pending.popleft()
            return head.result()

        try:
            with open(dest, "ab", buffering=0) as w:
                template = len(settings.template.text.encode())
                for key, line in enumerate(_records(src)):
                    if key < keep:
                        continue
                    need = None
                    if caps is not None and _asks_judge(line):  # the cap holds for every request out
                        need = caps.need(len(line), template)
                        while not caps.affords(need):
                            if not pending:
                                raise CapReached(f"the cap is reached after {key:,} records ({caps.said()} spent): "
                                                 "what was scored is kept; rerun with a higher --max-cost / "
                                                 "--max-total-tokens to go on")
                            done(await first())
                        caps.reserve(need)
                    pending.append(asyncio.create_task(_one(line, scorers, judge, tasks, key, need)))
                    while len(pending) >= 2 * settings.concurrency:
                        done(await first())
                    if fatal:
                        raise JudgeStopped(fatal[0])
                while pending:
                    done(await first())
        finally:
            progress.close()
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            judge.close()


def _identity(scorers: list[tuple[str, ScoreFn]], settings: JudgeSettings) -> dict[str, Any]:
    """What a partial rescoring was scored with: the same again, its lines are kept; else it starts over."""
    t = settings.template
    return {"scorers": [name for name, _ in scorers], "judge": public_url(settings.url), "model": settings.model,
            "template": hashlib.sha256(repr(t).encode()).hexdigest()[:16], "max_tokens": settings.max_tokens}


def _kept(src: Path, partial: Path, stats: ScoreStats, usage: dict[str, int]) -> int:
    """The complete lines of a killed rescoring that are, in order, the same tasks as results.jsonl's first
    records: counted into ``stats``/``usage``; the rest of the partial file (a torn line, or lines of records
    that changed) cut off. Returns how many were kept."""
    kept = 0
    good = 0  # the partial file's byte offset after the last line kept
    with open(partial, "rb") as f:
        records = _records(src)
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # torn by the kill: judged again
            try:
                rec = orjson.loads(raw)
                same = orjson.loads(next(records)).get("custom_id") == rec.get("custom_id")
            except (orjson.JSONDecodeError, StopIteration, AttributeError):
                break
            if not same:
                break
            scores = rec.get("scores")
            if isinstance(scores, dict):
                stats.add({str(k): (float(v) if isinstance(v, int | float) else None) for k, v in scores.items()})
            jd = (rec.get("score_detail") or {}).get(JUDGE)
            u = jd.get("usage") if isinstance(jd, dict) else None
            if isinstance(jd, dict):
                usage["requests"] += 1
                if isinstance(u, dict):
                    usage["prompt"] += int(u.get("prompt_tokens") or 0)
                    usage["completion"] += int(u.get("completion_tokens") or 0)
            kept += 1
            good += len(raw)
    with open(partial, "r+b") as f:
        f.truncate(good)
    return kept


def rescore_judge(run_dir: Path, scorers: list[tuple[str, ScoreFn]], settings: JudgeSettings,
                  output: Path | None, tasks: Path | None = None,
                  insecure: bool = False, caps: JudgeCaps | None = None,
                  check: bool = True) -> tuple[dict[str, Any], dict[str, int]]:
    """Score ``run_dir``'s records with ``scorers`` and the judge; results.scored.jsonl (or ``output``) and
    scores.json written (the judge's tokens in it under ``judge_usage``). The scores' summary and the judge's
    tokens (prompt, completion, requests)."""
    src = run_dir / layout.RESULTS
    if not src.exists():
        raise ValueError(f"{run_dir}: no results.jsonl")
    index = TaskIndex(task_file(run_dir, tasks))
    dest = output or run_dir / layout.SCORED
    tmp = dest.with_name(dest.name + ".partial")
    marker = dest.with_name(dest.name + ".partial.json")
    stats = ScoreStats()
    usage = {"prompt": 0, "completion": 0, "requests": 0}
    ident = _identity(scorers, settings)
    keep = 0
    try:
        if tmp.exists() and marker.exists() and orjson.loads(marker.read_bytes()) == ident:
            keep = _kept(src, tmp, stats, usage)
            if caps is not None:  # what the kept records cost counts under the caps
                caps.settle(None, usage["prompt"], usage["completion"])
            if keep:
                print(f"resuming: {keep:,} records scored before are kept ({usage['requests']:,} judged), "
                      "not judged again", file=sys.stderr)
        else:
            if tmp.exists():
                print(f"{tmp.name}: scored with other settings; starting over", file=sys.stderr)
            tmp.write_bytes(b"")
            marker.write_bytes(orjson.dumps(ident))
        asyncio.run(_run(src, tmp, scorers, settings, index, stats, usage, insecure, keep, check, caps))
    except JudgeStopped as e:
        raise ValueError(str(e)) from None  # what was scored stays, for the rerun
    except orjson.JSONDecodeError:
        raise ValueError(f"{marker}: damaged; delete it and {tmp.name} to score again from the start") from None
    finally:
        index.close()
    os.replace(tmp, dest)
    marker.unlink(missing_ok=True)
    summary: dict[str, Any] = stats.summary()
    (run_dir / layout.SCORES).write_bytes(orjson.dumps({**summary, "judge_usage": usage},
                                                       option=orjson.OPT_INDENT_2))
    return summary, usage


def judge_for_score(scorers: tuple[str, ...], strip: bool, ignore_case: bool, pattern: str | None, normalize: bool,
                    url: str | None, model: str | None, key_env: str | None, template: Path | None,
                    concurrency: int, max_tokens: int | None,
                    timeout: float) -> tuple[JudgeSettings, list[tuple[str, ScoreFn]]]:
    """`evalsup score --scorer judge`: the judge's settings (checked as `evalsup run` checks them: a bad
    template or URL refused in one line before any request) and the other scorers, loaded."""
    if not url:
        raise ValueError("--scorer judge needs the judge's endpoint: --judge-base-url http://HOST:PORT/v1")
    url = url.strip().rstrip("/")
    problem = url_problem(url)
    if problem is not None:
        raise ValueError(f"--judge-base-url {problem}")
    if not model:
        raise ValueError("--scorer judge needs the judge's model: --judge-model MODEL")
    if key_env and not os.environ.get(key_env):
        raise ValueError(f"--judge-api-key-env {key_env}: the variable is not set (it holds the judge's API key)")
    try:
        tmpl = load_template(template)
    except TemplateError as e:
        raise ValueError(str(e)) from None
    options = ScorerOptions(strip, ignore_case, pattern, normalize)
    others = [load_scorer(s, options) for s in scorers if s != JUDGE]
    settings = JudgeSettings(url, model, tmpl, api_key(key_env, None), key_source(key_env, None), concurrency,
                             timeout, max_tokens)
    return settings, others
