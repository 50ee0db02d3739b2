"""Rate limits per endpoint (issue 21 item 1): --max-requests-per-s / --max-tokens-per-min URL=N beside the
global N, in real runs against two mock endpoints. (The option's parsing, the RATE share and pick-then-pace
as units: unit/test_endpoint_rates.py.)"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from evalsup.mock.server import MockThread
from tests.harness import assert_exactly_once, mock_endpoints, run_cli, write_tasks

A, B = "http://127.0.0.1:8001/v1", "http://user:s3cret@127.0.0.1:8002/v1"


@pytest.fixture
def two() -> Iterator[list[MockThread]]:
    yield from mock_endpoints(2)


def paced_count_bound(arrivals: list[float], limit: float, workers: int) -> tuple[int, float]:
    """(requests seen, the most a limit of ``limit``/s allows over their span, generously): one start per
    1/limit s, each worker's first slot (they may coincide), and the first worker's full share for the moment
    before the second starts; 20 % and 2 more for the mock's clock."""
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return len(arrivals), 1.2 * limit * span + workers + 2


# ----------------------------------------------------------------------------------------- real processes

def test_an_endpoints_own_limit_holds_with_the_global_one(tmp_path: Path, two: list[MockThread]) -> None:
    n = 60
    tasks = write_tasks(tmp_path / "t.jsonl", n, form="prompt", extra={"mock": {"delay_s": 0.05}})
    a, b = two
    r = run_cli("run", "-w", "2", "-c", "8", "--no-check", "--model", "mock-model", "--base-url", a.url,
                "--base-url", b.url + "/", "--max-requests-per-s", f"{b.url}=5", "--max-requests-per-s", "40",
                str(tasks))
    assert r.returncode == 0, r.stderr
    recs = assert_exactly_once(tmp_path / "t.run", {f"t{i}" for i in range(n)})
    assert [x for x in recs if x["error"] is not None] == []
    served = Counter(x["metrics"]["endpoint"]["index"] for x in recs)
    at_a, at_b = (sorted(m.stats()["arrivals"]) for m in two)
    assert (served[0], served[1]) == (len(at_a), len(at_b)) and served[0] + served[1] == n
    seen, most = paced_count_bound(at_b, 5, workers=2)
    assert 1 <= seen <= most, f"endpoint B served {seen} requests where 5/s allows {most:.1f}"
    assert served[0] > served[1], served  # A, unlimited of its own, took the rest
    for arrivals in (at_a, at_a + at_b):  # the global limit holds for all requests (A's are some of them)
        seen, most = paced_count_bound(arrivals, 40, workers=2)
        assert seen <= most, f"{seen} requests where the global 40/s allows {most:.1f}"


def test_a_limit_for_no_endpoint_is_one_line_and_exit_2(tmp_path: Path, two: list[MockThread]) -> None:
    tasks = write_tasks(tmp_path / "t.jsonl", 3)
    a, b = two
    secret_b = b.url.replace("http://", "http://user:s3cret@")
    r = run_cli("run", "--model", "mock-model", "--base-url", a.url, "--base-url", secret_b,
                "--max-tokens-per-min", "http://127.0.0.1:1/v1=500", str(tasks))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("evalsup: --max-tokens-per-min: http://127.0.0.1:1/v1 is not one of")
    assert a.url in lines[0] and b.url in lines[0] and "s3cret" not in r.stderr
    assert not (tmp_path / "t.run").exists()


# ----------------------------------------------------------------------------------------- the option


# ----------------------------------------------------------------------------------------- pick, then pace
