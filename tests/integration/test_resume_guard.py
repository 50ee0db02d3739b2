"""Issue 18 items 5-7: resume by content guarded by settings, a damaged run directory and `evalsup repair`, a
full disk (--retry-failed: test_retry_failed.py). Real processes, real files, the mock on 127.0.0.1."""

from __future__ import annotations

import os
import re
import shutil
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.mock.server import MockConfig, MockThread
from evalsup.rundir.results_file import iter_records
from evalsup.tasks.idset import id_hash
from tests.harness import (
    Run,
    assert_clean_exit,
    assert_exactly_once,
    chat_requests,
    finished_run,
    ids_of,
    killed_mid_run,
    mount,
    quiesce,
    resume_line,
    resumed_done,
    run_args,
    run_cli,
    snapshot,
    summary,
    wait_until,
    write_tasks,
)

# ------------------------------------------------------------------------------ resume by content


def test_touch_and_identical_copy_resume_without_sending_anything(tmp_path: Path, mock: MockThread) -> None:
    tasks, run_dir, args = finished_run(tmp_path, mock)
    mock.reset_stats()
    time.sleep(0.01)
    tasks.touch()
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert resumed_done(resume_line(r.stderr)) == 100
    copy = tmp_path / "copy.jsonl"
    shutil.copyfile(tasks, copy)
    os.replace(copy, tasks)  # a byte-identical file, another inode, new times
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == 0
    assert_exactly_once(run_dir, ids_of(100))


def test_appended_lines_run_and_nothing_else(tmp_path: Path, mock: MockThread) -> None:
    tasks, run_dir, args = finished_run(tmp_path, mock)
    with open(tasks, "ab") as f:
        for i in range(100, 130):
            f.write(orjson.dumps({"id": f"t{i}", "prompt": f"q{i}"}) + b"\n")
    mock.reset_stats()
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "grew" in r.stderr, r.stderr
    assert chat_requests(mock) == 30
    recs = assert_exactly_once(run_dir, ids_of(130))
    assert all(x["error"] is None for x in recs)
    # and once more: the grown file is now the run's input, unchanged
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == 30


def test_a_file_whose_last_line_was_extended_is_changed(tmp_path: Path, mock: MockThread) -> None:
    tasks, _run_dir, args = finished_run(tmp_path, mock, 20)
    tasks.write_bytes(tasks.read_bytes().rstrip(b"\n"))  # same content, no final newline: a new run
    r = run_cli(*args[:-1], "--fresh", args[-1])
    assert r.returncode == 0, r.stderr
    with open(tasks, "ab") as f:
        f.write(b' \n{"id": "t20", "prompt": "x"}\n')  # the old last line goes on (with a space): changed
    r = run_cli(*args)
    assert r.returncode == 2 and "changed" in r.stderr, r.stderr


# ------------------------------------------------------------------------------ settings guard


def test_changed_request_settings_are_refused_and_can_be_accepted(tmp_path: Path, mock: MockThread) -> None:
    secret = "sk-test-DO-NOT-WRITE-0123456789"
    tasks, run_dir, args = finished_run(tmp_path, mock, 50, "--temperature", "0.2", "--max-tokens", "16")
    run = orjson.loads((run_dir / "run.json").read_bytes())
    assert run["version"] == 1
    assert run["settings"]["temperature"] == 0.2 and run["settings"]["max_tokens"] == 16
    assert run["settings"]["model"] == "mock-model" and run["settings"]["endpoint_path"] == "/v1"
    assert summary(run_dir)["settings"] == run["settings"]
    with open(tasks, "ab") as f:
        f.write(orjson.dumps({"id": "t50", "prompt": "q50"}) + b"\n")
    before = snapshot(run_dir)

    changed = (*args[:-1], "--temperature", "0.9", "--max-tokens", "16", "--stream", args[-1])
    r = run_cli(*changed, env={"OPENAI_API_KEY": secret})
    assert r.returncode == 2, r.stderr
    assert_clean_exit(r)
    lines = r.stderr.splitlines()
    assert any("temperature" in x and "0.2" in x and "0.9" in x for x in lines), r.stderr
    assert any("stream" in x for x in lines), r.stderr
    assert not any("max_tokens" in x for x in lines), r.stderr
    assert "--fresh" in r.stderr and "--accept-changed-settings" in r.stderr, r.stderr
    assert snapshot(run_dir) == before, "a refused resume changed the run directory"

    # settings that change no request change freely
    free = (*args[:-1], "--temperature", "0.2", "--max-tokens", "16", "-w", "1", "-c", "3", "--timeout", "30",
            "--log-format", "json", args[-1])
    r = run_cli(*free)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(run_dir, ids_of(51))

    r = run_cli(*changed[:-1], "--accept-changed-settings", changed[-1], env={"OPENAI_API_KEY": secret})
    assert r.returncode == 0, r.stderr
    run = orjson.loads((run_dir / "run.json").read_bytes())
    assert run["settings"]["temperature"] == 0.9 and run["settings"]["stream"] is True
    assert run["changes"][-1]["from"]["temperature"] == 0.2
    for p in run_dir.rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), f"the key is in {p}"


# ------------------------------------------------------------------------------ a damaged run directory


def _one_line_error(r: Any, where: str) -> None:
    assert r.returncode != 0, r.stdout + r.stderr
    assert_clean_exit(r)
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(err) == 1 and where in err[0], r.stderr


@pytest.mark.parametrize("damage", ["garbage", "foreign", "second_record"])
def test_a_damaged_line_before_the_checkpoint_is_refused_everywhere_and_repaired(
        tmp_path: Path, mock: MockThread, damage: str) -> None:
    tasks, run_dir, args = finished_run(tmp_path, mock, 60)
    results = run_dir / "results.jsonl"
    lines = results.read_bytes().splitlines(keepends=True)
    lost = orjson.loads(lines[9])["custom_id"]
    if damage == "garbage":
        lines[9] = b"\x00\x17 not json at all }\n"
    elif damage == "foreign":
        lines[9] = orjson.dumps({"id": lost, "messages": [{"role": "user", "content": "a task line"}]}) + b"\n"
    else:  # line 10 is another task's record again: one task has two records, another has none
        lines[9] = lines[3]
    results.write_bytes(b"".join(lines))
    before = snapshot(run_dir)

    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert "results.jsonl:10" in r.stderr, r.stderr
    assert "evalsup repair" in r.stderr, r.stderr
    assert_clean_exit(r)
    assert snapshot(run_dir) == before, "a refused resume changed the run directory"
    if damage != "second_record":  # the others read the lines, not the checkpoint
        for cmd in (("merge", str(run_dir), "-o", str(tmp_path / "merged.jsonl")),
                    ("score", str(run_dir), "--scorer", "json_valid"), ("report", str(run_dir))):
            _one_line_error(run_cli(*cmd), "results.jsonl:10")
    _one_line_error(run_cli("status", str(run_dir)), "results.jsonl:")

    r = run_cli("repair", str(run_dir))
    assert r.returncode == 0, r.stderr
    assert_clean_exit(r)
    assert "results.jsonl:10" in r.stdout, r.stdout
    moved = [orjson.loads(x) for x in (run_dir / "damaged.jsonl").read_bytes().splitlines()]
    assert [m["line"] for m in moved] == [10]
    sent = chat_requests(mock)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent + 1  # the task whose record was damaged, once
    recs = assert_exactly_once(run_dir, ids_of(60))
    assert all(x["error"] is None for x in recs)
    assert run_cli("repair", str(run_dir)).stdout.count("nothing to repair") == 1
    r = run_cli("merge", str(run_dir), "-o", str(tmp_path / "merged.jsonl"), "--tasks", str(tasks))
    assert r.returncode == 0, r.stderr


def test_a_record_edited_in_place_is_refused_then_accepted_by_repair(tmp_path: Path, mock: MockThread) -> None:
    _tasks, run_dir, args = finished_run(tmp_path, mock, 30)
    results = run_dir / "results.jsonl"
    data = results.read_bytes()
    i = data.index(b'"attempts":1')
    results.write_bytes(data[:i] + b'"attempts":7' + data[i + 12:])  # still a record, not what was written
    r = run_cli(*args)
    assert r.returncode == 2 and "were changed" in r.stderr and "evalsup repair" in r.stderr, r.stderr
    r = run_cli("repair", str(run_dir))
    assert r.returncode == 0 and "changed" in r.stdout, r.stdout + r.stderr
    sent = chat_requests(mock)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent
    assert_exactly_once(run_dir, ids_of(30))


def test_a_damaged_line_after_the_checkpoint_is_refused_and_repaired(tmp_path: Path, mock: MockThread,
                                                                     start: Callable[..., Run]) -> None:

    n = 2000
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n)
    results = run_dir / "results.jsonl"
    data = results.read_bytes()
    data = data[: data.rfind(b"\n") + 1]
    cp = orjson.loads((run_dir / "checkpoint.json").read_bytes())
    assert len(data) >= cp["results_len"]
    bad_line = data.count(b"\n") + 1
    results.write_bytes(data + b'{"id": "t1", "cust": 3}\n')  # past the checkpoint: a foreign line
    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    assert_clean_exit(r)
    assert f"results.jsonl:{bad_line}" in r.stderr and "evalsup repair" in r.stderr, r.stderr
    r = run_cli("repair", str(run_dir))
    assert r.returncode == 0 and f"results.jsonl:{bad_line}" in r.stdout, r.stdout + r.stderr
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)


# ------------------------------------------------------------------------------ a full disk


def test_a_disk_that_fills_again_and_again_loses_nothing_and_counts_right(tmp_path: Path, mock: MockThread,
                                                                          small_fs: Path) -> None:
    """The disk fills at whatever moment it happens to (results, ids.bin, the checkpoint, run.json, the
    summary): each time one line and exit 1, the count printed is the count on disk, every line is a record;
    each rerun after freeing some space goes further, and the last one completes exactly once."""
    n = 120  # 40 KB responses: about 5 MB of results
    tasks = write_tasks(tmp_path / "tasks.jsonl", n, extra={"mock": {"kb": 40}})
    run_dir = small_fs / "run"
    args = run_args(mock, tasks, "-w", "2", "-c", "8", "--out", str(run_dir))
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (1 << 20))  # 1 MiB of the 2 taken: the disk fills early
    stops = 0
    for size_mb in (2, 2, 3, 4, 5, 64):
        if size_mb == 2 and stops == 1:
            filler.unlink()  # the second time: free the filler instead of growing the disk
        else:
            assert mount("-o", f"remount,size={size_mb}m", str(small_fs)).returncode == 0
        r = run_cli(*args)
        assert_clean_exit(r)
        if r.returncode == 0:
            break
        assert r.returncode == 75, r.stderr  # resumable: free space, rerun
        stops += 1
        errors = [x for x in r.stderr.splitlines() if "No space left on device" in x]
        assert len(errors) == 1, r.stderr
        results = run_dir / "results.jsonl"
        if results.exists():
            on_disk = sum(1 for _ in iter_records(results))  # each complete line is a record
            m = re.search(r"\(([\d,]+) done so far\)", errors[0])
            if m is not None:
                assert int(m.group(1).replace(",", "")) == on_disk, (errors[0], on_disk)
    assert r.returncode == 0, r.stderr
    assert stops >= 2, "the disk never filled"
    recs = assert_exactly_once(run_dir, ids_of(n))
    assert all(x["error"] is None for x in recs)
    assert summary(run_dir)["total"] == n


def test_ids_bin_longer_than_its_checkpoint_is_cut_and_stays_consistent(tmp_path: Path, mock: MockThread,
                                                                         start: Callable[..., Run]) -> None:
    """A kill between the flush of ids.bin and the checkpoint leaves ids.bin longer than the checkpoint says.
    The resume cuts it; its next checkpoint must not count the cut bytes (it did: truncate() left the append
    position past the end, so the third run met its own ids as duplicates)."""

    n = 2000
    _tasks, run_dir, args = killed_mid_run(tmp_path, mock, start, n)
    with open(run_dir / "ids.bin", "ab") as f:
        f.write(b"\x01" * 16 * 50)  # 50 pairs no checkpoint covers
    mock.configure(latency_ms=200, jitter_ms=20)  # slow enough that this run is still far from the end when killed
    cp_mtime = (run_dir / "checkpoint.json").stat().st_mtime_ns
    p = start(*args)
    wait_until(lambda: (run_dir / "checkpoint.json").stat().st_mtime_ns != cp_mtime or not p.running(), "a checkpoint")
    time.sleep(2.5)  # one more checkpoint, with ids written after the resume
    p.kill_group()
    assert p.wait_workers_gone() == []
    # and the next ids flushed, as a kill between the flush and the checkpoint leaves them
    frontier = orjson.loads((run_dir / "checkpoint.json").read_bytes())["frontier"]
    pairs = array("Q")
    with open(_tasks, "rb") as f:
        f.seek(frontier)
        for _ in range(20):
            at = f.tell()
            line = f.readline()
            if not line:
                break
            pairs.extend((id_hash(orjson.loads(line)["id"]), at))
    assert pairs, "the run read its whole input before the kill: nothing left to flush ahead of the checkpoint"
    with open(run_dir / "ids.bin", "ab") as f:
        f.write(pairs.tobytes())
    mock.configure(latency_ms=5, jitter_ms=2)
    quiesce(mock)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert_exactly_once(run_dir, ids_of(n))


def test_a_run_directory_of_the_previous_evalsup_resumes(tmp_path: Path, mock: MockThread) -> None:
    """A checkpoint with the old fingerprint (size, mtime, ends) and no line count or CRC, and no run.json."""
    from evalsup.tasks.fingerprint import _legacy_fingerprint

    tasks, run_dir, args = finished_run(tmp_path, mock, 40)
    cp = orjson.loads((run_dir / "checkpoint.json").read_bytes())
    cp["fingerprint"] = _legacy_fingerprint(tasks)
    del cp["results_lines"], cp["results_crc"], cp["reconcile"]
    (run_dir / "checkpoint.json").write_bytes(orjson.dumps(cp))
    (run_dir / "run.json").unlink()
    sent = chat_requests(mock)
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    assert chat_requests(mock) == sent
    assert orjson.loads((run_dir / "run.json").read_bytes())["settings"]["model"] == "mock-model"
    new = orjson.loads((run_dir / "checkpoint.json").read_bytes())
    assert new["fingerprint"]["sha256"] and new["results_crc"] is not None
    assert_exactly_once(run_dir, ids_of(40))


def test_repair_refuses_a_run_directory_in_use(tmp_path: Path, mock: MockThread, start: Callable[..., Run]) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", 2000)
    run_dir = tmp_path / "tasks.run"
    mock.configure(latency_ms=200, jitter_ms=20)
    p = start(*run_args(mock, tasks, "-w", "1"))
    wait_until(lambda: (run_dir / "checkpoint.json").exists() or not p.running(), "the first checkpoint")
    before = (run_dir / "checkpoint.json").read_bytes()
    r = run_cli("repair", str(run_dir))
    assert r.returncode == 2 and "is writing to it" in r.stderr, r.stdout + r.stderr
    assert_clean_exit(r)
    assert not (run_dir / "damaged.jsonl").exists() and p.running()
    assert orjson.loads(before)["pid"] == p.pid


def test_other_replicas_resume_with_a_note_and_another_path_is_refused(tmp_path: Path, mock: MockThread) -> None:
    tasks, run_dir, args = finished_run(tmp_path, mock, 40)
    assert orjson.loads((run_dir / "run.json").read_bytes())["endpoints"] == [mock.url]
    write_tasks(tasks, 60)
    other = MockThread(MockConfig(seed=1))
    other.start()
    try:
        # another replica beside the first: the same path, so the same API; the run goes on and says so
        r = run_cli(*args[:-1], "--base-url", other.url, args[-1])
        assert r.returncode == 0, r.stderr
        note = [ln for ln in r.stderr.splitlines() if "other endpoints" in ln]
        assert len(note) == 1 and f"{mock.url}, {other.url} (was {mock.url})" in note[0], r.stderr
        assert orjson.loads((run_dir / "run.json").read_bytes())["endpoints"] == [mock.url, other.url]
        assert_exactly_once(run_dir, ids_of(60))
        # a path that differs may be another API or deployment: refused like any changed setting
        write_tasks(tasks, 70)
        before = snapshot(run_dir)
        moved = other.url.removesuffix("/v1") + "/v2"
        r = run_cli(*args[:-1], "--base-url", moved, args[-1])
        assert r.returncode == 2, r.stderr
        assert any("endpoint_path" in ln and "'/v1' then" in ln and "['/v1', '/v2'] now" in ln
                   for ln in r.stderr.splitlines()), r.stderr
        assert snapshot(run_dir) == before
    finally:
        other.stop()
