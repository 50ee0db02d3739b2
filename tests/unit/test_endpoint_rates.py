"""Rate limits per endpoint (issue 21 item 1) as units: the option's parsing and errors, the Python API's
forms, the RATE share among live workers, and pick-then-pace with real asyncio pacers. (Real runs against
two mock endpoints: integration/test_endpoint_rates_runs.py.)"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import evalsup
from evalsup.config.options import BY_NAME
from evalsup.config.ratelimits import EndpointRate, parse_rate_limits, rate_share
from evalsup.config.run_config import ConfigError, build_config
from evalsup.mock.server import MockThread
from evalsup.worker.endpoints import EndpointPool
from evalsup.worker.pacing import Pacer
from tests.harness import mock_endpoints

A, B = "http://127.0.0.1:8001/v1", "http://user:s3cret@127.0.0.1:8002/v1"


@pytest.fixture
def two() -> Iterator[list[MockThread]]:
    yield from mock_endpoints(2)


# ----------------------------------------------------------------------------------------- real processes


# ----------------------------------------------------------------------------------------- the option

def test_global_and_per_endpoint_values_and_their_errors() -> None:
    eps = (A, B)
    r = parse_rate_limits(["50", f"{B}=10", "http://127.0.0.1:8001/v1/=2.5"], "http://127.0.0.1:8002/v1=600", eps)
    assert (r.rps, r.tpm) == (50.0, None)  # B named without its credentials, A with a trailing slash
    assert r.endpoints == (EndpointRate(0, 2.5, None), EndpointRate(1, 10.0, 600.0))
    assert parse_rate_limits(("7",), None, eps) == (7.0, None, ())  # the global limit, as before
    assert parse_rate_limits(None, (), eps) == (None, None, ())
    bad = {("5", "6"): "one global limit only", (f"{A}=1", f"{A}/=2"): f"{A} is given twice",
           ("http://elsewhere/v1=3",): "http://elsewhere/v1 is not one of the run's endpoints",
           (f"{A}=0",): "must be a number > 0", ("-1",): "must be a number > 0", ("fast",): "not a number",
           (f"{A}=x",): "not a number", (A,): "not a number", (f"{B}=nan",): "must be a number > 0"}
    for values, says in bad.items():
        with pytest.raises(ConfigError) as e:
            build_config(Path("t.jsonl"), {"base_url": list(eps), "max_requests_per_s": values})
        msg = str(e.value)
        assert msg.startswith("--max-requests-per-s") and says in msg and "s3cret" not in msg, msg
        assert "\n" not in msg
    with pytest.raises(ConfigError) as e:
        build_config(Path("t.jsonl"), {"base_url": list(eps), "max_tokens_per_min": ["http://x/v1=1"]})
    assert str(e.value) == ("--max-tokens-per-min: http://x/v1 is not one of the run's endpoints "
                            "(http://127.0.0.1:8001/v1, http://127.0.0.1:8002/v1)")


def test_python_api_forms_become_flags() -> None:
    o = BY_NAME["max_requests_per_s"]
    assert o.argv(5.0) == ["--max-requests-per-s", "5.0"]
    assert o.argv({A: 10}) == ["--max-requests-per-s", f"{A}=10"]
    assert o.argv([50, {A: 10, B: 2}]) == ["--max-requests-per-s", "50", "--max-requests-per-s", f"{A}=10",
                                           "--max-requests-per-s", f"{B}=2"]
    cfg = build_config(Path("t.jsonl"), {"base_url": [A, B], "max_requests_per_s": [50, {B: 2}],
                                         "max_tokens_per_min": 1000})
    assert (cfg.max_requests_per_s, cfg.max_tokens_per_min, cfg.endpoint_rates) == (
        50.0, 1000.0, (EndpointRate(1, 2.0, None),))
    with pytest.raises(evalsup.BadSettings, match="--max-requests-per-s: http://x/v1 is not one of"):
        evalsup.run("t.jsonl", base_url=[A, B], max_requests_per_s={"http://x/v1": 1})


def test_each_limit_is_split_among_the_live_workers() -> None:
    assert rate_share(None, None, (), "uniform", 3) is None
    assert rate_share(30.0, None, (), "poisson", 3) == {"rps": 10.0, "tpm": None, "arrivals": "poisson"}
    share = rate_share(None, 900.0, (EndpointRate(1, 6.0, None), EndpointRate(2, None, 300.0)), "uniform", 3)
    assert share == {"rps": None, "tpm": 300.0, "arrivals": "uniform", "eps": {"1": [2.0, None], "2": [None, 100.0]}}


# ----------------------------------------------------------------------------------------- pick, then pace

def test_requests_waiting_on_an_endpoints_pacer_count_as_its_load() -> None:
    pool = EndpointPool([A, B])
    pool.all[0].on_wire = 1
    pool.all[1].on_wire = 1
    assert pool.pick(4) is pool.all[0]  # a tie: the first
    pool.all[0].pending = 1
    assert pool.pick(4) is pool.all[1]  # 1 on the wire + 1 waiting on its pacer is more than 1
    pool.all[1].pending = 2
    assert pool.pick(4) is pool.all[0]


def test_pick_then_pace_with_real_pacers() -> None:
    async def go() -> None:
        pool = EndpointPool([A, B])
        glob = Pacer(random.Random(1))
        pool.apply_rate(glob, {"rps": None, "tpm": None, "arrivals": "uniform", "eps": {"0": [4.0, None]}})
        assert pool.paced and pool.all[0].pacer is not None and pool.all[1].pacer is None
        assert not pool.counts_tokens(glob)
        first = await pool.pick_paced(4, 0)  # endpoint 0's first slot is now
        assert first is pool.all[0]
        first.on_wire += 1
        assert await pool.pick_paced(4, 0) is pool.all[1]
        pool.all[1].on_wire += 1
        waiting = asyncio.ensure_future(pool.pick_paced(4, 0))  # a tie again: endpoint 0, whose next slot is later
        await asyncio.sleep(0.02)
        assert not waiting.done() and pool.all[0].pending == 1
        assert await pool.pick_paced(4, 0) is pool.all[1]  # not heaped onto the paced one
        assert await waiting is pool.all[0] and pool.all[0].pending == 0
        # ejected while a request waits on its pacer: that request goes elsewhere
        waiting = asyncio.ensure_future(pool.pick_paced(100, 0))
        await asyncio.sleep(0.02)
        assert pool.all[0].pending == 1
        pool.set_open(0, True)
        assert await waiting is pool.all[1]
        # a frame without the endpoint's limit drops its pacer
        pool.apply_rate(glob, {"rps": 2.0, "tpm": None, "arrivals": "poisson"})
        assert not pool.paced and pool.all[0].pacer is None and glob.poisson

    asyncio.run(go())


def test_tokens_are_charged_to_the_global_and_the_endpoints_budget() -> None:
    async def go() -> None:
        pool = EndpointPool([A, B])
        glob = Pacer(random.Random(1))
        pool.apply_rate(glob, {"rps": None, "tpm": 6000.0, "arrivals": "uniform", "eps": {"1": [None, 600.0]}})
        assert pool.counts_tokens(glob)
        pool.all[0].on_wire = 5  # so that endpoint 1 is picked
        ep = await pool.pick_paced(8, 100)
        assert ep is pool.all[1] and ep.pacer is not None
        assert ep.pacer.tokens == pytest.approx(-100, abs=1)
        ep.correct_usage(glob, 40, 100)  # the answer used 40: 60 given back
        assert ep.pacer.tokens == pytest.approx(-40, abs=1)
        glob.tokens = 0.0
        ep.correct_usage(glob, 130, 100)
        assert glob.tokens == pytest.approx(-30) and ep.pacer.tokens == pytest.approx(-70, abs=1)
        # in debt (10 tokens/s), the endpoint's budget holds the next request to it, counted as its load
        waiting = asyncio.ensure_future(pool.pick_paced(8, 100))
        await asyncio.sleep(0.05)
        assert not waiting.done() and ep.pending == 1
        assert pool.pick(8) is pool.all[1]  # 1 waiting < 5 on endpoint 0's wire
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert ep.pending == 0

    asyncio.run(go())
