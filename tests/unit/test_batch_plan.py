"""The batch planner room (evalsup.batch.plan): chunking within the limits, each provider state's act, each
line's fate, the journal folded into chunk states, adoption after a crash, polling backoff."""

from __future__ import annotations

from evalsup.batch.plan import (
    Act,
    Chunker,
    Pending,
    PollBackoff,
    Step,
    Verdict,
    adopt_batch,
    adopt_file,
    batch_metadata,
    fold,
    next_chunk,
    on_line,
    on_status,
    open_chunks,
)


def p(k: int, size: int = 10) -> Pending:
    return Pending(k, f"t{k}", b"x" * size)


def test_chunk_closes_at_the_request_limit() -> None:
    c = Chunker(max_requests=3, max_bytes=10_000, linger_s=1.0)
    assert c.add(p(1), 0.0) is None and c.add(p(2), 0.0) is None
    closed = c.add(p(3), 0.0)
    assert closed is not None and [x.key for x in closed] == [1, 2, 3] and not c.tasks


def test_chunk_closes_before_the_byte_limit() -> None:
    c = Chunker(max_requests=100, max_bytes=25, linger_s=1.0)
    assert c.add(p(1), 0.0) is None and c.add(p(2), 0.0) is None  # 22 bytes with newlines
    closed = c.add(p(3), 0.0)  # would make 33: the chunk before it closes, it starts the next
    assert closed is not None and [x.key for x in closed] == [1, 2] and [x.key for x in c.tasks] == [3]
    assert c.oversized(p(4, 25)) and not c.oversized(p(4, 24))


def test_chunk_closes_when_nothing_new_came_for_the_linger() -> None:
    c = Chunker(max_requests=100, max_bytes=10_000, linger_s=0.3)
    c.add(p(1), 10.0)
    assert c.due(10.2) is None
    closed = c.due(10.3)
    assert closed is not None and len(closed) == 1 and c.due(20.0) is None


def test_each_provider_state_has_its_act() -> None:
    assert {s: on_status(s) for s in ("validating", "in_progress", "finalizing", "cancelling")} == dict.fromkeys(
        ("validating", "in_progress", "finalizing", "cancelling"), Act.WAIT)
    assert on_status("completed") is on_status("expired") is on_status("cancelled") is Act.COLLECT
    assert on_status("failed") is on_status("failed", "invalid_json_line") is Act.STOP
    assert on_status("failed", "token_limit_exceeded") is Act.RECREATE  # the queue, not the file: again later


def test_each_line_has_its_fate() -> None:
    assert on_line(200, None, 1, 3, "batch") is Verdict.RECORD
    assert on_line(400, "invalid_request_error", 1, 3, "batch") is Verdict.RECORD  # retrying changes nothing
    assert on_line(500, None, 1, 3, "batch") is Verdict.RETRY
    assert on_line(429, None, 1, 3, "online") is Verdict.ONLINE
    assert on_line(None, "batch_expired", 1, 3, "batch") is Verdict.RETRY
    assert on_line(None, "batch_expired", 3, 3, "batch") is Verdict.RECORD  # attempts used up
    assert on_line(None, "batch_cancelled", 1, 3, "fail") is Verdict.RECORD


def test_the_journal_folds_into_chunk_states() -> None:
    ev = [{"event": "run", "run_id": "r"},
          {"event": "intent", "chunk": 1, "sha256": "a", "file": "f1", "endpoint": "/v1/chat/completions", "t": 1.0,
           "keys": [[0, "t0", 0]]},
          {"event": "intent", "chunk": 2, "sha256": "b", "file": "f2", "endpoint": "/v1/chat/completions", "t": 2.0,
           "keys": [[5, "t1", 0]]},
          {"event": "uploaded", "chunk": 1, "file_id": "file-1"},
          {"event": "created", "chunk": 1, "batch_id": "batch_1"},
          {"event": "state", "chunk": 1, "status": "in_progress", "counts": {"total": 1}},
          {"event": "collected", "chunk": 1, "output": "o", "errors": None},
          {"event": "done", "chunk": 1}]
    chunks = fold(ev)
    assert chunks[1].step is Step.DONE and chunks[1].batch_id == "batch_1" and chunks[1].status == "in_progress"
    assert chunks[2].step is Step.PLANNED
    assert [c.chunk for c in open_chunks(chunks)] == [2] and next_chunk(chunks) == 3


def test_a_resume_adopts_its_own_batch_and_file_only() -> None:
    mine = {"id": "b2", "status": "in_progress", "metadata": batch_metadata("r", 2)}
    other_run = {"id": "b3", "status": "completed", "metadata": batch_metadata("s", 2)}
    failed = {"id": "b4", "status": "failed", "metadata": batch_metadata("r", 2)}
    assert adopt_batch([other_run, failed, mine], "r", 2) == mine
    assert adopt_batch([other_run], "r", 2) is None
    files = [{"id": "f1", "filename": "n.jsonl", "bytes": 9, "status": "processed"},
             {"id": "f2", "filename": "n.jsonl", "bytes": 10, "status": "processed"}]
    assert adopt_file(files, "n.jsonl", 10) == files[1] and adopt_file(files, "m.jsonl", 10) is None


def test_polling_backs_off_and_starts_again_on_news() -> None:
    b = PollBackoff(1.0, 3.0, 2.0)
    assert [b.next(False) for _ in range(4)] == [1.0, 2.0, 3.0, 3.0]
    assert b.next(True) == 1.0


def test_a_capped_round_trickling_in_while_results_go_out_is_one_chunk() -> None:
    # under a cap, each settled result makes room for about one more task: they come as the previous chunk's
    # results go out, with pauses longer than the linger; they must make one batch, not one per pause
    c = Chunker(max_requests=1000, max_bytes=1 << 20, linger_s=0.3)
    now = 100.0
    for k in range(36):
        c.add(p(k), now)
        now += 0.5  # the next result (and the task its settling frees) comes after a pause
        c.hold(now)  # the driver: results still going out
        assert c.due(now) is None
    assert c.due(now + 0.2) is None
    closed = c.due(now + 0.31)  # nothing more, and no results going out: the round is one chunk
    assert closed is not None and len(closed) == 36


def test_a_held_chunk_still_closes_at_the_providers_limit() -> None:
    c = Chunker(max_requests=3, max_bytes=10_000, linger_s=0.3)
    c.add(p(1), 0.0)
    c.hold(5.0)
    c.add(p(2), 5.0)
    closed = c.add(p(3), 5.0)
    assert closed is not None and len(closed) == 3
