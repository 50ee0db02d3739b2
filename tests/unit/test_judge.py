"""The model-graded scorer's pure half (issue 29 item 5): the template (its variables, its head block, the one
line that refuses a bad one), the grade in a judge's reply, the variables taken from a task's request, the
mock's grading rule, and the settings that refuse a judge run before any request."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from evalsup.config.run_config import ConfigError, build_config
from evalsup.mock.judge import judge_reply
from evalsup.scoring.judge import (
    TemplateError,
    load_template,
    messages_of,
    parse_template,
    prompt_of,
    variables,
    verdict_of,
)

URL = "http://127.0.0.1:9/v1"
DEFAULT = load_template(None)

# a judge's reply -> the score the default template gives it (None: a scorer error, the reply kept)
REPLIES: list[tuple[str, float | None]] = [
    ("GRADE: C", 1.0),
    ("GRADE: I", 0.0),
    ("grade: i", 0.0),
    ("grade:c", 1.0),
    ("Grade : C", 1.0),
    ("The answer matches.\nGRADE: C", 1.0),
    ("GRADE: C\n\nThe answer is right, as the reference says.", 1.0),  # trailing text
    ("GRADE: I.", 0.0),
    ("**GRADE: C**", 1.0),
    ("GRADE: **C**", 1.0),
    ("GRADE: 'I'", 0.0),
    ("At first I thought GRADE: C, but on a closer look the units differ.\nGRADE: I", 0.0),  # two: the last
    ("GRADE: I ... no, it is right after all. GRADE: C", 1.0),
    ("The answer is correct.", None),  # no grade
    ("", None),
    ("GRADE: Correct", None),  # a word, not the letter
    ("GRADE: P", None),  # the default template grades C or I only
    ("GRADE: X", None),
    ("GRADED: C", None),
    ("C", None),
]


@pytest.mark.parametrize(("reply", "score"), REPLIES)
def test_the_grade_of_a_reply_is_the_last_the_pattern_finds(reply: str, score: float | None) -> None:
    v = verdict_of(DEFAULT, reply, {"prompt_tokens": 10, "completion_tokens": 3})
    assert v.score == score
    assert v.reply == reply and (v.prompt_tokens, v.completion_tokens) == (10, 3)
    assert (v.error is None) == (score is not None)
    assert v.detail()["reply"] == reply


def test_no_answer_from_the_judge_is_an_error_without_a_reply() -> None:
    v = verdict_of(DEFAULT, None, error="the judge's request failed: http_500: boom")
    assert v.score is None and v.reply is None and "http_500" in (v.error or "")


def test_a_template_states_its_pattern_and_grades() -> None:
    t = parse_template("---\npattern: SCORE\\s*=\\s*(\\d+(?:\\.\\d+)?)\ngrades: number\n---\n{answer} vs {expected}")
    assert t.grade("SCORE = 3 then SCORE=7.5")[0] == 7.5
    assert t.grade("no score")[0] is None
    t = parse_template("---\n# partial credit\npattern: VERDICT: (yes|partly|no)\ngrades: yes=1, partly=0.5, no=0\n"
                       "---\n{answer}")
    assert [t.grade(r)[0] for r in ("VERDICT: yes", "verdict: Partly", "VERDICT: no", "VERDICT: maybe")] == [
        1.0, 0.5, 0.0, None]
    t = parse_template("Plain: {answer}")  # no head block: the default pattern and grades, P included
    assert [t.grade(r)[0] for r in ("GRADE: C", "GRADE: P", "GRADE: I")] == [1.0, 0.5, 0.0]


def test_rendering_fills_every_variable_and_keeps_doubled_braces() -> None:
    t = parse_template('Q: {prompt}\nA: {answer}\nRef: {expected}\nid {id}\n{{"grade": "C"}}\n{messages}')
    req = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]}
    out = t.render(variables("t1", req, "4", "4"))
    assert out == 'Q: 2+2?\nA: 4\nRef: 4\nid t1\n{"grade": "C"}\nsystem: Be brief.\n\nuser: 2+2?'
    default = DEFAULT.render(variables("t1", req, "four", ["4", "four"]))
    assert "<answer>\nfour\n</answer>" in default and "- 4\n- four" in default and "GRADE: C" in default
    assert "{" not in default


def test_the_prompt_of_every_route() -> None:
    assert prompt_of({"prompt": "complete me"}) == "complete me"
    assert prompt_of({"input": "a responses input"}) == "a responses input"
    chat = {"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
                         {"role": "user", "content": [{"type": "text", "text": "second"}]}]}
    assert prompt_of(chat) == "second"
    assert messages_of(chat) == "user: first\n\nassistant: x\n\nuser: second"
    assert prompt_of({"input": [{"role": "user", "content": "via input"}]}) == "via input"
    assert messages_of({"prompt": "p"}) == "p"


BAD = [
    ("Grade {answer} against {reference}", "t.txt:1: unknown variable {reference}"),
    ("line one\n{answer}\n{ json: 1 }", "t.txt:3: unknown variable { json: 1 }"),
    ("{answer} }", "t.txt:1: a lone '}'"),
    ("no variable at all", "t.txt: no variable"),
    ("---\npattern: GRADE: (C\n---\n{answer}", "t.txt: pattern 'GRADE: (C' is not a regular expression"),
    ("---\npattern: GRADE: C\n---\n{answer}", "has no group"),
    ("---\nscale: 10\n---\n{answer}", "t.txt:2: expected 'pattern: REGEX'"),
    ("---\ngrades: C=one\n---\n{answer}", "grades 'C=one'"),
    ("---\npattern: (C)\n{answer}", "t.txt:1: the head block opened by --- is not closed"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_template_is_refused_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TemplateError) as e:
        parse_template(text, "t.txt")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_settings_refuse_a_judge_run_before_any_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = tmp_path / "t.jsonl"
    base = {"base_url": [URL], "model": "m", "scorers": ("judge",)}

    def refused(**given: object) -> str:
        with pytest.raises(ConfigError) as e:
            build_config(tasks, {**base, **given})
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "--judge-base-url" in refused()
    assert "no such file" in refused(judge_base_url=URL, judge_template=str(tmp_path / "missing.txt"))
    (tmp_path / "bad.txt").write_text("Is {answr} right?\n")
    assert refused(judge_base_url=URL, judge_template=str(tmp_path / "bad.txt")).startswith(
        f"{tmp_path / 'bad.txt'}:1: unknown variable {{answr}}")
    monkeypatch.delenv("JUDGE_KEY_FOR_TEST", raising=False)
    assert "JUDGE_KEY_FOR_TEST" in refused(judge_base_url=URL, judge_api_key_env="JUDGE_KEY_FOR_TEST")
    assert "--judge-model" in refused(judge_base_url=URL, model=None)
    with pytest.raises(ConfigError, match="--judge-model needs --scorer judge"):
        build_config(tasks, {"base_url": [URL], "judge_model": "j"})
    monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "sk-judge-secret")
    cfg = build_config(tasks, {**base, "judge_base_url": URL + "/", "judge_api_key_env": "JUDGE_KEY_FOR_TEST",
                               "judge_concurrency": 10, "workers": 4})
    w = cfg.worker
    assert (w.judge_base_url, w.judge_model, w.judge_concurrency) == (URL, "m", 10)  # the run's
    assert cfg.judge_share(4) == [3, 3, 2, 2] and cfg.judge_share(1) == [10]  # among the workers running
    auto = build_config(tasks, {**base, "judge_base_url": URL, "judge_concurrency": 16})  # autoscale: one at first
    assert auto.autoscale and auto.judge_share(auto.first_workers) == [16]
    assert build_config(tasks, {**base, "judge_base_url": URL, "judge_concurrency": 2}).judge_share(4) == [1, 1, 1, 1]
    assert "sk-judge-secret" not in repr(w.to_wire())  # the variable's name travels, never the key


MOCK = [
    ("Paris", "Paris", "GRADE: C"),
    (" Paris\n", "Paris", "GRADE: C"),
    ("London", "Paris", "GRADE: I"),
    ("paris", "Paris", "GRADE: I"),
]


@pytest.mark.parametrize(("answer", "reference", "grade"), MOCK)
def test_the_mock_grades_by_its_rule(answer: str, reference: str, grade: str) -> None:
    body = {"model": "j", "messages": [{"role": "user", "content": DEFAULT.render(
        variables("t", {"prompt": "capital?"}, answer, reference))}]}
    reply = judge_reply(body)
    assert reply is not None and reply.endswith(grade)
    assert verdict_of(DEFAULT, reply).score == (1.0 if grade == "GRADE: C" else 0.0)


def test_the_mock_gives_no_grade_when_told_and_ignores_other_requests() -> None:
    body = {"messages": [{"role": "user", "content": DEFAULT.render(
        variables("t", {"prompt": "q"}, "[no grade]", "x"))}]}
    reply = judge_reply(body)
    assert reply is not None and verdict_of(DEFAULT, reply).score is None
    assert judge_reply({"messages": [{"role": "user", "content": "hello"}]}) is None


def test_a_resume_keeps_the_judge_and_an_edited_template_is_a_change(tmp_path: Path) -> None:
    from evalsup.rundir.run_json import differences, guard, read_run_json, request_settings, resume_config

    tasks = tmp_path / "t.jsonl"
    template = tmp_path / "judge.txt"
    template.write_text("Is {answer} the same as {expected}? GRADE: C or GRADE: I\n")
    given = {"base_url": [URL], "model": "m", "scorers": ("judge",), "judge_base_url": URL,
             "judge_model": "j", "judge_template": str(template)}
    cfg, _ = resume_config(tasks, given)
    cfg.run_dir.mkdir()
    guard(cfg.run_dir, request_settings(cfg), resuming=False, accept=False)
    recorded = (read_run_json(cfg.run_dir) or {})["settings"]
    assert recorded["judge_template"] == str(template) and len(recorded["judge_template_sha256"]) == 64
    again, line = resume_config(tasks, {"base_url": [URL]})  # every judge flag left out: the run's
    assert again.worker.judge_model == "j" and again.worker.judge_template == template.read_text()
    assert line is not None and "judge_model='j'" in line
    template.write_text("Is {answer} right, given {expected}? GRADE: C or GRADE: I\n")
    edited, _ = resume_config(tasks, {"base_url": [URL]})
    assert [d.split(" ")[0] for d in differences(recorded, request_settings(edited))] == ["judge_template_sha256"]


def test_the_api_takes_a_judge_settings_object() -> None:
    from evalsup.api.options import Judge, with_judge
    from evalsup.config.options import argv_of as _argv

    opts = with_judge({"scorers": ["exact_match"], "judge": Judge(URL, "j", api_key_env="JK", concurrency=4)})
    assert opts["scorers"] == ["exact_match", "judge"]
    assert _argv(opts) == ["--scorer", "exact_match", "--scorer", "judge", "--judge-base-url", URL,
                           "--judge-model", "j", "--judge-api-key-env", "JK", "--judge-concurrency", "4"]
    assert with_judge({"judge": {"base_url": URL}})["scorers"] == ["judge"]
    with pytest.raises(TypeError, match="both judge= and judge_model"):
        with_judge({"judge": Judge(URL, "j"), "judge_model": "k"})


def test_a_resume_without_the_judge_scorer_leaves_its_recorded_settings(tmp_path: Path) -> None:
    from evalsup.rundir.run_json import guard, request_settings, resume_config

    tasks = tmp_path / "t.jsonl"
    cfg, _ = resume_config(tasks, {"base_url": [URL], "model": "m", "scorers": ("judge",), "judge_base_url": URL})
    cfg.run_dir.mkdir()
    guard(cfg.run_dir, request_settings(cfg), resuming=False, accept=False)
    other, _ = resume_config(tasks, {"base_url": [URL], "scorers": ("exact_match",)})
    assert other.worker.judge_base_url is None and "judge_model" not in request_settings(other)


def test_the_judges_limit_follows_the_share_the_supervisor_sends() -> None:
    import asyncio

    from evalsup.ipc import FrameKind
    from evalsup.worker.control import Control
    from evalsup.worker.judge import Slots

    slots = Slots(4)
    seen: list[int] = []
    # LIMIT carries the worker's share of --judge-concurrency as workers are added
    control = Control(SimpleNamespace(set_limit=seen.append), None, None, None, lambda e: None,  # type: ignore[arg-type]
                      lambda: None, lambda: "", judge_limit=slots.resize)
    control.on_frame(FrameKind.LIMIT, memoryview(b'{"inflight": 8, "judge": 2}'))
    control.on_frame(FrameKind.LIMIT, memoryview(b'{"inflight": 6}'))
    assert seen == [8, 6] and slots.limit == 2

    async def go() -> list[int]:
        most, now = [0], [0]

        async def one() -> None:
            async with slots:
                now[0] += 1
                most[0] = max(most[0], now[0])
                await asyncio.sleep(0.01)
                now[0] -= 1

        first = [asyncio.create_task(one()) for _ in range(6)]
        await asyncio.sleep(0)
        slots.resize(3)  # a larger share: the waiting ones go at once
        await asyncio.gather(*first)
        held = most[0]
        most[0] = 0
        slots.resize(1)
        await asyncio.gather(*(one() for _ in range(3)))
        return [held, most[0], slots.busy]

    assert asyncio.run(go()) == [3, 1, 0]


def test_the_judges_check_says_a_refused_key_or_an_unserved_model_in_one_line() -> None:
    from evalsup.scoring.judge import judge_check_problem

    base = "http://127.0.0.1:9/v1"
    said = judge_check_problem(base, 401, [], "judge-model", "the judge's API key ($JK)", "invalid key")
    assert said is not None and "refused its API key" in said and "$JK" in said and "HTTP 401: invalid key" in said
    said = judge_check_problem(base, 200, ["a", "b"], "judge-model", "$K")
    assert said is not None and "'judge-model' is not served" in said and "it serves: a, b" in said
    assert judge_check_problem(base, 200, ["judge-model"], "judge-model", "$K") is None
    assert judge_check_problem(base, 404, [], "judge-model", "$K") is None  # no list: the requests will say
