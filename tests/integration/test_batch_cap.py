"""A capped `--batch-api` run (issue 39): each request reserves its worst case, so a batch holds what the rest of
the cap has room for, and the next one what the settled answers free. Those tasks come from the supervisor as the
previous batch's results are handed on; with a slow scorer that is a few at a time, with pauses: they must still
make one batch a round, not one batch a pause (623 tasks went out as 17 batches)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import orjson

from evalsup.mock.server import MockThread
from evalsup.tasks.requests import RequestDefaults
from evalsup.tasks.tokens import figures
from tests.harness import BATCH_FAST as FAST
from tests.harness import BATCH_KEY as KEY
from tests.harness import PLUGINS, batches_of, read_results, run_args, run_cli, write_tasks


def test_a_capped_run_sends_one_batch_a_round_the_cap_allows(tmp_path: Path, bmock: MockThread) -> None:
    n, max_tokens = 16, 200
    tasks = write_tasks(tmp_path / "t.jsonl", n, start=10)  # prompts of one length: one worst case for all
    defaults = RequestDefaults("mock-model", max_tokens)
    worst = max(f.approx_prompt + f.max_completion(None)
                for f in (figures(orjson.loads(x), defaults) for x in tasks.read_bytes().splitlines()))
    cap = 6 * worst + worst // 2  # room for 6 requests at their worst at first
    r = run_cli(*run_args(bmock, tasks, *FAST, "--batch-max-requests", "1000", "--max-tokens", str(max_tokens),
                          "--max-total-tokens", str(cap), "--scorer", f"{PLUGINS / 'score_user.py'}:paced"), env=KEY)
    assert r.returncode in (0, 75), r.stderr  # 75: the cap stopped it (budget), resumable
    by_chunk: dict[int, list[int]] = defaultdict(list)  # chunk -> each record's tokens
    for rec in read_results(tmp_path / "t.run"):
        by_chunk[rec["metrics"]["batch"]["chunk"]].append(rec["response"]["body"]["usage"]["total_tokens"])
    assert len(by_chunk) == len(batches_of(bmock)) >= 3
    spent, left = 0, n
    for k in sorted(by_chunk):  # each batch holds every task the cap had room for once the one before settled
        room = min(left, (cap - spent) // worst)
        assert len(by_chunk[k]) == room, (k, len(by_chunk[k]), room, {c: len(v) for c, v in by_chunk.items()})
        spent += sum(by_chunk[k])
        left -= room
