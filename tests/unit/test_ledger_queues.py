"""The ledger's queues as the dispatcher takes from them: redo before new tasks, suspects one to a worker."""

from __future__ import annotations

from evalsup.supervisor.ledger import TaskLedger
from evalsup.tasks.reader import TaskRef


def ref(i: int, crashes: int = 0) -> TaskRef:
    return TaskRef(offset=i * 10, line_no=i + 1, id=f"t{i}", crashes=crashes)


def test_take_in_order_and_none_when_empty() -> None:
    led = TaskLedger(max_crashes=3)
    assert led.take_redo() is None and led.take_suspect() is None
    assert not led.has_redo() and not led.has_suspects()
    led.restore([ref(2), ref(0), ref(1, crashes=1), ref(3, crashes=2)], done_after=[])
    assert led.has_redo() and led.has_suspects() and led.waiting() == 4
    assert [led.take_redo().id for _ in range(2)] == ["t0", "t2"]  # type: ignore[union-attr]
    assert led.take_redo() is None and not led.has_redo()
    assert [led.take_suspect().id for _ in range(2)] == ["t1", "t3"]  # type: ignore[union-attr]
    assert led.take_suspect() is None and led.settled()


def test_a_task_taken_and_assigned_is_outstanding_once() -> None:
    led = TaskLedger(max_crashes=3)
    led.open(1)
    led.restore([ref(0)], done_after=[])
    r = led.take_redo()
    assert r is not None
    led.assign(1, r)
    assert [x.id for x in led.outstanding()] == ["t0"]
    led.gone(1, died=False)  # handed back to the front, to be taken again
    assert led.take_redo() is r
