"""Per-process RSS of a real child process (one that is gone, one that grows). (The cgroup parsers and
detection on fake trees: unit/test_cgroup.py.)"""

from __future__ import annotations

import subprocess
import sys

from evalsup.supervisor.rss import rss_bytes, tree_rss_bytes

# ------------------------------------------------------------------------------------------ parsers


# ------------------------------------------------------------------------------------------ cgroup v2


# ------------------------------------------------------------------------------------------ cgroup v1


# ------------------------------------------------------------------------------------------ this machine


# ------------------------------------------------------------------------------------------ rss


def test_rss_gone_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert rss_bytes(proc.pid) is None
    assert rss_bytes(-1) is None
    assert tree_rss_bytes([proc.pid]) == 0
    assert tree_rss_bytes([]) == 0


def test_rss_child_grows() -> None:
    code = (
        "import sys; b = bytearray(64 * 1024 * 1024); sys.stdout.write('ok\\n'); sys.stdout.flush(); input()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ok\n"
        rss = rss_bytes(proc.pid)
        assert rss is not None and rss >= 64 * 1024 * 1024
    finally:
        proc.kill()
        proc.wait()
