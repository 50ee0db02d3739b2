"""A kill -9 of `evalsup serve` inside a real finalizing pass (its run's results.jsonl being split into OpenAI's
output and error files), caught by polling the batch, not set up by hand: after a restart on the same --data the
batch completes with every custom_id exactly once, the files it names are whole and the same at every read, no
temporary file is ever listed, and the upstream is not asked again."""

from __future__ import annotations

import io
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import openai
import orjson

from evalsup.mock.server import MockThread
from tests.harness import Run, chat_requests, wait_until
from tests.serve_client import batch_lines, client, serve, wait_ended

# 300 answers of ~2 MB (~600 MB of results): finalizing takes about a second on a 2-core machine (measured:
# 1.06 s, while the run before it takes ~4 s), long enough for a poll every 20 ms to catch it
ANSWER_KB = 2000
ERROR_EVERY = 50  # these lines get a 400: the error file has lines too


def custom_ids(c: openai.OpenAI, file_id: str | None, size: int | None = None) -> list[str]:
    """The custom_ids of a file's lines, read through GET /v1/files/{id}/content a line at a time (each whole
    JSON: a torn line fails here); its length checked against the FileObject's ``bytes`` when given."""
    if file_id is None:
        return []
    ids, got = [], 0
    with c.files.with_streaming_response.content(file_id) as r:
        for raw in r.iter_lines():
            if raw:
                got += len(raw.encode()) + 1
                ids.append(orjson.loads(raw)["custom_id"])
    assert size is None or got == size, f"{file_id}: {got} bytes read, {size} listed"
    return ids


def kill_while_finalizing(start: Callable[..., Run], data: Path, mock: MockThread, n: int) -> tuple[str, str, float]:
    """One batch of ``n`` large answers; SIGKILL to the server once GET /v1/batches/{id} says finalizing. The
    batch's id, the input file's id, and how long after the finalizing was seen the kill landed; the batch id
    is "" when the batch completed before the kill could land (the caller tries a larger batch)."""
    p, base = serve(start, data, mock)
    c = client(base)
    lines = batch_lines(n, lambda i: {"mock": {"status": 400} if i % ERROR_EVERY == 7 else {"kb": ANSWER_KB}})
    f = c.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    seen: list[float] = []

    def finalizing() -> bool:
        status = c.batches.retrieve(bid).status
        assert status in ("validating", "in_progress", "finalizing", "completed"), status
        if status == "finalizing":
            seen.append(time.monotonic())
        return status in ("finalizing", "completed")

    wait_until(finalizing, f"batch {bid} to finalize", proc=p)
    p.signal(signal.SIGKILL)
    p.p.wait()
    landed = time.monotonic() - seen[0] if seen else 0.0
    on_disk = orjson.loads((data / "batches" / f"{bid}.json").read_bytes())["batch"]["status"]
    if on_disk != "finalizing":  # completed before the kill landed: not the case under test
        return "", f.id, landed
    return bid, f.id, landed


def test_kill_9_inside_finalizing_then_restart_completes_the_same_files(tmp_path: Path, start: Callable[..., Run],
                                                                       mock: MockThread) -> None:
    data = tmp_path / "data"
    try:
        tries = []
        for n in (300, 600):
            shutil.rmtree(data, ignore_errors=True)
            mock.reset_stats()
            bid, input_id, landed = kill_while_finalizing(start, data, mock, n)
            tries.append((n, landed))
            if bid:
                break
        assert bid, (f"the batch completed before the kill could land in its finalizing ((lines, seconds after "
                     f"finalizing was seen): {tries}): finalizing is faster here than the test assumes")
        asked = chat_requests(mock)
        assert asked == n  # each request once, before the kill
        p2, base2 = serve(start, data, mock)
        c2 = client(base2)
        b = wait_ended(c2, bid, p2)
        assert b.status == "completed", b
        assert f"{bid} finalizing: resumed after a restart" in p2.stderr
        assert chat_requests(mock) == asked  # finalized again from the run's results: the upstream not asked
        again = c2.batches.retrieve(bid)
        assert (again.output_file_id, again.error_file_id) == (b.output_file_id, b.error_file_id)
        assert b.output_file_id is not None and b.error_file_id is not None
        listed = {f.id: f for f in c2.files.list().data}
        assert set(listed) == {input_id, b.output_file_id, b.error_file_id}  # nothing temporary or partial
        out = custom_ids(c2, b.output_file_id, listed[b.output_file_id].bytes)
        err = custom_ids(c2, b.error_file_id, listed[b.error_file_id].bytes)
        assert sorted(out + err) == sorted(f"r{i}" for i in range(n))  # each exactly once, across both
        assert sorted(err) == sorted(f"r{i}" for i in range(n) if i % ERROR_EVERY == 7)
        assert b.request_counts is not None
        assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (
            n, len(out), len(err))
        p2.signal(signal.SIGTERM)
        assert p2.finish() == 0
    finally:
        shutil.rmtree(data, ignore_errors=True)  # ~1.2 GB: not left for pytest's kept temporary directories
