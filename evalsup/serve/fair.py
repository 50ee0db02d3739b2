"""Which queued batch starts next, which running one yields its slot, and each running batch's live share of an
upstream (pure: no I/O, time passed in).

Slots (docs/serve.md): at most --max-running-batches runs at once. When a slot frees, the key (owner) that
has waited longest since one of its batches last started goes next (a key never served first), and of its batches
the oldest: keys are served round-robin, so a key's large batch, or many of its batches, never starve another
key's small one that came later. And when every slot is taken, a key with a batch waiting and none running gets
one at once: the newest batch of the key that holds the most slots (at least two) yields its slot (its run
drains and checkpoints, and the batch waits in line again, in_progress, to resume exactly once where it stopped).

Shares (``step``): every run is started with --max-concurrency TOTAL (the whole upstream limit) and serve writes
its ceiling into its run directory's ``concurrency`` file (``supervisor.ceiling``), recomputed every second from
what each run's status says. The policy is work-conserving max-min fairness by key, then by batch:

- a batch's demand is what it can use: its lines not yet answered, and, when its adaptive limit sits below the
  ceiling its run applies, no more than twice that limit (it grows back as the limit climbs);
- TOTAL is water-filled over the keys' demands (a key's: its batches' summed), then each key's part over its
  batches'; what no demand takes is handed out equally, so a lone batch gets all of TOTAL and a batch whose limit
  climbs finds room at once; every batch gets at least 1 (taken from the largest share);
- moves are strict: a lowered ceiling takes effect only as the run's requests come back, so a lowered batch is
  counted at what it may still hold (``Share.held``: its old figure until its run is seen applying the new
  ceiling, then the larger of the ceiling and the in-flight its run reports from heartbeats sent after that),
  and a raise takes only room that is really free. So the ceilings of the running batches, and the requests they
  hold, never sum above TOTAL: the upstream never sees more than TOTAL in flight at once from serve.

A batch not started yet (``Share.ceiling`` 0) starts only once it is given at least 1: it waits for room another
batch gives back. Invariants (tests/unit/test_serve_fair.py, randomized): the ceilings and the held figures sum to
at most TOTAL; a lone batch gets TOTAL; no batch above its demand while another key's is below its fair level;
a raise never exceeds the free room."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

# A run's in-flight figure counts as evidence once every worker has sent a heartbeat (every 1 s) after its run
# applied the ceiling, and one more second for a loaded machine.
SETTLE_S = 2.0


@dataclass(frozen=True)
class Queued:
    batch_id: str
    owner: str
    created_at: float


def next_batch(queued: Sequence[Queued], last_start: Mapping[str, float]) -> str | None:
    """The batch to start now, of those queued, given when each owner's last batch started."""
    if not queued:
        return None
    best = min(queued, key=lambda q: (last_start.get(q.owner, float("-inf")), q.created_at, q.batch_id))
    return best.batch_id


@dataclass(frozen=True)
class Running:
    batch_id: str
    owner: str
    started: float


def preempt(running: Sequence[Running], queued: Sequence[Queued], max_running: int) -> str | None:
    """The running batch that yields its slot now (see the module's doc), or None."""
    if len(running) < max_running or not queued:
        return None
    held = Counter(r.owner for r in running)
    if all(held[q.owner] for q in queued):
        return None
    owner, n = max(held.items(), key=lambda kv: kv[1])
    if n < 2:
        return None
    return max((r for r in running if r.owner == owner), key=lambda r: (r.started, r.batch_id)).batch_id


@dataclass(frozen=True)
class Seen:
    """What serve knows of a running batch's run now: its lines not yet answered and, from its last memory sample
    (``tools.status.run_status``), its adaptive limit, requests in flight, the ceiling it applies, and when."""

    remaining: int
    limit: int | None = None  # its workers' (adaptive) limits summed; each is under the ceiling
    in_flight: int | None = None
    ceiling: int | None = None  # the ceiling its run reports applying (RUN_DIR/concurrency)
    at: float | None = None  # when its run took that sample
    stopped: bool = False  # no process of its run is alive now: nothing of it is in flight


@dataclass(frozen=True)
class Share:
    """What serve gave a running batch: the ceiling in its file (0: not started, waiting for room) and what it may
    still have in flight (``held`` >= ``ceiling``: more while a lowering is not yet seen done)."""

    ceiling: int = 0
    held: int = 0
    written_at: float = 0.0  # when the ceiling last changed
    applied_at: float | None = None  # a lowering: its run's first sample (after written_at) applying it

    @property
    def lowering(self) -> bool:
        return self.held > self.ceiling


@dataclass(frozen=True)
class Live:
    batch_id: str
    owner: str
    seen: Seen
    share: Share


def demand(seen: Seen, share: Share) -> int:
    """What a batch can use now (at least 1): its lines not yet answered, and no more than twice its adaptive limit
    when that sits below the ceiling its run applies."""
    want = max(1, seen.remaining)
    cap = seen.ceiling if seen.ceiling is not None else share.ceiling
    if seen.limit and cap and seen.limit < cap:
        want = min(want, 2 * seen.limit)
    return want


def settle(share: Share, seen: Seen, now: float) -> Share:
    """``share`` with what the run's status proves: a lowering done as far as its in-flight shows."""
    if not share.lowering:
        return share
    if seen.stopped:
        return replace(share, held=share.ceiling, applied_at=None)
    applied = share.applied_at
    # the run applies a ceiling written since the lowering began: the one its file says now, or one written
    # before it (lowered again since), or the one it clamps to (`-- --concurrency N`): whichever, its in-flight
    # from then on stays under the larger of that ceiling and what it had in flight
    if applied is None and seen.at is not None and seen.at > share.written_at and seen.ceiling is not None:
        applied = seen.at
    held = share.held
    if applied is not None and seen.at is not None and seen.at >= applied + SETTLE_S and seen.in_flight is not None \
            and seen.ceiling is not None:
        held = max(share.ceiling, min(held, max(seen.ceiling, seen.in_flight)))
    return Share(share.ceiling, held, share.written_at, None if held <= share.ceiling else applied)


def water_fill(total: int, demands: Mapping[str, int]) -> dict[str, int]:
    """Max-min fair integers: each gets min(demand, level), the level as high as ``total`` allows; what is left
    when every demand is met stays out (the caller hands it on). Ties broken by name."""
    out: dict[str, int] = {}
    left = total
    order = sorted(demands, key=lambda k: (demands[k], k))
    for i, k in enumerate(order):
        n = len(order) - i
        if demands[k] <= left // n:
            out[k] = demands[k]
            left -= demands[k]
            continue
        for j, rest in enumerate(sorted(order[i:])):  # all the rest want more than an equal part: split evenly
            out[rest] = left // n + (1 if j < left % n else 0)
        return out
    return out


def targets(total: int, batches: Sequence[tuple[str, str, int, bool]]) -> dict[str, int]:
    """Each batch's fair ceiling: (batch id, owner, demand, started) each. Max-min by key, then by batch, over the
    demands; the rest equally; then at least 1 each (from the largest), but a batch not started gets 0 when TOTAL
    has no 1 left for it (it waits for room)."""
    if not batches:
        return {}
    order = sorted(batches, key=lambda b: (not b[3], b[0]))  # started ones keep their 1 first
    takes = {b[0] for i, b in enumerate(order) if i < total or b[3]}
    by_key: dict[str, dict[str, int]] = defaultdict(dict)
    for bid, owner, want, _ in batches:
        if bid in takes:
            by_key[owner][bid] = max(1, want)
    per_key = water_fill(total, {k: sum(bs.values()) for k, bs in by_key.items()})
    out = {b[0]: 0 for b in batches}
    for k, bs in by_key.items():
        out.update(water_fill(per_key[k], bs))
    left = total - sum(out.values())
    have = sorted(takes)
    for j, bid in enumerate(have):  # what no demand takes, equally (work-conserving)
        out[bid] += left // len(have) + (1 if j < left % len(have) else 0)
    for bid in have:  # a key with more batches than its part: each of them 1, from the largest
        if out[bid] == 0:
            donor = max(have, key=lambda x: (out[x], x))
            if out[donor] > 1:
                out[donor] -= 1
            out[bid] = 1
    return out


def step(total: int, running: Sequence[Live], now: float) -> dict[str, Share]:
    """Every running batch's share now (see the module's doc): lowerings at once, raises from free room only."""
    settled = {b.batch_id: settle(b.share, b.seen, now) for b in running}
    want = targets(total, [(b.batch_id, b.owner, demand(b.seen, settled[b.batch_id]), settled[b.batch_id].ceiling > 0)
                           for b in running])
    out: dict[str, Share] = {}
    for bid, s in settled.items():
        if want[bid] < s.ceiling:  # lowered now; what it holds is counted until its run shows it gave it back
            # lowered again while a lowering is under way: its start and evidence stand (a target that moves every
            # second must not keep the old figure held for ever)
            out[bid] = Share(want[bid], max(s.held, s.ceiling), *((s.written_at, s.applied_at) if s.lowering
                                                                    else (now, None)))
        else:
            out[bid] = s
    free = total - sum(s.held for s in out.values())
    for bid in sorted(out, key=lambda b: (out[b].ceiling, b)):  # the furthest behind (a batch waiting) first
        s = out[bid]
        if want[bid] <= s.ceiling:
            continue
        up = min(want[bid], s.held + max(0, free))  # up to what it holds is no new room
        if up <= s.ceiling:
            continue
        free -= max(0, up - s.held)
        out[bid] = Share(up, max(up, s.held), now, None) if up >= s.held else \
            Share(up, s.held, s.written_at, s.applied_at)  # still lowering: its evidence stands
    return out
