"""--batch-provider anthropic, the pure parts (issue 31 item 4): the request translation table, what it
refuses, the custom_id, Anthropic's batch states in the planner's words, a result line read, which of the
account's batches may be a chunk's, and a Message's text and usage where the scorers and counters read them."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from evalsup.batch.anthropic import anthropic_headers
from evalsup.batch.anthropic_shapes import (
    Ambiguous,
    as_batch,
    candidates,
    choose_running,
    parse_result,
    status_of,
    unix,
)
from evalsup.batch.plan import Act, Verdict, on_line, on_status
from evalsup.batch.records import build
from evalsup.config.run_config import ConfigError, batch_provider, build_config
from evalsup.scoring.scorers import response_text
from evalsup.tasks.anthropic import Untranslatable, custom_id, task_params, to_params
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.routes import answer_text

U = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(("body", "params"), [
    ({"model": "c", "messages": [U], "max_tokens": 5}, {"model": "c", "max_tokens": 5, "messages": [U]}),
    ({"model": "c", "messages": [{"role": "system", "content": "S"}, U], "max_completion_tokens": 5},
     {"model": "c", "max_tokens": 5, "system": "S", "messages": [U]}),
    ({"model": "c", "messages": [{"role": "system", "content": "A"}, {"role": "developer", "content": [
        {"type": "text", "text": "B"}]}, U], "max_tokens": 5},
     {"model": "c", "max_tokens": 5, "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
      "messages": [U]}),
    ({"model": "c", "messages": [U], "max_tokens": 5, "temperature": 0.2, "top_p": 0.9, "stop": "END",
      "user": "u1", "n": 1, "stream": True, "stream_options": {}, "top_k": 3},
     {"model": "c", "max_tokens": 5, "messages": [U], "temperature": 0.2, "top_p": 0.9, "stop_sequences": ["END"],
      "metadata": {"user_id": "u1"}, "top_k": 3}),
    ({"model": "c", "messages": [U], "max_tokens": 5, "stop": ["a", "b"]},
     {"model": "c", "max_tokens": 5, "messages": [U], "stop_sequences": ["a", "b"]}),
    ({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
     {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [
         {"type": "text", "text": "see"},
         {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}},
         {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}),
])
def test_the_translation_table(body: dict[str, Any], params: dict[str, Any]) -> None:
    got = to_params(body)
    assert got == params and next(iter(got)) == "model"


@pytest.mark.parametrize(("body", "says"), [
    ({"model": "c", "messages": [U]}, "no max_tokens"),
    ({"messages": [U], "max_tokens": 5}, "no model"),
    ({"model": "c", "messages": [U], "max_tokens": 5, "tools": []}, "'tools' has no Anthropic equivalent"),
    ({"model": "c", "messages": [U], "max_tokens": 5, "response_format": {}}, "'response_format'"),
    ({"model": "c", "messages": [U], "max_tokens": 5, "temperature": 1.5}, "outside Anthropic's range"),
    ({"model": "c", "messages": [U], "max_tokens": 5, "n": 2}, "n=2"),
    ({"model": "c", "messages": [U, {"role": "system", "content": "late"}], "max_tokens": 5}, "after the conv"),
    ({"model": "c", "messages": [{"role": "tool", "content": "x"}], "max_tokens": 5}, "role 'tool'"),
    ({"model": "c", "messages": [{"role": "user", "content": "x", "name": "n"}], "max_tokens": 5}, "'name'"),
    ({"model": "c", "messages": [{"role": "system", "content": "x"}], "max_tokens": 5}, "only system"),
    ({"model": "c", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}], "max_tokens": 5},
     "'input_audio'"),
])
def test_what_has_no_anthropic_form_is_refused_in_one_line(body: dict[str, Any], says: str) -> None:
    with pytest.raises(Untranslatable) as e:
        to_params(body)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_task_params_take_the_runs_defaults_and_only_chat_tasks() -> None:
    d = RequestDefaults("claude", 64, 0.5)
    params, meta = task_params({"id": "a", "prompt": "p", "expected": "B"}, d)
    assert params == {"model": "claude", "max_tokens": 64, "messages": [U | {"content": "p"}], "temperature": 0.5}
    assert meta == {"expected": "B"}
    own, _ = task_params({"custom_id": "b", "body": {"messages": [U], "max_completion_tokens": 9}}, d)
    assert own["max_tokens"] == 9  # the task's own wins over --max-tokens
    with pytest.raises(Untranslatable, match="only chat tasks"):
        task_params({"custom_id": "c", "url": "/v1/embeddings", "body": {"input": "x"}}, d)


def test_custom_id_is_the_tasks_id_when_anthropic_takes_it() -> None:
    assert custom_id("t-1_A") == "t-1_A"
    long, odd = custom_id("x" * 65), custom_id("task:1/é")
    assert long.startswith("h-") and len(long) == 42 and odd != custom_id("task:1/e") and odd == custom_id("task:1/é")


@pytest.mark.parametrize(("batch", "status", "act"), [
    ({"processing_status": "in_progress"}, "in_progress", Act.WAIT),
    ({"processing_status": "canceling", "cancel_initiated_at": "2026-01-01T00:00:00Z"}, "cancelling", Act.WAIT),
    ({"processing_status": "ended", "cancel_initiated_at": "2026-01-01T00:00:00Z"}, "cancelled", Act.COLLECT),
    ({"processing_status": "ended", "request_counts": {"expired": 2, "succeeded": 1}}, "expired", Act.COLLECT),
    ({"processing_status": "ended", "request_counts": {"expired": 0, "succeeded": 3}}, "completed", Act.COLLECT),
])
def test_the_state_mapping(batch: dict[str, Any], status: str, act: Act) -> None:
    assert status_of(batch) == status and on_status(status) is act


def test_as_batch_reads_times_and_the_results_url() -> None:
    b = as_batch({"id": "msgbatch_1", "processing_status": "ended", "created_at": "2026-01-01T00:00:00.5Z",
                  "expires_at": "2026-01-02T00:00:00Z", "results_url": "https://r", "request_counts": {}})
    assert (b["created_at"], b["expires_at"], b["output_file_id"]) == (1767225600, 1767312000, "https://r")
    assert as_batch({"processing_status": "in_progress", "results_url": "x"})["output_file_id"] is None
    assert unix("garbage") is None and unix(None) is None


def test_result_lines_become_answers_and_verdicts_as_openais() -> None:
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "c", "stop_reason": "end_turn",
           "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "forty"},
                       {"type": "text", "text": "-two"}], "usage": {"input_tokens": 3, "output_tokens": 4}}
    ok = parse_result({"custom_id": "a", "result": {"type": "succeeded", "message": msg}})
    assert (ok.status, ok.body, ok.error) == (200, msg, None)
    over = parse_result({"custom_id": "b", "result": {"type": "errored", "error": {"type": "error", "error": {
        "type": "overloaded_error", "message": "Overloaded"}}}})
    assert over.status == 529 and over.error == {"code": "http_529", "message": "Overloaded",
                                                 "type": "overloaded_error"}
    bad = parse_result({"custom_id": "c", "result": {"type": "errored", "error": {
        "type": "invalid_request_error", "message": "no"}}})  # the older, flat shape
    assert bad.status == 400 and bad.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                                         "message": "no"}}
    gone = [parse_result({"custom_id": "d", "result": {"type": t}}) for t in ("expired", "canceled")]
    assert [(a.status, a.code) for a in gone] == [(None, "batch_expired"), (None, "batch_cancelled")]
    assert on_line(over.status, over.code, 1, 3, "batch") is Verdict.RETRY
    assert on_line(bad.status, bad.code, 1, 3, "batch") is Verdict.RECORD
    assert all(on_line(a.status, a.code, 1, 3, "batch") is Verdict.RETRY for a in gone)
    assert on_line(gone[0].status, gone[0].code, 1, 3, "fail") is Verdict.RECORD
    # the record: the Message as Anthropic gave it, its text for the scorers, its usage for the counters
    _, info = build(ok, 7, 1, 1, {"index": 0}, {"id": "msgbatch_1", "chunk": 1}, {}, None, 0.0)
    assert (info["pt"], info["ct"], info["ok"]) == (3, 4, True)
    assert response_text(msg) == "forty-two" == answer_text(msg)


def test_a_batch_answer_carries_its_1h_cache_writes_and_the_model_that_answered() -> None:
    """A Message Batch's answer is priced as an online one: its 1-hour cache writes apart (meta ``w1``), and by
    the dated model it names when that is not the one asked (``md``); a task's own model kept in the record."""
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-20250514",
           "content": [{"type": "text", "text": "x"}], "usage": {
               "input_tokens": 5, "output_tokens": 4, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 900,
               "cache_creation": {"ephemeral_5m_input_tokens": 300, "ephemeral_1h_input_tokens": 600}}}
    ok = parse_result({"custom_id": "a", "result": {"type": "succeeded", "message": msg}})
    parts, info = build(ok, 7, 1, 1, {"index": 0}, {"id": "msgbatch_1", "chunk": 1}, {}, None, 0.0,
                        model="claude-sonnet-4", own_model=True)
    assert (info["pt"], info["cw"], info["w1"], info["md"]) == (905, 900, 600, "claude-sonnet-4-20250514")
    assert orjson.loads(b"".join(parts))["metrics"]["model"] == "claude-sonnet-4"
    _, same = build(ok, 7, 1, 1, {"index": 0}, {"id": "msgbatch_1", "chunk": 1}, {}, None, 0.0,
                    model="claude-sonnet-4-20250514")
    assert "md" not in same


def test_candidates_for_a_chunk_whose_create_was_not_recorded() -> None:
    def b(i: str, created: str, n: int) -> dict[str, Any]:
        return {"id": i, "created_at": created, "request_counts": {"processing": n - 1, "succeeded": 1}}
    t = 1767225600.0  # 2026-01-01T00:00:00Z, the chunk's intent
    seen = [b("new", "2026-01-01T00:00:05Z", 40), b("skew", "2026-01-01T00:00:00Z", 40),
            b("small", "2026-01-01T00:00:05Z", 39), b("old", "2025-12-31T23:58:00Z", 40),
            b("mine", "2026-01-01T00:00:06Z", 40)]
    assert [x["id"] for x in candidates(seen, 40, t + 30, {"mine"})] == ["new", "skew"]  # within SKEW_S


def test_a_running_candidate_is_taken_only_when_unambiguous() -> None:
    one, two = {"id": "msgbatch_1"}, {"id": "msgbatch_2"}
    assert choose_running([], 0) is None  # the create never reached the provider: create it
    assert choose_running([one], 0) is one
    with pytest.raises(Ambiguous, match="msgbatch_1, msgbatch_2"):
        choose_running([one, two], 0)  # another client of the account made one of the same size meanwhile
    with pytest.raises(Ambiguous):
        choose_running([one], 1)  # a lower chunk of the same size is still to adopt: it may be its


def test_provider_choice_headers_and_key_variable(tmp_path: Any) -> None:
    assert batch_provider("auto", "https://api.anthropic.com/v1") == "anthropic"
    assert batch_provider("auto", "http://127.0.0.1:9/v1") == "openai"
    assert batch_provider("anthropic", "http://127.0.0.1:9/v1") == "anthropic"
    h = anthropic_headers({"User-Agent": "evalsup", "Authorization": "Bearer x"}, "sk-ant")
    assert h == {"User-Agent": "evalsup", "anthropic-version": "2023-06-01", "x-api-key": "sk-ant"}
    cfg = build_config(tmp_path / "t.jsonl", {"base_url": ["https://api.anthropic.com/v1"], "batch_api": True})
    assert cfg.worker.batch is not None and cfg.worker.batch["provider"] == "anthropic"
    assert cfg.worker.api_key_env == "ANTHROPIC_API_KEY"
    other = build_config(tmp_path / "t.jsonl", {"base_url": ["http://127.0.0.1:9/v1"], "batch_api": True,
                                                "batch_provider": "anthropic", "api_key_env": "MY_KEY"})
    assert other.worker.api_key_env == "MY_KEY"
    with pytest.raises(ConfigError, match="--batch-provider needs --batch-api"):
        build_config(tmp_path / "t.jsonl", {"base_url": ["http://127.0.0.1:9/v1"], "batch_provider": "anthropic"})
