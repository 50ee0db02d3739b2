"""evalsup.ray.plan: what each shard on Ray runs with, what its exit means, the one progress line."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from evalsup.config.options import argv_of
from evalsup.ray.plan import (
    DRIVER_ONLY,
    CredentialInArgs,
    Exit,
    ShardUnfinished,
    exit_of,
    progress_line,
    retry_line,
    shard_env,
    shard_options,
)


def test_limits_are_shared_among_the_shards_not_multiplied() -> None:
    given = {"concurrency": 64, "max_requests_per_s": ("10", "http://gpu2:8000/v1=3"),
             "max_tokens_per_min": ("200000",), "model": "m"}
    opts = shard_options(given, 0, 4)
    assert opts["concurrency"] == 16
    assert opts["max_requests_per_s"] == ("2.5", "http://gpu2:8000/v1=0.75")
    assert opts["max_tokens_per_min"] == ("50000",)
    assert opts["model"] == "m"
    # the shards together never exceed what was given
    assert sum(float(shard_options(given, k, 4)["max_requests_per_s"][0]) for k in range(4)) == 10


def test_a_shard_keeps_at_least_one_request_in_flight() -> None:
    assert shard_options({"concurrency": 3}, 0, 8)["concurrency"] == 1
    assert shard_options({"max_concurrency": 100}, 0, 8)["max_concurrency"] == 12


def test_the_judges_limit_is_shared_too_given_or_default() -> None:
    given = {"scorers": ("judge",), "judge_concurrency": 32}
    assert [shard_options(given, k, 4)["judge_concurrency"] for k in range(4)] == [8, 8, 8, 8]
    # not given: the default (16 in all) is split as well, never 16 in each shard
    assert shard_options({"scorers": ("judge", "contains")}, 0, 8)["judge_concurrency"] == 2
    assert shard_options({"judge_base_url": "http://127.0.0.1:8/v1"}, 0, 4)["judge_concurrency"] == 4
    assert "judge_concurrency" not in shard_options({"scorers": ("contains",)}, 0, 4)


def test_a_single_rate_as_evalsup_run_takes_it() -> None:
    assert shard_options({"max_requests_per_s": 9}, 2, 3)["max_requests_per_s"] == ("3",)


def test_the_driver_keeps_its_own_options_and_fresh_never_reaches_a_shard() -> None:
    given = {"ray": "auto", "shards": 4, "ray_retries": 2, "out": "/x", "fresh": True, "json_summary": True,
             "stream": True}
    opts = shard_options(given, 1, 4)
    assert set(opts) == {"stream"}
    assert not set(opts) & DRIVER_ONLY
    assert argv_of(opts) == ["--stream"]  # a retried shard given --fresh would move its own progress aside


def test_each_shard_gets_its_own_metrics_port() -> None:
    assert [shard_options({"metrics_port": 9100}, k, 3)["metrics_port"] for k in range(3)] == [9100, 9101, 9102]


@pytest.mark.parametrize(("code", "verdict"), [(0, Exit.DONE), (2, Exit.BAD), (73, Exit.HELD), (75, Exit.UNFINISHED),
                                               (-9, Exit.UNFINISHED), (1, Exit.UNFINISHED), (143, Exit.UNFINISHED)])
def test_what_a_shards_exit_means(code: int, verdict: Exit) -> None:
    assert exit_of(code) is verdict


def test_a_budget_stop_is_final_for_the_run_not_retried() -> None:
    assert exit_of(75, "budget") is Exit.BUDGET
    assert exit_of(75, "stopped, resumable") is Exit.UNFINISHED
    assert exit_of(0, "budget") is Exit.DONE


def test_the_retried_exception_survives_pickling_as_ray_ships_it() -> None:
    e = pickle.loads(pickle.dumps(ShardUnfinished(3, 75, "endpoint down")))
    assert (e.shard, e.code, e.message) == (3, 75, "endpoint down")
    assert str(e) == "shard 3 ended unfinished (exit 75): endpoint down"


def test_the_progress_line_over_every_shard() -> None:
    groups = [{"shards": 4, "total": {"done": 1500, "failed": 3, "finished": 1, "running": 3, "rate": 412.4,
                                      "total": 4000}}]
    assert progress_line(groups, 4, 2) == ("ray: 1/4 shards finished, 3 running, 2 retried; 1,500/4,000 done "
                                           "(37.5 %), 3 failed, 412 req/s")
    assert progress_line([], 4, 0) == "ray: 4 shards starting"
    assert progress_line([{"shards": 4, "total": {"done": 10, "failed": 0, "finished": 0, "running": 2,
                                                  "rate": None}}], 4, 0) == (
        "ray: 0/4 shards finished, 2 running; 10 done, 0 failed")


def test_the_drivers_endpoint_settings_go_to_the_shards_environment_never_their_arguments() -> None:
    environ = {"OPENAI_BASE_URL": "http://gw:8000/v1", "OPENAI_API_KEY": "sk-1", "MY_KEY": "k-2", "GW": "g-3",
               "EVALSUP_RING_MB": "8", "EVALSUP_SHARDS": "4", "HOME": "/root", "JK": "j-4"}
    given = {"model": "m", "api_key_env": "MY_KEY", "judge_api_key_env": "JK", "headers": ("X-Gw: env:GW", "X-A: b")}
    opts, env = shard_env(given, environ)
    assert opts == given
    assert env == {"OPENAI_BASE_URL": "http://gw:8000/v1", "OPENAI_API_KEY": "sk-1", "MY_KEY": "k-2", "GW": "g-3",
                   "JK": "j-4", "EVALSUP_RING_MB": "8"}  # not HOME, not the driver's own EVALSUP_SHARDS
    assert shard_env({}, {}) == ({}, {})


def test_a_base_url_holding_a_credential_travels_as_the_environment() -> None:
    for url in ("http://alice:pw-1234@gw/v1", "https://gw/v1?api-key=SECRET123"):
        opts, env = shard_env({"base_url": (url, "http://other/v1"), "model": "m"}, {"OPENAI_BASE_URL": "x"})
        assert opts["base_url"] is None and argv_of(shard_options(opts, 0, 2)) == ["--model", "m"]
        assert env == {"OPENAI_BASE_URL": f"{url},http://other/v1"}
    opts, env = shard_env({"base_url": ("https://gw/v1?sig=SECRET123",),
                           "max_requests_per_s": ("10", "https://gw/v1?sig=SECRET123=4")}, {})
    assert opts["max_requests_per_s"] == ("10", "https://gw/v1=4")  # the endpoint named by its public form
    plain = {"base_url": ("https://gw/v1?api-version=2024-02-01",)}  # nothing secret: stays an option
    assert shard_env(plain, {}) == (plain, {})
    with pytest.raises(CredentialInArgs, match="percent-encode"):
        shard_env({"base_url": ("https://gw/v1?sig=abc,def",)}, {})
    with pytest.raises(CredentialInArgs, match="--judge-api-key-env"):
        shard_env({"judge_base_url": "https://j/v1?code=c0de-1234"}, {})


def test_a_retried_shard_is_one_line_saying_how_its_last_attempt_ended() -> None:
    assert retry_line(1, 4, 2, -9) == ("ray: shard-1-of-4: attempt 1 ended unfinished (killed by signal 9); Ray "
                                       "retries it, resuming from its checkpoint")
    assert "attempt 2 ended unfinished (exit 75)" in retry_line(0, 2, 3, 75)
    assert "(its Ray worker died)" in retry_line(0, 2, 2, None)


def test_run_shards_takes_the_keyword_forms_evalsup_run_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """judge= (a Judge or a dict), response_schema= (a dict or a pydantic model class: written where every node
    sees it, beside the run directory), group_by=: the command run is the one `evalsup run --ray` would be."""
    import orjson

    import evalsup.ray
    from evalsup import Judge

    seen: list[list[str]] = []

    def child(cmd: list[str], *args: Any) -> tuple[int, dict[str, Any], list[str]]:
        seen.append(cmd)
        return 0, {"run_dir": str(tmp_path / "out"), "merged": "m", "total": 1}, []

    monkeypatch.setattr(evalsup.ray, "run_child", child)
    schema = {"type": "object", "required": ["answer"]}
    got = evalsup.ray.run_shards(tmp_path / "t.jsonl", tmp_path / "out", num_shards=2, base_url="http://127.0.0.1:9/v1",
                                 judge=Judge("http://127.0.0.1:8/v1", "j"), response_schema=schema,
                                 group_by="metadata.subject")
    assert got.total == 1
    argv = seen[-1]
    written = tmp_path / "out.response_schema.json"
    assert orjson.loads(written.read_bytes()) == schema
    for pair in (["--scorer", "judge"], ["--judge-base-url", "http://127.0.0.1:8/v1"], ["--judge-model", "j"],
                 ["--response-schema", str(written)], ["--group-by", "metadata.subject"], ["--shards", "2"]):
        assert any(argv[i:i + 2] == pair for i in range(len(argv))), (pair, argv)
    evalsup.ray.run_shards(tmp_path / "t.jsonl", None, num_shards=2, judge={"base_url": "http://127.0.0.1:8/v1"})
    assert "judge" in seen[-1] and "--response-schema" not in seen[-1]
    with pytest.raises(TypeError, match=r"run_shards\(\) got both judge= and judge_model"):
        evalsup.ray.run_shards(tmp_path / "t.jsonl", None, num_shards=2, judge=Judge("http://127.0.0.1:8/v1", "j"),
                               judge_model="k")
    pydantic = pytest.importorskip("pydantic")

    class Pick(pydantic.BaseModel):
        answer: str

    evalsup.ray.run_shards(tmp_path / "t.jsonl", None, num_shards=2, response_schema=Pick)
    beside = tmp_path / "t.run.response_schema.json"  # beside TASKS.run, the run directory without out
    assert orjson.loads(beside.read_bytes())["properties"]["answer"]["type"] == "string"
    assert str(beside) in seen[-1]
