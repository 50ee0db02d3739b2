"""The task ledger: who holds which outstanding task. No I/O, no clock.

Design invariants 1, 2 and 4 live here (see docs/architecture.md):
- per-task state exists only while a task is outstanding: held by a worker, waiting to be redone, or a suspect;
- every outstanding task is held by exactly one worker, or waits in exactly one queue;
- when a worker goes, what it held goes back to the front of the queues, its crash count raised if the worker
  died while working on it; at ``max_crashes`` it is handed out no more (the arbiter writes it as
  ``worker_crashed``);
- the queues are taken from only here (``take_redo``, ``take_suspect``): the arbiter asks, it never pops them;
- the checkpoint's O is everything held or waiting; D (ids finished after an earlier run's checkpoint) is
  skipped once when the reader meets it, and kept as ``done_ahead`` until then.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

from evalsup.tasks.reader import TaskRef


class LedgerError(Exception):
    """A call that would break exactly-once (a bug in the caller, never the user's input)."""


class TaskLedger:
    def __init__(self, max_crashes: int) -> None:
        self.max_crashes = max_crashes
        self.redo: collections.deque[TaskRef] = collections.deque()  # handed out before new tasks
        # tasks that were being worked on when their worker died: each goes to a worker holding no other
        # suspect, so a poison task cannot take innocent tasks down with it again and again
        self.suspects: collections.deque[TaskRef] = collections.deque()
        self.done_ahead: set[str] = set()  # D: ids already in results.jsonl, met again ahead in the input
        self._held: dict[int, dict[int, TaskRef]] = {}  # holder -> {key (byte offset): task}

    # ----- a run's start -----

    def restore(self, outstanding: Iterable[TaskRef], done_after: Iterable[str]) -> None:
        """From a checkpoint: O, less what finished after it (D), waits to be redone; the rest of D is
        skipped when the reader reaches it."""
        d = set(done_after)
        for ref in sorted(outstanding, key=lambda r: r.offset):
            if ref.id in d:
                d.discard(ref.id)
            elif ref.crashes:
                self.suspects.append(ref)
            else:
                self.redo.append(ref)
        self.done_ahead = d

    def skip(self, task_id: str) -> bool:
        """True (once) for a task read from the input whose record is already written."""
        if task_id in self.done_ahead:
            self.done_ahead.discard(task_id)
            return True
        return False

    # ----- holders -----

    def open(self, holder: int) -> dict[int, TaskRef]:
        """A new worker's account; the returned dict is a read-only view of what it holds."""
        if holder in self._held:
            raise LedgerError(f"holder {holder} opened twice")
        held: dict[int, TaskRef] = {}
        self._held[holder] = held
        return held

    def assign(self, holder: int, ref: TaskRef) -> None:
        held = self._held[holder]
        if ref.offset in held:
            raise LedgerError(f"task at {ref.offset} assigned twice")
        held[ref.offset] = ref

    def started(self, holder: int, key: int) -> None:
        ref = self._held[holder].get(key)
        if ref is not None:
            ref.started = True

    def finished(self, holder: int, key: int) -> TaskRef | None:
        """The holder's result for ``key`` is being written: the task leaves the ledger. None if the holder
        does not hold it (its result must then not be written)."""
        held = self._held.get(holder)
        return None if held is None else held.pop(key, None)

    def unfinish(self, holder: int, ref: TaskRef) -> None:
        """Undo ``finished`` for a result that could not be written (a bad ring reference): the task stays
        the holder's and goes on with the others when the holder goes."""
        self._held[holder][ref.offset] = ref

    def returned(self, holder: int, keys: Iterable[int]) -> int:
        """The holder handed back tasks it had not begun (on DRAIN): to the front, untouched."""
        held = self._held.get(holder, {})
        n = 0
        for k in keys:
            ref = held.pop(k, None)
            if ref is not None:
                ref.started = False
                (self.suspects if ref.crashes else self.redo).appendleft(ref)
                n += 1
        return n

    def gone(self, holder: int, died: bool) -> list[TaskRef]:
        """The holder's process is gone: what it held goes back to the front of the queues (in input order),
        with a crash counted against each task it had begun if it died. Returns the tasks that reached
        ``max_crashes``: out of the ledger, to be written as failed."""
        held = self._held.pop(holder, {})
        poisoned: list[TaskRef] = []
        for ref in sorted(held.values(), key=lambda r: r.offset, reverse=True):
            if died and ref.started:  # only what it was working on; queued tasks are not suspects
                ref.crashes += 1
            ref.started = False
            if ref.crashes >= self.max_crashes:
                poisoned.append(ref)
            elif ref.crashes:
                self.suspects.appendleft(ref)
            else:
                self.redo.appendleft(ref)
        held.clear()
        poisoned.reverse()
        return poisoned

    # ----- the queues, as the dispatcher takes from them -----

    def put_back(self, ref: TaskRef) -> None:
        """A task taken (a redo, a suspect, or read from the input) but not handed out, because the budget would
        pass a cap (supervisor.budget): first again when dispatch goes on, and in O for the checkpoint."""
        (self.suspects if ref.crashes else self.redo).appendleft(ref)

    def take_redo(self) -> TaskRef | None:
        """The next task to redo (handed back or left outstanding by an earlier run), before any new task."""
        return self.redo.popleft() if self.redo else None

    def take_suspect(self) -> TaskRef | None:
        """The next suspect, for a worker that holds no other suspect (``holds_suspect``)."""
        return self.suspects.popleft() if self.suspects else None

    # ----- questions -----

    def has_redo(self) -> bool:
        return bool(self.redo)

    def has_suspects(self) -> bool:
        return bool(self.suspects)


    def holds_suspect(self, holder: int) -> bool:
        return any(r.crashes for r in self._held.get(holder, {}).values())

    def any_started(self) -> bool:
        return any(r.started for held in self._held.values() for r in held.values())

    def in_flight(self) -> int:
        """Tasks held by workers (queued in them or begun)."""
        return sum(len(held) for held in self._held.values())

    def waiting(self) -> int:
        return len(self.redo) + len(self.suspects)

    def settled(self) -> bool:
        """Nothing held and nothing waiting: every task handed out has its record."""
        return not self.redo and not self.suspects and not any(self._held.values())

    def outstanding(self) -> Iterator[TaskRef]:
        """O for a checkpoint: every task held or waiting."""
        for held in self._held.values():
            yield from held.values()
        yield from self.redo
        yield from self.suspects
