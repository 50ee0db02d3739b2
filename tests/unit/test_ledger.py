"""The task ledger without processes: invariants 1, 2 and 4 under any order of events.

The randomized test drives a model of a run (an input of tasks, workers that take, begin, finish, hand back
and die, checkpoints, and crashes restored from the last checkpoint) and checks that when the run settles,
every task has exactly one record, and that nothing is held by two owners at any moment.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from evalsup.supervisor.ledger import LedgerError, TaskLedger
from evalsup.tasks.reader import TaskRef


def ref(i: int, crashes: int = 0) -> TaskRef:
    return TaskRef(offset=i * 10, line_no=i + 1, id=f"t{i}", crashes=crashes)


def test_gone_hands_back_in_input_order_and_blames_only_started() -> None:
    led = TaskLedger(max_crashes=3)
    led.open(1)
    for i in range(4):
        led.assign(1, ref(i))
    led.started(1, 10)  # t1 begun
    led.started(1, 30)  # t3 begun
    poisoned = led.gone(1, died=True)
    assert poisoned == []
    assert [r.id for r in led.redo] == ["t0", "t2"]  # queued ones: untouched, in input order
    assert [(r.id, r.crashes) for r in led.suspects] == [("t1", 1), ("t3", 1)]
    assert led.in_flight() == 0 and led.waiting() == 4


def test_planned_exit_blames_nothing() -> None:
    led = TaskLedger(max_crashes=1)
    led.open(1)
    led.assign(1, ref(0))
    led.started(1, 0)
    assert led.gone(1, died=False) == []
    assert [(r.id, r.crashes) for r in led.redo] == [("t0", 0)]


def test_poisoned_after_max_crashes_leaves_the_ledger() -> None:
    led = TaskLedger(max_crashes=2)
    led.open(1)
    led.assign(1, ref(0, crashes=1))
    led.started(1, 0)
    assert [r.id for r in led.gone(1, died=True)] == ["t0"]
    assert led.settled()


def test_returned_goes_to_the_front() -> None:
    led = TaskLedger(max_crashes=3)
    led.redo.append(ref(9))
    led.open(1)
    led.assign(1, ref(0))
    led.assign(1, ref(1, crashes=1))
    assert led.returned(1, [0, 10, 999]) == 2
    assert [r.id for r in led.redo] == ["t0", "t9"]
    assert [r.id for r in led.suspects] == ["t1"]


def test_restore_skips_what_finished_after_the_checkpoint() -> None:
    led = TaskLedger(max_crashes=3)
    led.restore([ref(3), ref(1, crashes=2), ref(2)], done_after={"t2", "t7"})
    assert [r.id for r in led.redo] == ["t3"]
    assert [r.id for r in led.suspects] == ["t1"]
    assert led.done_ahead == {"t7"}
    assert led.skip("t7") and not led.skip("t7")


def test_a_task_is_never_assigned_twice_to_one_holder() -> None:
    led = TaskLedger(max_crashes=3)
    led.open(1)
    led.assign(1, ref(0))
    with pytest.raises(LedgerError):
        led.assign(1, ref(0))
    with pytest.raises(LedgerError):
        led.open(1)


def test_finished_by_a_holder_that_does_not_hold_it_is_refused() -> None:
    led = TaskLedger(max_crashes=3)
    led.open(1)
    led.open(2)
    led.assign(1, ref(0))
    assert led.finished(2, 0) is None
    assert led.finished(1, 0) is not None
    assert led.finished(1, 0) is None


class Run:
    """A model run around one ledger: the input, the results file, checkpoints, workers."""

    def __init__(self, n: int, rng: random.Random, max_crashes: int = 3) -> None:
        self.n, self.rng = n, rng
        self.results: list[str] = []  # ids written, in order (the results file)
        self.durable = 0  # results fsynced and covered by the last checkpoint
        self.max_crashes = max_crashes
        self.checkpoint: tuple[int, list[TaskRef], list[str], int] = (0, [], [], 0)  # F, O, D-ahead, L
        self.boot(0, [], [], [])

    def boot(self, frontier: int, outstanding: list[TaskRef], ahead: list[str], after: list[str]) -> None:
        self.led = TaskLedger(self.max_crashes)
        self.led.restore([TaskRef(r.offset, r.line_no, r.id, r.crashes) for r in outstanding], [*ahead, *after])
        self.frontier = frontier
        self.holders: list[int] = []
        self.next_holder = 1

    def next_task(self) -> TaskRef | None:
        if self.led.redo:
            return self.led.redo.popleft()
        while self.frontier < self.n:
            r = ref(self.frontier)
            self.frontier += 1
            if not self.led.skip(r.id):
                return r
        return None

    def step(self) -> None:
        led, rng = self.led, self.rng
        op = rng.random()
        if not self.holders or op < 0.08:
            h = self.next_holder
            self.next_holder += 1
            led.open(h)
            self.holders.append(h)
        elif op < 0.40:
            h = rng.choice(self.holders)
            if led.suspects and not led.holds_suspect(h):
                led.assign(h, led.suspects.popleft())
            elif (t := self.next_task()) is not None:
                led.assign(h, t)
        elif op < 0.55:
            h = rng.choice(self.holders)
            held = list(led._held[h])
            if held:
                led.started(h, rng.choice(held))
        elif op < 0.80:
            h = rng.choice(self.holders)
            held = list(led._held[h])
            if held and (r := led.finished(h, rng.choice(held))) is not None:
                self.results.append(r.id)
        elif op < 0.85:
            h = rng.choice(self.holders)
            held = list(led._held[h])
            led.returned(h, rng.sample(held, k=len(held) // 2))
        elif op < 0.92:
            h = self.holders.pop(rng.randrange(len(self.holders)))
            for r in led.gone(h, died=rng.random() < 0.5):
                self.results.append(r.id)  # written as worker_crashed
        elif op < 0.97:
            self.take_checkpoint()
        else:
            self.crash()

    def take_checkpoint(self) -> None:
        self.durable = len(self.results)
        self.checkpoint = (self.frontier, [TaskRef(r.offset, r.line_no, r.id, r.crashes)
                                           for r in self.led.outstanding()], sorted(self.led.done_ahead),
                           self.durable)

    def crash(self) -> None:
        """kill -9: what was written but not fsynced may or may not survive; resume from the checkpoint."""
        keep = self.rng.randint(self.durable, len(self.results))
        self.results = self.results[:keep]
        frontier, outstanding, ahead, length = self.checkpoint
        self.boot(frontier, outstanding, ahead, self.results[length:])

    def invariant(self) -> None:
        held = [r.offset for r in self.led.outstanding()]
        assert len(held) == len(set(held)), "a task held twice"
        assert len(self.results) == len(set(self.results)), "a task written twice"

    def settle(self) -> None:
        """No more crashes: finish everything."""
        for _ in range(100_000):
            if self.frontier >= self.n and self.led.settled():
                return
            if not self.holders:
                self.holders.append(self.next_holder)
                self.led.open(self.next_holder)
                self.next_holder += 1
            h = self.holders[0]
            if self.led.suspects and not self.led.holds_suspect(h):
                self.led.assign(h, self.led.suspects.popleft())
            elif (t := self.next_task()) is not None:
                self.led.assign(h, t)
            for hh in self.holders:
                for k in list(self.led._held[hh]):
                    r = self.led.finished(hh, k)
                    assert r is not None
                    self.results.append(r.id)
        raise AssertionError("did not settle")


@pytest.mark.parametrize("seed", range(40))
def test_any_sequence_leaves_every_task_exactly_once(seed: int) -> None:
    rng = random.Random(seed)
    run = Run(n=rng.randint(1, 60), rng=rng)
    for _ in range(rng.randint(50, 600)):
        run.step()
        run.invariant()
    run.settle()
    counts = Counter(run.results)
    assert set(counts) == {f"t{i}" for i in range(run.n)}, "a task lost"
    assert max(counts.values()) == 1, f"written twice: {[k for k, v in counts.items() if v > 1]}"
