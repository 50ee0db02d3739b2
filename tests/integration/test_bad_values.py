"""A user's absurd number or broken scorer file is one line and exit 2 before any request (issue 39 item 7):
`--max-total-tokens 1e30` and `--scorer file.py:fn` with a syntax error were exit 1 with a traceback (`run`
after the endpoint check and the estimate, `score` at once)."""

from __future__ import annotations

from pathlib import Path

from evalsup.mock.server import MockThread
from tests.harness import assert_clean_exit, finished_run, run_args, run_cli, write_tasks


def test_an_absurd_token_cap_is_one_line_and_nothing_is_sent(tmp_path: Path, mock: MockThread) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 5)
    r = run_cli(*run_args(mock, tasks, "--max-total-tokens", "1e30"))
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        "evalsup: --max-total-tokens must be at most 9,223,372,036,854,775,807 tokens (a 64-bit integer: "
        "run.json, the checkpoint and the cache keep it as one), got '1e30'"]), r.stderr
    assert_clean_exit(r)
    r = run_cli(*run_args(mock, tasks, "--connect-timeout", "1e300"))
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        "evalsup: --connect-timeout must be from 0 to 31,536,000 seconds (a year: no wait or timeout of a run is "
        "longer), got 1e+300"]), r.stderr
    assert mock.stats()["requests"] == 0 and not (tmp_path / "t.run").exists()


def test_a_scorer_file_with_a_syntax_error_is_named_at_its_line(tmp_path: Path, mock: MockThread) -> None:
    bad = tmp_path / "my_scorer.py"
    bad.write_text("def fn(task, response):\n    return response['choices'][0] ==\n")
    said = f"evalsup: {bad}:2: SyntaxError: invalid syntax (\"return response['choices'][0] ==\") ({bad}:fn)"
    tasks = write_tasks(tmp_path / "t.jsonl", 5)
    r = run_cli(*run_args(mock, tasks, "--scorer", f"{bad}:fn"))
    assert (r.returncode, r.stderr.splitlines()) == (2, [said]), r.stderr
    assert_clean_exit(r)
    assert mock.stats()["requests"] == 0  # refused before the endpoint check
    _tasks, run_dir, _args = finished_run(tmp_path, mock, 5)
    r = run_cli("score", str(run_dir), "--scorer", f"{bad}:fn")
    assert (r.returncode, r.stderr.splitlines()) == (2, [said]), r.stderr
    assert_clean_exit(r)
