"""The Python API without a run: an unknown keyword or an iterable without out= refused, DataFrame records
written as JSON, an iterable copied a chunk at a time in a chunk's memory, and exit codes mapped to exceptions
in one place. (Runs through the API: integration/test_api.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest


def test_unknown_keyword_and_iterable_without_out(tmp_path: Path) -> None:
    import evalsup

    with pytest.raises(TypeError, match=r"unexpected keyword argument.*wrokers"):
        evalsup.run(tmp_path / "t.jsonl", wrokers=2)
    with pytest.raises(evalsup.BadSettings, match="iterable need out=RUN_DIR"):
        evalsup.run([{"id": "a", "prompt": "p"}], base_url="http://127.0.0.1:1/v1")
    with pytest.raises(evalsup.BadInput, match=r"tasks\[1\]: a task must be a dict, not str"):
        evalsup.run([{"id": "a", "prompt": "p"}, "b"], base_url="http://127.0.0.1:1/v1", out=tmp_path / "r")


def test_dataframe_records_are_written_as_json(tmp_path: Path) -> None:
    """df.to_dict("records") holds numpy scalars, NaN and timestamps: each task line is still plain JSON."""
    pd = pytest.importorskip("pandas")
    from evalsup.rundir.inputs import iter_lines

    df = pd.DataFrame({"id": ["a", "b"], "prompt": ["p", "q"], "n": [1, 2], "x": [0.5, float("nan")],
                       "when": pd.to_datetime(["2026-01-01", "2026-01-02"])})
    lines = b"".join(iter_lines(df.to_dict("records"))).splitlines()
    assert [orjson.loads(line) for line in lines] == [
        {"id": "a", "prompt": "p", "n": 1, "x": 0.5, "when": "2026-01-01T00:00:00"},
        {"id": "b", "prompt": "q", "n": 2, "x": None, "when": "2026-01-02T00:00:00"}]


def test_tasks_given_as_dicts_are_copied_holding_about_a_chunk_of_memory() -> None:
    """evalsup.run copies an iterable into the run directory a chunk (1 MiB) at a time: what that holds is a
    chunk's text, not a chunk's count of orjson outputs, each of which keeps a 16 KB allocation for a 1 KB task
    (orjson 3.13): holding those until the join cost 16 MB a chunk (10 MB of it resident, the parent's peak)."""
    import tracemalloc

    from evalsup.rundir.inputs import _CHUNK, iter_lines

    def tasks(n: int) -> Iterator[dict[str, str]]:
        for i in range(n):
            yield {"id": f"q{i}", "prompt": f"question {i} " + "x" * 1000}

    tracemalloc.start()
    try:
        size = sum(len(chunk) for chunk in iter_lines(tasks(5_000)))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert size > 4 * _CHUNK  # (several chunks went through)
    assert peak < 4 * _CHUNK, f"{peak / 2**20:.1f} MiB held to copy {size / 2**20:.1f} MiB"


def test_exit_codes_map_to_exceptions_in_one_place() -> None:
    """The codes the CLI may end with (evalsup.config.exitcodes) and the exception each becomes."""
    from evalsup.api.exceptions import BadInput, BadSettings, EndpointUnavailable, RunStopped, error_for_exit

    assert error_for_exit(0, "") is None
    cases = [(2, "t.jsonl:4: malformed JSON", BadInput), (2, "--shard 5/4: need 0 <= K < N", BadSettings),
             (2, "cannot reach the endpoint http://x/v1: refused", EndpointUnavailable),
             (75, "the endpoint has been down for more than --max-wait-down 5s (refused)", EndpointUnavailable),
             (75, "stopped; rerun the same command to resume", RunStopped), (75, "interrupted", RunStopped),
             (73, "tasks.run is in use by evalsup (pid 7)", RunStopped)]
    for code, msg, kind in cases:
        e = error_for_exit(code, msg)
        assert type(e) is kind and str(e) == msg and e.code == code, (code, msg)
        if isinstance(e, RunStopped):
            assert e.resumable
    broken = error_for_exit(1, "a bug")
    assert isinstance(broken, RunStopped) and not broken.resumable  # 1: a rerun alone will not fix it
