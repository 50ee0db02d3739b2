"""evalsup.rundir.usage: the spend a resume reads back keeps what was paid for records taken out of results.jsonl
(`run --retry-failed` -> replaced.jsonl, `evalsup repair` -> damaged.jsonl), so a cap is not passed after them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from evalsup.config.prices import Price
from evalsup.rundir.usage import MAX_MODELS, keep, usage_of_results

P = Price(input=1.0, output=2.0)  # USD per million tokens


def lookup(model: str | None) -> Price | None:
    return P if model == "m" else None


def record(cid: str, pt: int, ct: int, error: str | None = None, cache: str | None = None) -> dict[str, Any]:
    return {"id": f"b-{cid}", "custom_id": cid, "response": {"status_code": 200, "request_id": "r", "body": {
        "model": "m", "choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": pt,
                                                                             "completion_tokens": ct}}},
        "error": None if error is None else {"code": error, "message": "m"}, "metrics": {"cache": cache}}


def lines(*recs: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in recs)


def test_records_moved_aside_keep_their_spend_not_their_lengths(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_bytes(lines(record("t1", 10, 20), record("t2", 100, 200)))
    # two paid answers --retry-failed replaced (schema_invalid answers carry a usage) and one from the cache (free)
    (tmp_path / "replaced.jsonl").write_bytes(lines(
        record("t2", 100, 50, "schema_invalid"), record("t3", 7, 3, "schema_invalid"), record("t4", 9, 9, cache="hit")))
    # evalsup repair's file: a record's raw text counts, a line that never was one does not (and never raises)
    (tmp_path / "damaged.jsonl").write_bytes(lines(
        {"line": 3, "reason": "a second record for 't1'", "raw": orjson.dumps(record("t1", 1, 2)).decode() + "\n"},
        {"line": 4, "reason": "not JSON", "raw": "{\"custom_id\": \"t5\", \"resp"}) + b"not json either\n")
    u = usage_of_results(tmp_path / "results.jsonl", lookup)
    assert (u.prompt_tokens, u.completion_tokens) == (10 + 100 + 100 + 7 + 1, 20 + 200 + 50 + 3 + 2)
    assert u.cost == pytest.approx(P.cost(218, 275))
    # what is done and the lengths seen are results.jsonl's alone
    assert (u.records, u.answers) == (2, 2)
    assert u.seen == (20, 110)


def test_without_side_files_only_the_results_count(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_bytes(lines(record("t1", 10, 20)))
    u = usage_of_results(tmp_path / "results.jsonl", lookup)
    assert (u.records, u.prompt_tokens, u.completion_tokens) == (1, 10, 20)


def test_what_a_run_keeps_by_model_name_is_bounded(tmp_path: Path) -> None:
    """``keep``: a set or a dict takes names until it holds MAX_MODELS, then changes no more (a name a full dict
    holds keeps its value); the read-back's models that answered are kept so."""
    names: set[str] = set()
    snapshots: dict[str, str] = {}
    for i in range(MAX_MODELS + 3):
        keep(names, f"m{i}")
        keep(snapshots, f"m{i}", "a")
    assert len(names) == len(snapshots) == MAX_MODELS and f"m{MAX_MODELS}" not in names | snapshots.keys()
    keep(snapshots, "m0", "b")
    assert snapshots["m0"] == "a"
    smaller: dict[str, str] = {"m0": "a"}
    keep(smaller, "m0", "b")
    assert smaller == {"m0": "b"}
    recs = [record(f"t{i}", 1, 1) | {"metrics": {"model": f"asked{i}"}} for i in range(MAX_MODELS + 5)]
    (tmp_path / "results.jsonl").write_bytes(lines(*recs))
    u = usage_of_results(tmp_path / "results.jsonl", lookup)
    assert u.records == MAX_MODELS + 5 and len(u.answered) == MAX_MODELS and "asked0" in u.answered
