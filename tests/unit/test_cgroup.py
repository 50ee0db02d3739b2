"""Memory probes: cgroup parsers, detection on fake trees, sampling, and this process's RSS. (RSS of a
real child process: integration/test_cgroup_rss.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalsup.config.cgroup import CgroupProbe, CgroupSample, parse_keyed, parse_limit, parse_proc_cgroup, parse_psi
from evalsup.supervisor.rss import own_rss_bytes, rss_bytes, tree_rss_bytes

V1_UNLIMITED = "9223372036854771712"

HYBRID_PROC = """\
9:name=systemd:/
8:pids:/
7:blkio:/
4:memory:/process_api/abc
3:cpuset:/
1:cpu,cpuacct:/
0::/
"""


def write(base: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)


def proc_file(tmp_path: Path, text: str) -> str:
    p = tmp_path / "proc_self_cgroup"
    p.write_text(text)
    return str(p)


# ------------------------------------------------------------------------------------------ parsers


def test_parse_proc_cgroup_v2_only() -> None:
    assert parse_proc_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") == (
        "/user.slice/user-1000.slice/session-2.scope",
        None,
    )


def test_parse_proc_cgroup_hybrid() -> None:
    assert parse_proc_cgroup(HYBRID_PROC) == ("/", "/process_api/abc")


def test_parse_proc_cgroup_v1_combined_controllers_and_junk() -> None:
    text = "garbage\n\n5:cpu,memory:/docker/xyz\n2:cpuacct:/\n"
    assert parse_proc_cgroup(text) == (None, "/docker/xyz")
    assert parse_proc_cgroup("") == (None, None)


def test_parse_proc_cgroup_path_with_colon() -> None:
    assert parse_proc_cgroup("0::/a:b\n") == ("/a:b", None)


def test_parse_limit() -> None:
    assert parse_limit("max\n") is None
    assert parse_limit("536870912\n") == 536870912
    assert parse_limit(V1_UNLIMITED) is None
    assert parse_limit(str(2**62)) is None
    assert parse_limit(str(2**62 - 4096)) == 2**62 - 4096
    assert parse_limit("0") == 0
    with pytest.raises(ValueError):
        parse_limit("bogus")


def test_parse_keyed() -> None:
    text = "anon 1000\nfile 2000\ninactive_file 1500\nbroken line here\nnotanint x\n\n"
    assert parse_keyed(text) == {"anon": 1000, "file": 2000, "inactive_file": 1500}
    events = "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n"
    assert parse_keyed(events)["oom_kill"] == 1
    assert parse_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")["oom_kill"] == 4


def test_parse_psi() -> None:
    text = (
        "some avg10=12.50 avg60=3.25 avg300=0.80 total=123456\n"
        "full avg10=1.00 avg60=0.10 avg300=0.00 total=789\n"
    )
    psi = parse_psi(text)
    assert psi["some"]["avg10"] == 12.5
    assert psi["some"]["avg60"] == 3.25
    assert psi["some"]["total"] == 123456.0
    assert psi["full"]["avg10"] == 1.0
    assert parse_psi("") == {}
    assert parse_psi("some avg10=oops avg60=1.0\n") == {"some": {"avg60": 1.0}}


# ------------------------------------------------------------------------------------------ cgroup v2


def v2_tree(root: Path) -> None:
    write(
        root,
        {
            "cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n",
            # the pod-level ancestor holds the tightest memory.max
            "kubepods/memory.max": "1073741824\n",
            "kubepods/memory.high": "max\n",
            "kubepods/memory.events": "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n",
            "kubepods/pod1/memory.max": "max\n",
            "kubepods/pod1/memory.high": "900000000\n",
            "kubepods/pod1/ctr/memory.current": "500000000\n",
            "kubepods/pod1/ctr/memory.max": "2147483648\n",
            "kubepods/pod1/ctr/memory.high": "max\n",
            "kubepods/pod1/ctr/memory.stat": "anon 300000000\nfile 200000000\ninactive_file 120000000\n",
            "kubepods/pod1/ctr/memory.events": "low 0\nhigh 0\nmax 2\noom 0\noom_kill 0\n",
            "kubepods/pod1/ctr/memory.pressure": (
                "some avg10=4.20 avg60=1.00 avg300=0.20 total=1000\n"
                "full avg10=0.50 avg60=0.10 avg300=0.00 total=100\n"
            ),
        },
    )


def test_v2_detect_and_nested_limits(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v2_tree(root)
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/kubepods/pod1/ctr\n"))
    assert probe.source == "cgroup2"
    assert probe.path == str(root / "kubepods/pod1/ctr")
    s = probe.sample()
    assert s.source == "cgroup2"
    assert s.usage_bytes == 500_000_000
    assert s.working_set_bytes == 380_000_000
    assert s.high_bytes == 900_000_000
    assert s.max_bytes == 1_073_741_824
    assert s.limit_bytes == 900_000_000  # tightest of high and max on the whole path
    # events come from the owner of the tightest limit (pod1 has none: falls back to own dir)
    assert s.events["max"] == 2
    assert s.psi_some_avg10 == 4.2
    assert s.psi_full_avg10 == 0.5


def test_v2_events_read_from_limit_owner(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v2_tree(root)
    (root / "kubepods/pod1/memory.high").write_text("max\n")
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/kubepods/pod1/ctr\n"))
    s = probe.sample()
    assert s.limit_bytes == 1_073_741_824
    assert s.high_bytes is None
    # kubepods owns the limit, so its (hierarchical) counters are the ones that see the limit being hit
    assert s.events == {"low": 0, "high": 0, "max": 7, "oom": 1, "oom_kill": 1}


def test_v2_missing_files_give_none(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root, {"cgroup.controllers": "memory pids\n", "a/memory.current": "1234\n"})
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/a\n"))
    s = probe.sample()
    assert s == CgroupSample("cgroup2", 1234, 1234, None, None, None, {}, None, None)


def test_v2_all_max_means_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(
        root,
        {
            "cgroup.controllers": "memory\n",
            "a/memory.current": "100\n",
            "a/memory.max": "max\n",
            "a/memory.high": "max\n",
            "a/memory.stat": "inactive_file 500\n",  # more cache than usage: floored at 0
        },
    )
    s = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/a\n")).sample()
    assert s.limit_bytes is None and s.max_bytes is None and s.high_bytes is None
    assert s.working_set_bytes == 0


def test_v2_cgroupns_root_path(tmp_path: Path) -> None:
    """Inside a cgroup namespace /proc/self/cgroup shows "/" and the mount root is our own cgroup."""
    root = tmp_path / "cg"
    write(
        root,
        {
            "cgroup.controllers": "memory pids\n",
            "memory.current": "2000\n",
            "memory.max": "4096\n",
            "memory.stat": "inactive_file 500\n",
        },
    )
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/\n"))
    assert probe.source == "cgroup2"
    assert probe.path == str(root)
    s = probe.sample()
    assert (s.usage_bytes, s.working_set_bytes, s.limit_bytes) == (2000, 1500, 4096)


def test_v2_path_absent_under_root_falls_back_to_root(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root, {"cgroup.controllers": "memory\n", "memory.current": "7\n"})
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/not/here\n"))
    assert probe.path == str(root)
    assert probe.sample().usage_bytes == 7


def test_v2_without_memory_controller_is_none(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root, {"cgroup.controllers": "cpu pids\n"})
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/\n"))
    assert probe.source == "none"
    s = probe.sample()
    assert s.source == "none" and s.usage_bytes is None and s.limit_bytes is None and s.events == {}


def test_nothing_found(tmp_path: Path) -> None:
    probe = CgroupProbe.detect(root=str(tmp_path / "nope"), proc_cgroup=str(tmp_path / "missing"))
    assert probe.source == "none"
    assert probe.sample().working_set_bytes is None


def test_env_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cg"
    write(root, {"cgroup.controllers": "memory\n", "memory.current": "42\n"})
    monkeypatch.setenv("EVALSUP_CGROUP_ROOT", str(root))
    probe = CgroupProbe.detect(proc_cgroup=proc_file(tmp_path, "0::/\n"))
    assert probe.source == "cgroup2"
    assert probe.sample().usage_bytes == 42


# ------------------------------------------------------------------------------------------ cgroup v1


def v1_tree(root: Path) -> None:
    write(
        root,
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/memory.usage_in_bytes": "999999999\n",
            "memory/docker/memory.limit_in_bytes": "536870912\n",
            "memory/docker/memory.failcnt": "5\n",
            "memory/docker/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            "memory/docker/ctr/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/docker/ctr/memory.usage_in_bytes": "300000000\n",
            "memory/docker/ctr/memory.stat": (
                "cache 100\nrss 200\ninactive_file 10\n"
                f"hierarchical_memory_limit 536870912\nhierarchical_memsw_limit {V1_UNLIMITED}\n"
                "total_cache 150000000\ntotal_inactive_file 100000000\n"
            ),
            "memory/docker/ctr/memory.failcnt": "1\n",
            "memory/docker/ctr/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        },
    )


def test_v1_detect_and_sample(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v1_tree(root)
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "4:memory:/docker/ctr\n"))
    assert probe.source == "cgroup1"
    assert probe.path == str(root / "memory/docker/ctr")
    s = probe.sample()
    assert s.source == "cgroup1"
    assert s.usage_bytes == 300_000_000
    assert s.working_set_bytes == 200_000_000  # total_inactive_file, not the local inactive_file
    assert s.limit_bytes == s.max_bytes == 536_870_912  # found on the parent
    assert s.high_bytes is None
    assert s.events == {"max": 6, "oom_kill": 2}  # own counters plus the limit owner's (v1 is local)
    assert s.psi_some_avg10 is None and s.psi_full_avg10 is None


def test_v1_hierarchical_limit_covers_invisible_ancestors(tmp_path: Path) -> None:
    """A container sees only its own cgroup; memory.stat's hierarchical_memory_limit still has the limit."""
    root = tmp_path / "cg"
    write(
        root,
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/memory.usage_in_bytes": "1000\n",
            "memory/memory.stat": "total_inactive_file 100\nhierarchical_memory_limit 8192\n",
            "memory/memory.failcnt": "0\n",
        },
    )
    # the host path is not visible under the bind mount: fall back to <root>/memory
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "7:memory:/docker/ctr\n"))
    assert probe.source == "cgroup1"
    assert probe.path == str(root / "memory")
    s = probe.sample()
    assert (s.usage_bytes, s.working_set_bytes, s.limit_bytes) == (1000, 900, 8192)
    assert s.events == {"max": 0}


def test_v1_unlimited_everywhere(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(
        root,
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/a/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/a/memory.usage_in_bytes": "10\n",
            "memory/a/memory.stat": f"hierarchical_memory_limit {V1_UNLIMITED}\n",
        },
    )
    s = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "3:memory:/a\n")).sample()
    assert s.limit_bytes is None and s.max_bytes is None
    assert s.working_set_bytes == 10


def test_hybrid_prefers_cgroup1(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v1_tree(root)
    write(
        root,
        {
            # cgroup2 mounted at unified/ for other controllers; it carries memory.pressure (PSI)
            "unified/cgroup.controllers": "hugetlb\n",
            "unified/memory.pressure": (
                "some avg10=15.00 avg60=2.00 avg300=0.00 total=5\nfull avg10=3.00 avg60=0 avg300=0 total=1\n"
            ),
        },
    )
    text = "4:memory:/docker/ctr\n1:cpu:/\n0::/\n"
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, text))
    assert probe.source == "cgroup1"
    assert probe.path == str(root / "memory/docker/ctr")
    s = probe.sample()
    assert s.limit_bytes == 536_870_912
    assert s.psi_some_avg10 == 15.0 and s.psi_full_avg10 == 3.0


def test_hybrid_even_if_root_lists_memory(tmp_path: Path) -> None:
    """The v1 memory controller wins whenever it is mounted and our process is in it."""
    root = tmp_path / "cg"
    v1_tree(root)
    write(root, {"cgroup.controllers": "memory\n", "memory.current": "1\n"})
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "4:memory:/\n0::/\n"))
    assert probe.source == "cgroup1"
    assert probe.path == str(root / "memory")


def test_v1_line_without_mount_uses_v2(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(root, {"cgroup.controllers": "memory\n", "x/memory.current": "5\n"})
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "4:memory:/x\n0::/x\n"))
    assert probe.source == "cgroup2"
    assert probe.sample().usage_bytes == 5


def test_sample_never_raises_on_garbage(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    write(
        root,
        {
            "cgroup.controllers": "memory\n",
            "memory.current": "not a number\n",
            "memory.max": "???\n",
            "memory.events": "\x00\x01",
            "memory.pressure": "some avg10=\n",
        },
    )
    (root / "memory.stat").mkdir()  # reading a directory fails with EISDIR
    s = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/\n")).sample()
    assert s == CgroupSample("cgroup2", None, None, None, None, None, {}, None, None)


def test_files_vanishing_after_detect(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    v2_tree(root)
    probe = CgroupProbe.detect(root=str(root), proc_cgroup=proc_file(tmp_path, "0::/kubepods/pod1/ctr\n"))
    for f in (root / "kubepods/pod1/ctr").iterdir():
        f.unlink()
    s = probe.sample()
    assert s.usage_bytes is None and s.working_set_bytes is None and s.psi_some_avg10 is None
    assert s.limit_bytes == 900_000_000  # the ancestors are still there


# ------------------------------------------------------------------------------------------ this machine


def test_real_machine_is_cgroup1() -> None:
    if not os.path.isdir("/sys/fs/cgroup/memory"):
        pytest.skip("no cgroup v1 memory controller mounted at /sys/fs/cgroup/memory on this host")
    probe = CgroupProbe.detect(root="/sys/fs/cgroup")
    assert probe.source == "cgroup1"
    s = probe.sample()
    assert s.source == "cgroup1"
    assert s.usage_bytes is not None and s.usage_bytes > 0
    assert s.working_set_bytes is not None and 0 <= s.working_set_bytes <= s.usage_bytes


# ------------------------------------------------------------------------------------------ rss


def test_rss_self_and_tree() -> None:
    own = rss_bytes(os.getpid())
    assert own is not None and own > 1_000_000
    assert tree_rss_bytes([os.getpid(), os.getpid()]) >= 2 * own * 0.9


def test_a_workers_own_rss_leaves_out_the_results_ring_it_writes_through_a_mapping() -> None:
    """A worker copies large results into a mapping of its ring (ipc.ring): the ring's pages show in its RSS
    but are the supervisor's (counted in its RSS); the figure a worker is recycled by leaves them out."""
    import mmap

    from evalsup.ipc.ring import SupervisorRing, WorkerRing

    size = 32 << 20
    sup = SupervisorRing(size)
    assert sup.fd is not None
    ring = WorkerRing(os.dup(sup.fd), size)
    sup.close_fd()
    before_rss, before_own = rss_bytes(os.getpid()), own_rss_bytes(os.getpid())
    assert before_rss is not None and before_own is not None
    line = b"x" * (1 << 20)
    written = 0
    for i in range(3 * size // len(line)):  # around the ring three times: pwritev first, then the mapping
        line = bytes([i % 251]) * len(line)
        pos = ring.put([line])
        assert pos is not None
        written += len(line)
        assert bytes(sup.line(pos, len(line), written)) == line  # what the journal's writer would write
        upto = sup.releasable(written)  # written: the worker may use the space again
        assert upto is not None
        ring.release(upto)
    assert ring.touched >= size - (1 << 20) - mmap.PAGESIZE
    after_rss, after_own = rss_bytes(os.getpid()), own_rss_bytes(os.getpid())
    assert after_rss is not None and after_own is not None
    assert after_rss - before_rss > size // 2  # the mapping's pages are resident here...
    assert after_own - before_own < size // 8  # ...and not counted as this process's own


def test_own_v1_memory_cgroup_is_ours_or_the_mount_where_ours_is_not_there(tmp_path: Path) -> None:
    from evalsup.config.cgroup import own_v1_memory_cgroup

    mount = tmp_path / "memory"
    (mount / "job" / "step").mkdir(parents=True)
    (mount / "cgroup.procs").write_text("")
    (mount / "job" / "step" / "cgroup.procs").write_text("")
    proc = tmp_path / "cgroup"
    proc.write_text("12:pids:/job\n4:memory:/job/step\n0::/job\n")
    assert own_v1_memory_cgroup(mount, proc) == mount / "job" / "step"
    proc.write_text("4:memory:/elsewhere\n")  # a namespaced view: our path is not under this mount
    assert own_v1_memory_cgroup(mount, proc) == mount
    assert own_v1_memory_cgroup(mount, tmp_path / "missing") == mount
