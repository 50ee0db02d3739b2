"""Automatic worker count, the decisions as units (supervisor.scaling): scale up only when every worker is
busy over a full window, a lone worker's share, and CPU seconds read from /proc for this process.
(Real runs: slow/test_scaling.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsup.supervisor.scaling import ScaleUp, cpu_seconds


def test_scale_up_needs_every_worker_busy_over_a_full_window() -> None:
    s = ScaleUp(busy=0.6, window_s=2.0, settle_s=3.0)
    s.observe(0.0, [(1, 0.0), (2, 0.0)])
    s.observe(1.0, [(1, 0.9), (2, 0.9)])
    assert not s.wants_more(1.0), "half a window is not enough to judge"
    s.observe(2.0, [(1, 1.8), (2, 1.1)])
    assert s.loads == pytest.approx({1: 0.9, 2: 0.55})
    assert not s.wants_more(2.0), "worker 2 has CPU to spare"
    s.observe(4.0, [(1, 3.6), (2, 2.9)])
    assert s.wants_more(4.0)  # both at 0.9 over the last two seconds
    s.changed(4.0)
    s.observe(4.5, [(1, 4.0), (2, 3.4), (3, 0.1)])
    s.observe(7.0, [(1, 6.0), (2, 5.4), (3, 2.1)])
    assert not s.wants_more(6.9)
    assert s.wants_more(7.1), "settled, and every worker (the new one too) busy"
    s.observe(9.0, [(1, 7.0), (3, 4.0)])  # worker 2 went away (recycled): forgotten, not counted idle
    assert 2 not in s.loads


def test_cpu_seconds_reads_this_process() -> None:
    import os
    import time

    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after - before >= 0.03
    assert cpu_seconds(2 ** 22 + 12345) is None  # no such process


def test_a_lone_worker_may_hold_the_share_of_one_and_is_recycled_once_it_has_company(tmp_path: Path) -> None:
    from dataclasses import replace

    from evalsup.config.run_config import RunConfig, WorkerConfig
    from evalsup.supervisor.memory import MemoryControl

    mib = 1 << 20
    cfg = RunConfig(tasks_path=tmp_path / "t.jsonl", run_dir=tmp_path, workers=4, autoscale=True,
                    worker=WorkerConfig(base_url="http://127.0.0.1:9/v1", concurrency=64), memory_limit=1000 * mib)
    alone = MemoryControl(cfg, tmp_path / "a.jsonl")
    fixed = MemoryControl(replace(cfg, autoscale=False), tmp_path / "f.jsonl")
    try:
        # the one worker carries every request: it may grow to what one of four could not
        assert alone.recycle.decide(300 * mib, 0, None) is None
        assert fixed.recycle.decide(300 * mib, 0, None) is not None  # one of four fixed workers: too big
        hard = alone.recycle.hard_rss
        alone.set_workers(2)
        assert alone.recycle.decide(300 * mib, 0, None) == "rss", "one of two: drained and replaced"
        assert alone.recycle.hard_rss == hard, "a worker grown while alone is drained, never killed for it"
    finally:
        alone.close()
        fixed.close()
