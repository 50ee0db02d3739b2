"""Process tuning shared by the supervisor and its workers."""

from __future__ import annotations


def quiet_gc() -> None:
    """After start-up: move what exists out of the collector's sight and collect young objects less often.

    Both sides allocate many short-lived acyclic objects per task (meta dicts, records); a generation-0
    pass every 700 allocations costs a few percent of CPU for nothing.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
