"""evalsup serve's live shares of one upstream (``serve.fair.step``): a lone batch gets it all, keys are served
max-min fairly, demand is respected, and the requests the running batches may hold never sum above the total,
whatever the runs report and whenever they report it (randomized)."""

from __future__ import annotations

import random

import pytest

from evalsup.serve.fair import SETTLE_S, Live, Seen, Share, demand, settle, step, targets, water_fill


def run_steps(total: int, batches: dict[str, tuple[str, Seen]], shares: dict[str, Share] | None = None,
              now: float = 100.0) -> dict[str, Share]:
    shares = dict(shares or {b: Share() for b in batches})
    return step(total, [Live(b, owner, seen, shares[b]) for b, (owner, seen) in batches.items()], now)


def test_water_fill_is_max_min() -> None:
    assert water_fill(10, {"a": 2, "b": 100, "c": 100}) == {"a": 2, "b": 4, "c": 4}
    assert water_fill(10, {"a": 1, "b": 2}) == {"a": 1, "b": 2}  # the rest stays out: the caller hands it on
    assert water_fill(7, {"a": 9, "b": 9}) == {"a": 4, "b": 3}
    assert water_fill(0, {"a": 3}) == {"a": 0}


def test_a_lone_batch_gets_the_whole_total() -> None:
    got = run_steps(32, {"b1": ("A", Seen(remaining=1000))})
    assert got["b1"].ceiling == 32
    small = run_steps(32, {"b1": ("A", Seen(remaining=3))})  # it needs 3: the rest is lent all the same
    assert small["b1"].ceiling == 32


def test_keys_are_served_fairly_then_batches() -> None:
    # key A has three batches, key B one: B's gets half, not a quarter
    want = targets(101, [("a1", "A", 1000, True), ("a2", "A", 1000, True), ("a3", "A", 1000, True),
                         ("b1", "B", 1000, True)])
    assert sum(want.values()) == 101
    assert want["b1"] == 50 or want["b1"] == 51
    assert sorted(want[x] for x in ("a1", "a2", "a3")) in ([16, 17, 17], [17, 17, 17], [16, 16, 18], [16, 17, 18])


def test_a_small_demand_leaves_the_rest_to_others() -> None:
    want = targets(64, [("a1", "A", 5, True), ("b1", "B", 1000, True)])
    assert want["b1"] >= 59 and want["a1"] >= 5 and sum(want.values()) == 64


def test_demand_is_capped_by_a_limit_under_its_ceiling() -> None:
    assert demand(Seen(remaining=1000, limit=10, ceiling=64), Share(64, 64)) == 20
    assert demand(Seen(remaining=1000, limit=64, ceiling=64), Share(64, 64)) == 1000  # at its ceiling: wants more
    assert demand(Seen(remaining=7, limit=2, ceiling=64), Share(64, 64)) == 4
    assert demand(Seen(remaining=0), Share()) == 1


def test_a_new_batch_waits_for_room_the_other_really_gave_back() -> None:
    total = 32
    a = {"a": ("A", Seen(remaining=1000, limit=32, in_flight=32, ceiling=32, at=99.0))}
    first = run_steps(total, a)
    assert first["a"] == Share(32, 32, 100.0)
    both = {**a, "b": ("B", Seen(remaining=1000))}
    s = run_steps(total, both, {"a": first["a"], "b": Share()}, now=101.0)
    assert s["a"].ceiling == 16 and s["a"].held == 32  # lowered; its requests still count
    assert s["b"].ceiling == 0  # no room yet: b's run does not start
    # a's run applies 16 at 101.5; its in-flight counts only from heartbeats after that (SETTLE_S)
    seen_a = Seen(remaining=990, limit=16, in_flight=30, ceiling=16, at=101.5)
    s = run_steps(total, {"a": ("A", seen_a), "b": ("B", Seen(1000))}, s, now=102.0)
    assert s["b"].ceiling == 0 and s["a"].held == 32 and s["a"].applied_at == 101.5
    seen_a = Seen(remaining=980, limit=16, in_flight=20, ceiling=16, at=101.5 + SETTLE_S)
    s = run_steps(total, {"a": ("A", seen_a), "b": ("B", Seen(1000))}, s, now=104.0)
    assert (s["a"].held, s["b"].ceiling) == (20, 12)  # b gets only what a gave back so far
    seen_a = Seen(remaining=970, limit=16, in_flight=14, ceiling=16, at=105.0)
    s = run_steps(total, {"a": ("A", seen_a), "b": ("B", Seen(1000))}, s, now=105.5)
    assert (s["a"].ceiling, s["a"].held, s["b"].ceiling) == (16, 16, 16)


def test_a_stale_sample_is_no_evidence() -> None:
    # the run's last sample says 16 and few in flight, but it was taken before the ceiling was written
    lowered = Share(16, 32, written_at=50.0)
    seen = Seen(remaining=100, limit=16, in_flight=2, ceiling=16, at=49.0)
    assert settle(lowered, seen, 60.0).held == 32
    assert settle(lowered, Seen(100, stopped=True), 60.0).held == 16  # no process of the run: nothing in flight


@pytest.mark.parametrize("seed", range(60))
def test_random_runs_never_hold_more_than_the_total(seed: int) -> None:
    """Batches come and go; each run reads its file when it likes, its requests come back when they like, new
    ones go out only under the ceiling it last read; its samples come late or not at all. After every step the
    ceilings and what serve counts held never sum above the total, a raise never takes more than the room free,
    and the requests really in flight never sum above the total."""
    rng = random.Random(seed)
    total = rng.choice([2, 3, 8, 32, 256])
    shares: dict[str, Share] = {}
    owners: dict[str, str] = {}
    applied: dict[str, int] = {}  # the ceiling each started run last read from its file
    in_flight: dict[str, int] = {}
    samples: dict[str, Seen] = {}
    now, n, peak = 0.0, 0, 0
    for _ in range(400):
        now += rng.choice([0.1, 0.5, 1.0, 1.0, 2.5])
        if rng.random() < 0.08 and len(shares) < min(6, total):
            n += 1
            bid = f"b{n}"
            shares[bid], owners[bid] = Share(), rng.choice("ABC")
            samples[bid] = Seen(remaining=rng.randint(0, 500))
        if shares and rng.random() < 0.04:  # a batch ends: its run has exited
            gone = rng.choice(sorted(shares))
            for d in (shares, owners, samples, applied, in_flight):
                d.pop(gone, None)
        settled = {b: settle(sh, samples[b], now) for b, sh in shares.items()}
        free = total - sum(sh.held for sh in settled.values())
        new = step(total, [Live(b, owners[b], samples[b], shares[b]) for b in sorted(shares)], now)
        raised = sum(max(0, sh.held - settled[b].held) for b, sh in new.items())
        assert raised <= max(0, free), (raised, free)
        shares = new
        assert sum(sh.ceiling for sh in shares.values()) <= total
        assert sum(sh.held for sh in shares.values()) <= total
        assert all(sh.held >= sh.ceiling >= 0 for sh in shares.values())
        for bid, sh in shares.items():  # the runs
            if sh.ceiling == 0:
                continue  # not started: serve waits for room
            if bid not in applied or rng.random() < 0.5:  # a run starts with its file; reads it at its ticks
                applied[bid] = sh.ceiling
            cur = in_flight.get(bid, 0)
            cur -= rng.randint(0, cur) if rng.random() < 0.3 else 0  # answers come back, or a slow server holds them
            if cur < applied[bid]:
                cur = rng.randint(cur, applied[bid])  # new requests go out, under the ceiling it applies
            in_flight[bid] = cur
            peak = max(peak, sum(in_flight.values()))
            if rng.random() < 0.6:  # a sample of its memory control: the truth, now
                samples[bid] = Seen(max(0, samples[bid].remaining - rng.randint(0, 5)),
                                    rng.randint(1, applied[bid]), cur, applied[bid], now)
        assert sum(in_flight.values()) <= total, (in_flight, applied, shares)
    assert peak > 0


@pytest.mark.parametrize("seed", range(200))
def test_random_targets_are_max_min_fair_by_key(seed: int) -> None:
    """Whatever the demands: the whole total is given (work-conserving), each batch at least 1; when the demands
    together exceed it, no key gets more than it asks, and a key that gets less than it asks gets at least as
    much as any other key (to one request, the rounding)."""
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    total = rng.randint(n * n, 300)
    batches = [(f"b{i}", rng.choice("ABC"), rng.choice([1, 2, 5, 20, 100, 1000]), True) for i in range(n)]
    got = targets(total, batches)
    assert sum(got.values()) == total and all(v >= 1 for v in got.values())
    demands = {b: d for b, _, d, _ in batches}
    if sum(demands.values()) < total:
        assert all(got[b] >= d for b, d in demands.items())  # every demand met, the rest lent
        return
    keys: dict[str, tuple[int, int]] = {}
    for b, owner, d, _ in batches:
        k_got, k_want = keys.get(owner, (0, 0))
        keys[owner] = (k_got + got[b], k_want + d)
    for k, (k_got, k_want) in keys.items():
        assert k_got <= k_want
        if k_got < k_want:
            assert all(other_got <= k_got + 1 for other_got, _ in keys.values()), (k, keys)


@pytest.mark.parametrize("clamp", [None, 64])
def test_a_batch_whose_target_moves_every_second_still_gives_room_back(clamp: int | None) -> None:
    """A alone holds the whole 256; its adaptive limit wobbles (40-42), so its demand and its target move every
    second; B arrives. B must get room within a few seconds, whether A's run applies the ceilings serve writes or
    clamps them to its own `-- --concurrency 64`; and the held figures never sum above the total."""
    total = 256
    shares = run_steps(total, {"a": ("A", Seen(remaining=100_000))})
    assert shares["a"].ceiling == total
    applied = min(total, clamp or total)
    now = 100.0
    for i in range(12):
        now += 1.0
        limit = 40 + i % 3
        seen_a = Seen(remaining=100_000 - 100 * i, limit=limit, in_flight=min(limit, applied), ceiling=applied,
                      at=now - 0.5)
        shares = run_steps(total, {"a": ("A", seen_a), "b": ("B", Seen(remaining=5_000))},
                           {"a": shares["a"], "b": shares.get("b", Share())}, now=now)
        assert sum(s.held for s in shares.values()) <= total
        applied = min(shares["a"].ceiling, clamp or total)  # the run reads its file at its next tick
    assert shares["b"].ceiling > 0, shares
