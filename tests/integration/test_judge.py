"""The model-graded scorer (issue 29 item 5) over real HTTP: answers from one mock, the judge on a second one
that grades by a rule the test knows (evalsup.mock.judge: the answer equal to the reference is GRADE: C), and
`evalsup score --scorer judge` on the finished run, which asks the judge again and the answer endpoint never."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, chat_requests, complete_lines, lines, read_results, run_cli, summary, wait_until

ANSWERS = ["Paris", "London", "Paris", "[no grade]", "paris"]  # by task index, in turn


@pytest.fixture
def judge() -> Iterator[MockThread]:
    m = MockThread(MockConfig(latency_ms=2, seed=7, judge=True, models=("judge-model",))).start()
    try:
        yield m
    finally:
        m.stop()


def _tasks(path: Path, n: int) -> Path:
    rows: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"id": f"t{i}", "messages": [{"role": "user", "content": f"Capital of France ({i})?"}],
                               "mock": {"text": ANSWERS[i % len(ANSWERS)]}}
        if i % 10 != 9:  # every tenth task has no reference: unscored by the judge, never asked about
            row["expected"] = "Paris"
        rows.append(row)
    return lines(path, rows)


def _want(i: int) -> float | None:
    """The judge's score by the mock's rule; None: no grade in its reply (a scorer error)."""
    answer = ANSWERS[i % len(ANSWERS)]
    return None if answer == "[no grade]" else float(answer == "Paris")


def test_a_run_with_a_judge_then_score_again_without_the_model(tmp_path: Path, mock: MockThread,
                                                                judge: MockThread) -> None:
    n = 40
    tasks = _tasks(tmp_path / "tasks.jsonl", n)
    judge_args = ("--scorer", "judge", "--judge-base-url", judge.url, "--judge-model", "judge-model")
    r = run_cli("run", "-w", "2", "-c", "8", "--model", "mock-model", "--base-url", mock.url, *judge_args,
                "--scorer", "exact_match", str(tasks))
    assert r.returncode == 0, r.stderr
    assert "judge tokens" in r.stdout
    run_dir = tmp_path / "tasks.run"
    recs = {rec["custom_id"]: rec for rec in read_results(run_dir)}
    assert len(recs) == n and all(rec["error"] is None for rec in recs.values())
    asked = [i for i in range(n) if i % 10 != 9]
    judge_tokens = [0, 0]
    for i in range(n):
        rec = recs[f"t{i}"]
        if i not in asked:
            assert "judge" not in rec["scores"] and "score_detail" not in rec  # unscored: not an error
            continue
        detail = rec["score_detail"]["judge"]
        assert "GRADE" in detail["reply"] or _want(i) is None  # the judge's raw reply, kept
        judge_tokens[0] += detail["usage"]["prompt_tokens"]
        judge_tokens[1] += detail["usage"]["completion_tokens"]
        if _want(i) is None:
            assert rec["scores"]["judge"] is None and "no grade" in rec["score_errors"]["judge"]
        else:
            assert rec["scores"]["judge"] == _want(i), (i, detail)
    s = summary(run_dir)
    graded = [_want(i) for i in asked if _want(i) is not None]
    sj = s["scores"]["judge"]
    assert (sj["count"], sj["unscored"], sj["errors"]) == (len(graded), n - len(asked), len(asked) - len(graded))
    assert sj["accuracy"] == pytest.approx(sum(graded) / len(graded), abs=1e-6)
    # the judge's tokens apart: its own figure, and the answers' tokens are the answers' usage alone
    assert s["judge_usage"] == {"prompt": judge_tokens[0], "completion": judge_tokens[1], "requests": len(asked)}
    assert s["tokens"]["prompt"] == sum(rec["response"]["body"]["usage"]["prompt_tokens"] for rec in recs.values())
    assert judge.stats()["by_path"]["/v1/chat/completions"] == len(asked)
    run_json = orjson.loads((run_dir / "run.json").read_bytes())["settings"]
    assert run_json["judge_model"] == "judge-model" and run_json["judge_base_url"] == judge.url

    answered = chat_requests(mock)
    judge.configure(fail_500=0.1)  # the judge fails now and then: its retries (the workers' client) mend it
    r = run_cli("score", str(run_dir), *judge_args, "--judge-concurrency", "8")
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == answered  # not one request to the answer endpoint
    assert judge.stats()["by_path"]["/v1/chat/completions"] >= 2 * len(asked)  # every answer again (and retries)
    scored = {rec["custom_id"]: rec for rec in read_results_file(run_dir / "results.scored.jsonl")}
    assert {k: v["scores"].get("judge") for k, v in scored.items()} == {
        k: v["scores"].get("judge") for k, v in recs.items()}
    assert scored["t0"]["score_detail"]["judge"]["grade"] == "C"
    scores_json = orjson.loads((run_dir / "scores.json").read_bytes())
    assert scores_json["judge"]["count"] == len(graded) and scores_json["judge_usage"]["requests"] == len(asked)


def read_results_file(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_a_bad_template_is_refused_before_any_request(tmp_path: Path, mock: MockThread, judge: MockThread) -> None:
    tasks = _tasks(tmp_path / "tasks.jsonl", 3)
    bad = tmp_path / "judge.txt"
    bad.write_text("Grade {answer} against {reference}.\n")
    r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "--scorer", "judge", "--judge-base-url",
                judge.url, "--judge-template", str(bad), str(tasks))
    assert r.returncode == 2
    assert f"{bad}:1: unknown variable {{reference}}" in r.stderr and "Traceback" not in r.stderr
    assert sum(mock.stats()["by_path"].values()) == 0 and sum(judge.stats()["by_path"].values()) == 0


def test_without_workers_the_judge_gets_all_of_its_concurrency(tmp_path: Path, mock: MockThread) -> None:
    # the default (no --workers) starts one worker: it takes the whole --judge-concurrency, not a share of the
    # most workers the run may have
    with MockThread(MockConfig(latency_ms=100, seed=7, judge=True, models=("judge-model",))) as slow:
        r = run_cli("run", "--model", "mock-model", "--base-url", mock.url, "-c", "64", "--scorer", "judge",
                    "--judge-base-url", slow.url, "--judge-model", "judge-model", "--judge-concurrency", "16",
                    "--out", str(tmp_path / "r"), str(_tasks(tmp_path / "t.jsonl", 48)))
        assert r.returncode == 0, r.stderr
        assert slow.stats()["max_in_flight"] == 16


def test_score_with_a_judge_resumes_after_kill_9_and_checks_the_judge_first(tmp_path: Path, mock: MockThread) -> None:
    """Issue 43 item 4: `evalsup score --scorer judge` killed -9 part way, run again: every answer judged, none
    twice but those that were on the wire; the judge's tokens counted once. A judge that refuses connections:
    one line and exit 2 before anything is scored."""
    n = 120
    tasks = _tasks(tmp_path / "tasks.jsonl", n)
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tasks.run"
    asked = sum(1 for i in range(n) if i % 10 != 9)
    with MockThread(MockConfig(latency_ms=40, seed=7, judge=True, models=("judge-model",))) as slow:
        judge_args = ("--scorer", "judge", "--judge-base-url", slow.url, "--judge-model", "judge-model",
                      "--judge-concurrency", "2")
        p = Run(tmp_path, "score", str(run_dir), *judge_args)
        partial = run_dir / "results.scored.jsonl.partial"
        wait_until(lambda: partial.exists() and complete_lines(partial) >= 30, "30 records scored", proc=p)
        p.kill_group()
        p.wait()
        before = slow.stats()["by_path"]["/v1/chat/completions"]
        kept = complete_lines(partial)
        assert 30 <= kept < n
        r = run_cli("score", str(run_dir), *judge_args)
        assert r.returncode == 0, r.stderr
        assert f"{kept:,} records scored before are kept" in r.stderr
        total = slow.stats()["by_path"]["/v1/chat/completions"]
        # the kept records are not judged again: only those after them, and the few on the wire at the kill
        assert total - before <= asked - sum(1 for i in range(kept) if i % 10 != 9) + 2 * 2
        assert total >= asked
    scored = read_results_file(run_dir / "results.scored.jsonl")
    assert sorted(rec["custom_id"] for rec in scored) == sorted(f"t{i}" for i in range(n))
    assert not (run_dir / "results.scored.jsonl.partial").exists()
    s = orjson.loads((run_dir / "scores.json").read_bytes())
    assert s["judge_usage"]["requests"] == asked  # the kept records' judge tokens counted again, once
    assert s["judge"]["count"] + s["judge"]["errors"] == asked
    # the report shows the judge's scores beside the run's own (here: none in the run)
    r = run_cli("report", str(run_dir))
    assert r.returncode == 0, r.stderr
    page = (run_dir / "report.html").read_text()
    table = page[page.index('id="scores"'):]
    table = table[:table.index("</table>")]
    assert "evalsup score (the judge asked" in table and ">judge</td>" in table, table
    assert f"{s['judge']['accuracy']:.3f}" in table

    with MockThread(MockConfig(latency_ms=1, seed=7, judge=True, models=("judge-model",))) as gone:
        url = gone.url
    r = run_cli("score", str(run_dir), "--scorer", "judge", "--judge-base-url", url, "--judge-model", "judge-model")
    assert r.returncode == 2 and "cannot reach the judge" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_score_with_a_judge_holds_its_token_cap_and_goes_on_with_a_higher_one(tmp_path: Path,
                                                                             mock: MockThread) -> None:
    """Issue 43 item 4: the caps hold for `evalsup score`'s judge requests, counted at the judge's server; a stop is
    exit 75 with what was scored kept, and a rerun with a higher cap judges only the rest."""
    n = 60
    tasks = _tasks(tmp_path / "tasks.jsonl", n)
    r = run_cli("run", "-w", "2", "--model", "mock-model", "--base-url", mock.url, str(tasks))
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "tasks.run"
    asked = sum(1 for i in range(n) if i % 10 != 9)
    with MockThread(MockConfig(latency_ms=5, seed=7, judge=True, models=("judge-model",))) as judge:
        args = ("score", str(run_dir), "--scorer", "judge", "--judge-base-url", judge.url, "--judge-model",
                "judge-model", "--judge-max-tokens", "16", "--judge-concurrency", "4")
        cap = 3000
        r = run_cli(*args, "--max-total-tokens", str(cap))
        assert r.returncode == 75, r.stderr
        assert "the cap is reached" in r.stderr and "Traceback" not in r.stderr
        partial = run_dir / "results.scored.jsonl.partial"
        kept = [orjson.loads(x) for x in partial.read_bytes().splitlines()]
        spent = sum(sum(rec["score_detail"]["judge"]["usage"].values()) for rec in kept
                    if "judge" in rec.get("score_detail", {}))
        sent = judge.stats()["by_path"]["/v1/chat/completions"]
        judged = sum(1 for rec in kept if "judge" in rec.get("score_detail", {}))
        assert 0 < judged < asked and sent == judged  # no judge request went out uncounted
        assert spent <= cap
        r = run_cli(*args, "--max-total-tokens", str(100 * cap))
        assert r.returncode == 0, r.stderr
        assert judge.stats()["by_path"]["/v1/chat/completions"] == asked  # none judged twice
    s = orjson.loads((run_dir / "scores.json").read_bytes())
    assert s["judge_usage"]["requests"] == asked

    r = run_cli("score", str(run_dir), "--scorer", "judge", "--judge-base-url", "http://127.0.0.1:9/v1",
                "--judge-model", "judge-model", "--max-cost", "1")
    assert r.returncode == 2 and "no price for the judge's model" in r.stderr
