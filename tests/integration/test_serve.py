"""`evalsup serve` (issue 42) driven by the openai SDK, unmodified, in front of the project's mock on 127.0.0.1:
the batch workflow end to end, kill -9 of the server mid-batch, two keys, bad uploads, SIGTERM, one live limit
per upstream shared by the running batches."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import openai
import orjson
import pytest
from openai.types import Batch, FileObject

from evalsup.mock.server import MockConfig, MockThread
from tests.harness import Run, chat_requests, wait_until
from tests.serve_client import batch_lines, client, free_port, output_of, serve, wait_ended


def test_openai_sdk_batch_workflow(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    data = batch_lines(20, lambda i: {"mock": {"status": 400}} if i == 7 else {})
    f = c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    raw_file = c.files.with_raw_response.retrieve(f.id).http_response.json()
    assert FileObject.model_validate(raw_file).status == "processed" and raw_file["bytes"] == len(data)
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                         metadata={"job": "t"})
    assert b.status == "validating" and b.metadata == {"job": "t"}
    b = wait_ended(c, b.id)
    assert b.status == "completed", b
    Batch.model_validate(c.batches.with_raw_response.retrieve(b.id).http_response.json())
    assert b.request_counts is not None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (20, 19, 1)
    assert b.usage is not None and b.usage.output_tokens > 0
    out, err = output_of(c, b.output_file_id), output_of(c, b.error_file_id)
    assert sorted(x["custom_id"] for x in out + err) == sorted(f"r{i}" for i in range(20))
    assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in out)
    assert set(out[0]) == {"id", "custom_id", "response", "error"}
    assert [(x["custom_id"], x["response"]["status_code"]) for x in err] == [("r7", 400)]
    page = c.batches.list(limit=1)
    assert [x.id for x in page.data] == [b.id]
    assert c.files.retrieve(b.output_file_id or "").purpose == "batch_output"
    assert c.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(f.id)


def test_bad_file_fails_with_line_numbers(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    data = batch_lines(3) + batch_lines(1) + batch_lines(1, url="/v1/embeddings").replace(b"r0", b"x") + \
        batch_lines(1, lambda i: {"stream": True}).replace(b"r0", b"s")
    f = c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    b = wait_ended(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h").id)
    assert b.status == "failed" and b.errors is not None and b.errors.data is not None
    assert [(e.line, e.code) for e in b.errors.data] == [(4, "duplicate_custom_id"), (5, "mismatched_endpoint"),
                                                         (6, "invalid_request")]
    with pytest.raises(openai.BadRequestError) as e:
        c.files.create(file=("x.jsonl", io.BytesIO(b"not json\n")), purpose="batch")
    assert e.value.code == "invalid_file_format"
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.create(input_file_id=f.id, endpoint="/v1/nothing", completion_window="24h")  # type: ignore[arg-type]
    assert e.value.param == "endpoint"


def test_oversized_upload_413_leaves_nothing(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock, "--max-file-mb", "0.01", "--max-file-lines", "50")
    c = client(base)
    for n in (200, 60):  # past the size (about 24 KB), past the lines (about 7 KB)
        with pytest.raises(openai.APIStatusError) as e:
            c.files.create(file=("big.jsonl", io.BytesIO(batch_lines(n))), purpose="batch")
        assert e.value.status_code == 413 and e.value.code == "file_too_large"
    assert c.files.create(file=("ok.jsonl", io.BytesIO(batch_lines(50))), purpose="batch").bytes > 0
    c.files.delete(c.files.list().data[0].id)
    assert c.files.list().data == []
    assert list((tmp_path / "data" / "tmp").iterdir()) == []
    assert list((tmp_path / "data" / "files").iterdir()) == []


def test_two_keys_see_only_their_own(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a\n" + __import__("hashlib").sha256(b"key-b").hexdigest() + "\n")
    _, base = serve(start, tmp_path / "data", mock, "--api-keys", str(keys))
    a, b = client(base, "key-a"), client(base, "key-b")
    fa = a.files.create(file=("a.jsonl", io.BytesIO(batch_lines(2))), purpose="batch")
    ba = a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        b.files.retrieve(fa.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.retrieve(ba.id)
    with pytest.raises(openai.NotFoundError):
        b.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert b.files.list().data == [] and b.batches.list().data == []
    with pytest.raises(openai.AuthenticationError):
        client(base, "wrong").files.list()
    assert wait_ended(a, ba.id).status == "completed"


def test_refuses_other_than_loopback_without_keys(tmp_path: Path, start: Callable[..., Run],
                                                   mock: MockThread) -> None:
    p = start("serve", "--upstream", mock.url, "--data", str(tmp_path / "d"), "--host", "0.0.0.0")
    assert p.finish() == 2
    assert "--api-keys" in p.stderr and "Traceback" not in p.stderr


def test_kill_9_mid_batch_then_restart_completes_exactly_once(tmp_path: Path, start: Callable[..., Run],
                                                              mock: MockThread) -> None:
    n = 300
    p, base = serve(start, tmp_path / "data", mock, "--", "--concurrency", "4")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(n, lambda i: {"mock": {"delay_s": 0.05}}))),
                       purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    results = tmp_path / "data" / "runs" / bid / "run" / "results.jsonl"
    wait_until(lambda: results.exists() and results.stat().st_size > 0, "the first results", proc=p)
    p.signal(signal.SIGKILL)
    p.p.wait()
    p2, base2 = serve(start, tmp_path / "data", mock, "--", "--concurrency", "4")
    c2 = client(base2)
    b = wait_ended(c2, bid, p2)
    # nothing answered is sent again beyond what was out at the kill: on the wire (4), or answered but not yet
    # through the worker's pipe when the run stopped at once (the kill's SIGTERM can come twice)
    assert chat_requests(mock) <= n + 2 * 4
    assert b.status == "completed"
    ids = [x["custom_id"] for x in output_of(c2, b.output_file_id) + output_of(c2, b.error_file_id)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(n))
    assert "resumed after a restart" in p2.stderr
    p2.signal(signal.SIGTERM)
    assert p2.finish() == 0


def test_sigterm_mid_batch_drains_exit_0_and_resumes(tmp_path: Path, start: Callable[..., Run],
                                                     mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(200, lambda i: {"mock": {"delay_s": 0.05}}))),
                       purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    wait_until(lambda: c.batches.retrieve(bid).status == "in_progress", "in_progress", proc=p)
    p.signal(signal.SIGTERM)
    assert p.finish() == 0
    assert not p.wait_workers_gone()
    _, base2 = serve(start, tmp_path / "data", mock)
    b = wait_ended(client(base2), bid)
    assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 200


def test_cancel_keeps_what_was_answered(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--", "--concurrency", "2")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(400, lambda i: {"mock": {"delay_s": 0.1}}))),
                       purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    results = tmp_path / "data" / "runs" / bid / "run" / "results.jsonl"
    wait_until(lambda: results.exists() and results.stat().st_size > 0, "the first results", proc=p)
    assert c.batches.cancel(bid).status == "cancelling"
    b = wait_ended(c, bid, p)
    assert b.status == "cancelled" and b.cancelled_at is not None
    out = output_of(c, b.output_file_id)
    assert 0 < len(out) < 400 and len({x["custom_id"] for x in out}) == len(out)



def test_evalsup_batch_api_mode_against_serve(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock)
    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(batch_lines(12))
    r = start("run", str(tasks), "--out", str(tmp_path / "run"), "--base-url", base, "--batch-api", "--quiet")
    assert r.finish() == 0, r.stderr
    recs = [orjson.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_bytes().splitlines()]
    assert sorted(x["custom_id"] for x in recs) == sorted(f"r{i}" for i in range(12))
    assert all(x["response"]["status_code"] == 200 for x in recs)


def test_upstream_key_never_leaves_the_server(tmp_path: Path, start: Callable[..., Run]) -> None:
    secret = "sk-upstream-secret-4242"
    with MockThread(MockConfig(api_key=secret, seed=2)) as m:
        p, base = serve(start, tmp_path / "data", m, "--upstream-api-key-env", "UPSTREAM_KEY",
                        env={"UPSTREAM_KEY": secret})
        c = client(base)
        f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(5))), purpose="batch")
        b = wait_ended(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                           completion_window="24h").id, p)
        assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 5
        said = [c.batches.with_raw_response.retrieve(b.id).http_response.text, c.files.content(
            b.output_file_id or "").text, c.models.with_raw_response.list().http_response.text,
                urllib.request.urlopen(base.removesuffix("/v1") + "/metrics").read().decode()]
        p.signal(signal.SIGTERM)
        assert p.finish() == 0
    on_disk = [x.read_bytes() for x in (tmp_path / "data").rglob("*") if x.is_file()]
    assert not [s for s in [*said, p.stderr] if secret in s]
    assert not [x for x in on_disk if secret.encode() in x]


def test_expired_batch_lists_unanswered_as_batch_expired(tmp_path: Path, start: Callable[..., Run],
                                                         mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--", "--concurrency", "2")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(100, lambda i: {"mock": {"delay_s": 0.3}}))),
                       purpose="batch")
    b = wait_ended(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="5s").id, p)  # type: ignore[arg-type]
    assert b.status == "expired" and b.expired_at is not None
    out, err = output_of(c, b.output_file_id), output_of(c, b.error_file_id)
    assert sorted(x["custom_id"] for x in out + err) == sorted(f"r{i}" for i in range(100))
    assert out and {x["error"]["code"] for x in err} == {"batch_expired"}


def test_two_keys_take_turns_for_the_one_slot(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a\nkey-b\n")
    p, base = serve(start, tmp_path / "data", mock, "--api-keys", str(keys), "--max-running-batches", "1")
    a, b = client(base, "key-a"), client(base, "key-b")
    slow = batch_lines(30, lambda i: {"mock": {"delay_s": 0.05}})
    fa = a.files.create(file=("a.jsonl", io.BytesIO(slow)), purpose="batch")
    fb = b.files.create(file=("b.jsonl", io.BytesIO(batch_lines(3))), purpose="batch")
    made = [a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h").id,
            a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h").id,
            b.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h").id]
    for cl, bid in zip((a, a, b), made, strict=True):
        assert wait_ended(cl, bid, p).status == "completed"
    started = [ln.split()[2] for ln in p.stderr.splitlines() if ln.endswith("requests") and "in_progress" in ln]
    assert started == [made[0], made[2], made[1]]  # key b's batch came last, and went before key a's second


def test_metrics_and_health(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(4))), purpose="batch")
    wait_ended(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id)
    text = urllib.request.urlopen(base.removesuffix("/v1") + "/metrics").read().decode()
    assert 'evalsup_serve_batches{state="completed"} 1' in text
    assert 'evalsup_serve_requests{result="completed"} 4' in text
    assert 'evalsup_serve_upstream_latency_seconds{quantile="0.5"}' in text


def test_kill_9_mid_upload_leaves_nothing(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    import http.client

    p, base = serve(start, tmp_path / "data", mock)
    port = int(base.rsplit(":", 1)[1].split("/")[0])
    head = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B\r\n'
            b'Content-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n')
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.putrequest("POST", "/v1/files")
    conn.putheader("Content-Type", "multipart/form-data; boundary=B")
    conn.putheader("Content-Length", str(10 << 20))
    conn.endheaders()
    conn.send(head + batch_lines(20000))  # past one 1 MiB chunk: some of it is written
    tmp = tmp_path / "data" / "tmp"
    wait_until(lambda: any(x.stat().st_size > 0 for x in tmp.iterdir()), "the upload on disk", proc=p)
    p.signal(signal.SIGKILL)
    p.p.wait()
    conn.close()
    p2, base2 = serve(start, tmp_path / "data", mock)
    assert client(base2).files.list().data == []
    assert list(tmp.iterdir()) == [] and list((tmp_path / "data" / "files").iterdir()) == []
    assert "half done" in p2.stderr


def test_finalizing_again_after_a_crash_writes_the_same_files(tmp_path: Path, start: Callable[..., Run],
                                                             mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(10))), purpose="batch")
    b = wait_ended(c, c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h").id)
    p.signal(signal.SIGTERM)
    assert p.finish() == 0
    # as a kill -9 between the output's bytes renamed in and the batch's record: finalizing, no file recorded
    rec_path = tmp_path / "data" / "batches" / f"{b.id}.json"
    rec = orjson.loads(rec_path.read_bytes())
    rec["batch"].update(status="finalizing", output_file_id=None, completed_at=None)
    rec_path.write_bytes(orjson.dumps(rec))
    (tmp_path / "data" / "files" / f"{b.output_file_id}.json").unlink()
    _, base2 = serve(start, tmp_path / "data", mock)
    c2 = client(base2)
    again = wait_ended(c2, b.id)
    assert again.status == "completed" and again.output_file_id == b.output_file_id
    assert sorted(x["custom_id"] for x in output_of(c2, again.output_file_id)) == sorted(f"r{i}" for i in range(10))
    assert len(c2.files.list(purpose="batch_output").data) == 1


def test_disk_full_upload_507_leaves_nothing(tmp_path: Path, small_fs: Path, start: Callable[..., Run],
                                             mock: MockThread) -> None:  # small_fs first: unmounted after the kill
    _, base = serve(start, small_fs / "data", mock)
    c = client(base)
    with pytest.raises(openai.APIStatusError) as e:
        c.files.create(file=("big.jsonl", io.BytesIO(batch_lines(30000))), purpose="batch")
    assert e.value.status_code == 507
    assert list((small_fs / "data" / "tmp").iterdir()) == []
    f = c.files.create(file=("small.jsonl", io.BytesIO(batch_lines(2))), purpose="batch")
    assert c.files.retrieve(f.id).bytes > 0


INSPECT = os.environ.get("EVALSUP_TEST_INSPECT") or shutil.which("inspect")
INSPECT_TASK = """
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.solver import generate


@task
def tiny():
    return Task(dataset=[Sample(input=f"say {i}", target="x") for i in range(4)], solver=generate())
"""


@pytest.mark.skipif(INSPECT is None, reason="Inspect AI is not installed (pip install inspect-ai; or "
                                            "EVALSUP_TEST_INSPECT=/path/to/inspect)")
def test_inspect_ai_batch_mode_against_serve(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock)
    (tmp_path / "tiny.py").write_text(INSPECT_TASK)
    (tmp_path / "batch.yaml").write_text("size: 4\nsend_delay: 1\ntick: 1\n")
    r = subprocess.run([str(INSPECT), "eval", "tiny.py", "--model", "openai/mock-model", "--batch", "batch.yaml",
                        "--log-dir", "logs", "--display", "plain"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "OPENAI_BASE_URL": base, "OPENAI_API_KEY": "x"}, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "completed: 4 answered" in p.stderr  # Inspect's requests went as one batch through serve


def test_two_batches_at_once_share_one_upstream(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--concurrency", "8", "--max-running-batches", "2")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(150, lambda i: {"mock": {"delay_s": 0.05}}))),
                       purpose="batch")
    made = [c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
            for _ in range(2)]
    assert [wait_ended(c, b, p).status for b in made] == ["completed", "completed"]
    states = [ln.split()[3].rstrip(":") for ln in p.stderr.splitlines() if ln.split()[2:3] and
              ln.split()[2] in made]
    assert states.index("completed") > max(i for i, s in enumerate(states) if s == "in_progress")  # both ran at once
    assert 0 < mock.stats()["max_in_flight"] <= 8  # together, never more than --concurrency on the upstream


def test_retention_removes_expired_files_and_old_batches(tmp_path: Path, start: Callable[..., Run],
                                                         mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--retention-hours", "0.0006")  # about 2 s
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(3))), purpose="batch")
    assert f.expires_at is not None and f.expires_at - f.created_at <= 3
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id

    def gone() -> bool:
        try:
            c.batches.retrieve(bid)
            return False
        except openai.NotFoundError:
            return True

    wait_until(gone, "the ended batch removed", proc=p)
    assert c.files.list().data == []
    assert list((tmp_path / "data" / "runs").iterdir()) == []
    assert "removed: ended more than the retention ago" in p.stderr


def test_upstream_down_at_the_start_is_waited_for(tmp_path: Path, start: Callable[..., Run]) -> None:
    port = free_port()
    later = MockThread(MockConfig(seed=4), port=port)
    p, base = serve(start, tmp_path / "data", later)  # its URL: nothing listens there yet
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(5))), purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    events = tmp_path / "data" / "runs" / bid / "run" / "events.jsonl"
    wait_until(lambda: events.exists() and b"breaker_open" in events.read_bytes(), "the run to find it down", proc=p)
    with later:
        b = wait_ended(c, bid, p)
    assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 5


def test_a_new_key_gets_a_slot_from_a_key_holding_all(tmp_path: Path, start: Callable[..., Run],
                                                     mock: MockThread) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a\nkey-b\n")
    p, base = serve(start, tmp_path / "data", mock, "--api-keys", str(keys), "--max-running-batches", "2", "--",
                    "--concurrency", "2")
    a, b = client(base, "key-a"), client(base, "key-b")
    fa = a.files.create(file=("a.jsonl", io.BytesIO(batch_lines(60, lambda i: {"mock": {"delay_s": 0.1}}))),
                        purpose="batch")
    big = [a.batches.create(input_file_id=fa.id, endpoint="/v1/chat/completions", completion_window="24h").id
           for _ in range(2)]
    wait_until(lambda: all(a.batches.retrieve(x).status == "in_progress" for x in big), "A's two running", proc=p)
    fb = b.files.create(file=("b.jsonl", io.BytesIO(batch_lines(3))), purpose="batch")
    small = b.batches.create(input_file_id=fb.id, endpoint="/v1/chat/completions", completion_window="24h").id
    done_b = wait_ended(b, small, p)
    assert done_b.status == "completed" and done_b.completed_at is not None
    ends = [wait_ended(a, x, p) for x in big]
    assert all(x.status == "completed" for x in ends)
    assert (ends[1].completed_at or 0) >= done_b.completed_at  # A's newest gave its slot to B's and ended after
    assert f"{big[1]} yields its slot" in p.stderr
    for x in ends:  # the yielded batch resumed: each custom_id once
        ids = [r["custom_id"] for r in output_of(a, x.output_file_id) + output_of(a, x.error_file_id)]
        assert sorted(ids) == sorted(f"r{i}" for i in range(60))


def test_kill_9_right_after_create_then_restart_completes(tmp_path: Path, start: Callable[..., Run],
                                                          mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(50))), purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    p.signal(signal.SIGKILL)  # the create has answered: the batch is recorded, whatever its phase now
    p.p.wait()
    _, base2 = serve(start, tmp_path / "data", mock)
    c2 = client(base2)
    b = wait_ended(c2, bid)
    assert b.status == "completed" and b.input_file_id == f.id
    ids = [x["custom_id"] for x in output_of(c2, b.output_file_id) + output_of(c2, b.error_file_id)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(50))


def test_one_server_per_data_dir_and_a_port_in_use(tmp_path: Path, start: Callable[..., Run],
                                                   mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock)
    second = start("serve", "--upstream", mock.url, "--data", str(tmp_path / "data"), "--port", str(free_port()))
    assert second.finish() == 73
    assert "in use by another evalsup" in second.stderr and "Traceback" not in second.stderr
    port = base.rsplit(":", 1)[1].split("/")[0]
    taken = start("serve", "--upstream", mock.url, "--data", str(tmp_path / "other"), "--port", port)
    assert taken.finish() == 2
    assert f"cannot listen on 127.0.0.1:{port}" in taken.stderr and "Traceback" not in taken.stderr


def test_responses_and_embeddings_batches(tmp_path: Path, start: Callable[..., Run], mock: MockThread) -> None:
    _, base = serve(start, tmp_path / "data", mock)
    c = client(base)
    bodies = {"/v1/responses": {"model": "mock-model", "input": "hi"},
              "/v1/embeddings": {"model": "mock-model", "input": "hi"}}
    for url, body in bodies.items():
        data = b"".join(orjson.dumps({"custom_id": f"{url}-{i}", "method": "POST", "url": url, "body": body}) + b"\n"
                        for i in range(3))
        f = c.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        b = wait_ended(c, c.batches.create(input_file_id=f.id, endpoint=url,  # type: ignore[arg-type]
                                           completion_window="24h").id)
        assert b.status == "completed" and b.endpoint == url
        out = output_of(c, b.output_file_id)
        assert len(out) == 3 and all(x["response"]["body"]["object"] in ("response", "list") for x in out)



def test_a_lone_batch_uses_the_whole_upstream_limit(tmp_path: Path, start: Callable[..., Run],
                                                    mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--concurrency", "32", "--max-running-batches", "4")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(400, lambda i: {"mock": {"delay_s": 0.2}}))),
                       purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    b = wait_ended(c, bid, p)
    assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 400
    held = mock.stats()["max_in_flight"]
    assert 8 < held <= 32, held  # a fixed share was 32 / 4 = 8
    ceiling = tmp_path / "data" / "runs" / bid / "run" / "concurrency"
    assert ceiling.read_text().strip() == "32"


def test_two_keys_batches_share_the_upstream_limit(tmp_path: Path, start: Callable[..., Run],
                                                   mock: MockThread) -> None:
    keys = tmp_path / "keys"
    keys.write_text("key-a\nkey-b\n")
    p, base = serve(start, tmp_path / "data", mock, "--api-keys", str(keys), "--concurrency", "32",
                    "--max-running-batches", "4")
    a, b = client(base, "key-a"), client(base, "key-b")
    made = []
    for who in (a, b):
        f = who.files.create(file=("in.jsonl", io.BytesIO(batch_lines(1200, lambda i: {"mock": {"delay_s": 0.1}}))),
                             purpose="batch")
        made.append(who.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                       completion_window="24h").id)

    def both_progress() -> bool:
        got = [who.batches.retrieve(x) for who, x in zip((a, b), made, strict=True)]
        return all(g.status == "in_progress" and g.request_counts is not None and g.request_counts.completed > 0
                   for g in got)

    wait_until(both_progress, "both batches answered while both run", proc=p)
    ends = [wait_ended(who, x, p) for who, x in zip((a, b), made, strict=True)]
    assert [e.status for e in ends] == ["completed", "completed"]
    for who, e in zip((a, b), ends, strict=True):
        assert sorted(r["custom_id"] for r in output_of(who, e.output_file_id)) == sorted(f"r{i}" for i in range(1200))
    assert 0 < mock.stats()["max_in_flight"] <= 32  # together, never more than --concurrency on the upstream


def test_a_stale_ceiling_does_not_hold_back_a_resumed_batch(tmp_path: Path, start: Callable[..., Run],
                                                            mock: MockThread) -> None:
    p, base = serve(start, tmp_path / "data", mock, "--concurrency", "16")
    c = client(base)
    f = c.files.create(file=("in.jsonl", io.BytesIO(batch_lines(300, lambda i: {"mock": {"delay_s": 0.2}}))),
                       purpose="batch")
    bid = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h").id
    run = tmp_path / "data" / "runs" / bid / "run"
    wait_until(lambda: (run / "results.jsonl").exists() and (run / "results.jsonl").stat().st_size > 0,
               "the first results", proc=p)
    p.signal(signal.SIGTERM)
    assert p.finish() == 0
    (run / "concurrency").write_text("1\n")  # as a server before a crash might have left it
    mock.reset_stats()
    _, base2 = serve(start, tmp_path / "data", mock, "--concurrency", "16")
    b = wait_ended(client(base2), bid)
    assert b.status == "completed" and b.request_counts is not None and b.request_counts.completed == 300
    assert 1 < mock.stats()["max_in_flight"] <= 16  # its ceiling written again before its run started
    assert (run / "concurrency").read_text().strip() == "16"
