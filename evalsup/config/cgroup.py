"""Container memory probe: cgroup v2, cgroup v1 (including hybrid hosts), or nothing.

The supervisor samples this every control interval, so :meth:`CgroupProbe.sample` is a handful of small
file reads and never raises: a file that is missing or unreadable just leaves its field ``None``.

Figures, and where they come from:

* ``usage_bytes``: v2 ``memory.current``; v1 ``memory.usage_in_bytes``.
* ``working_set_bytes``: usage minus the inactive file cache (v2 ``memory.stat`` ``inactive_file``; v1
  ``total_inactive_file``), floored at 0. This is what kubelet/cAdvisor call the working set and what
  evictions and OOM decisions are made on; page cache that can be dropped does not count. When the stat
  is unreadable the working set is the usage (the conservative choice).
* limits: the tightest ``memory.high``/``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) on the path
  from this cgroup up to the root of the mount. On v1 the ``hierarchical_memory_limit`` line of
  ``memory.stat`` is also taken into account, since it covers ancestors that a container cannot see.
* ``events``: v2 ``memory.events`` of the cgroup that owns the tightest limit (the file is hierarchical,
  so an ancestor's counters include ours, and a limit hit at a pod-level ancestor is only counted
  there). v1 has no such file: ``memory.failcnt`` is reported as ``"max"`` and the ``oom_kill`` line of
  ``memory.oom_control`` as ``"oom_kill"``; those counters are local, so our cgroup's and the limit
  owner's are added.
* PSI: v2 ``memory.pressure`` of this cgroup. On a hybrid host (v1 memory controller plus a cgroup2
  mount at ``<root>/unified``) the cgroup2 hierarchy still carries ``memory.pressure`` files, and they
  are read from there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

__all__ = [
    "V1_UNLIMITED_THRESHOLD",
    "CgroupProbe",
    "CgroupSample",
    "Source",
    "parse_keyed",
    "parse_limit",
    "parse_proc_cgroup",
    "parse_psi",
]

Source = Literal["cgroup2", "cgroup1", "none"]

#: cgroup v1 reports "no limit" as a huge page-aligned number (LONG_MAX rounded down to the page size,
#: e.g. 9223372036854771712). Anything at or above this is treated as unlimited.
V1_UNLIMITED_THRESHOLD = 2**62

DEFAULT_ROOT = "/sys/fs/cgroup"
ROOT_ENV = "EVALSUP_CGROUP_ROOT"


# --------------------------------------------------------------------------------------------- parsers


def parse_proc_cgroup(text: str) -> tuple[str | None, str | None]:
    """Parse ``/proc/<pid>/cgroup``; return ``(v2_path, v1_memory_path)``, each ``None`` when absent.

    Lines are ``hierarchy-id:controller-list:path``. The v2 line is ``0::/path``; the v1 memory line has
    ``memory`` in its comma-separated controller list (``4:memory:/path``).
    """
    v2: str | None = None
    v1_memory: str | None = None
    for raw in text.splitlines():
        parts = raw.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier_id, controllers, path = parts
        if not path:
            continue
        if hier_id == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1_memory = path
    return v2, v1_memory


V1_MEMORY_MOUNT = Path("/sys/fs/cgroup/memory")


def own_v1_memory_cgroup(mount: Path = V1_MEMORY_MOUNT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> Path:
    """This process's own cgroup v1 memory cgroup, the directory a child cgroup of ours is made in (the tests' and
    the benchmarks' memory-limited runs): its path from ``/proc/self/cgroup`` under ``mount``, or ``mount``
    itself where that path is not there (a namespaced or bind-mounted view)."""
    try:
        _v2, own = parse_proc_cgroup(proc_cgroup.read_text())
    except OSError:
        own = None
    parent = mount / own.strip("/") if own else mount
    return parent if (parent / "cgroup.procs").is_file() else mount


def parse_limit(text: str) -> int | None:
    """Parse a limit file (``memory.max``, ``memory.high``, ``memory.limit_in_bytes``).

    ``"max"`` and v1's huge "unlimited" sentinel (``>= 2**62``) mean no limit and give ``None``.
    Raises ``ValueError`` for text that is neither.
    """
    value = text.strip()
    if value == "max":
        return None
    number = int(value)
    if number >= V1_UNLIMITED_THRESHOLD:
        return None
    return max(number, 0)


def parse_keyed(text: str) -> dict[str, int]:
    """Parse ``key value`` lines (``memory.stat``, ``memory.events``, ``memory.oom_control``).

    Lines that are not exactly a key and an integer are skipped.
    """
    out: dict[str, int] = {}
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """Parse a PSI file (``memory.pressure``, ``/proc/pressure/memory``).

    ``some avg10=0.12 avg60=0.05 avg300=0.01 total=12345`` becomes
    ``{"some": {"avg10": 0.12, "avg60": 0.05, "avg300": 0.01, "total": 12345.0}}``, and likewise for
    ``full``. Malformed fields are skipped.
    """
    out: dict[str, dict[str, float]] = {}
    for raw in text.splitlines():
        parts = raw.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        fields: dict[str, float] = {}
        for item in parts[1:]:
            key, sep, val = item.partition("=")
            if not sep:
                continue
            try:
                fields[key] = float(val)
            except ValueError:
                continue
        out[parts[0]] = fields
    return out


# --------------------------------------------------------------------------------------------- sampling


@dataclass(frozen=True)
class CgroupSample:
    """One reading of the container's memory figures; see the module docstring for their sources."""

    source: Source
    usage_bytes: int | None
    working_set_bytes: int | None
    limit_bytes: int | None
    high_bytes: int | None
    max_bytes: int | None
    events: dict[str, int] = field(default_factory=dict)
    psi_some_avg10: float | None = None
    psi_full_avg10: float | None = None


def _read(path: str) -> str | None:
    """Read a small pseudo-file; ``None`` if it is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def _read_limit(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_limit(text)
    except ValueError:
        return None


def _read_keyed(path: str) -> dict[str, int] | None:
    text = _read(path)
    return None if text is None else parse_keyed(text)


def _ancestry(path: str, top: str) -> tuple[str, ...]:
    """``path`` and its parents up to and including ``top`` (just ``(path,)`` if it is not under ``top``)."""
    path = os.path.normpath(path)
    top = os.path.normpath(top)
    dirs = [path]
    if path != top and not path.startswith(top.rstrip(os.sep) + os.sep):
        return tuple(dirs)
    while path != top:
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
        dirs.append(path)
    return tuple(dirs)


def _join_under(base: str, cgroup_path: str) -> str:
    rel = cgroup_path.strip("/")
    return os.path.normpath(os.path.join(base, rel)) if rel else os.path.normpath(base)


def _tightest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


class CgroupProbe:
    """Reads this process's memory cgroup. Build one with :meth:`detect`, then call :meth:`sample`."""

    source: Source
    path: str
    top: str
    psi_path: str | None

    def __init__(self, source: Source, path: str, top: str = "", psi_path: str | None = None) -> None:
        """``path`` is the memory cgroup directory, ``top`` the mount root the limit walk stops at."""
        self.source = source
        self.path = path
        self.top = top or path
        self.psi_path = psi_path
        self._dirs: tuple[str, ...] = _ancestry(path, self.top) if path else ()

    def __repr__(self) -> str:
        return f"CgroupProbe(source={self.source!r}, path={self.path!r}, psi_path={self.psi_path!r})"

    @classmethod
    def detect(cls, root: str | None = None, proc_cgroup: str = "/proc/self/cgroup") -> CgroupProbe:
        """Find this process's memory cgroup.

        ``root`` defaults to ``$EVALSUP_CGROUP_ROOT`` or ``/sys/fs/cgroup``. A v1 memory controller
        (``N:memory:/path`` plus ``<root>/memory/``) wins over cgroup2, so hybrid hosts read v1;
        otherwise the ``0::/path`` line counts when ``<root>/cgroup.controllers`` lists ``memory``. A path
        that does not exist under the mount (cgroup namespaces show ``/``, v1 bind mounts show the host
        path) falls back to the mount root, which is then the container's own cgroup.
        """
        if root is None:
            root = os.environ.get(ROOT_ENV) or DEFAULT_ROOT
        root = os.path.normpath(root)
        v2_path, v1_path = parse_proc_cgroup(_read(proc_cgroup) or "")

        v1_mount = os.path.join(root, "memory")
        if v1_path is not None and os.path.isdir(v1_mount):
            cg_dir = _join_under(v1_mount, v1_path)
            if not os.path.isdir(cg_dir):
                cg_dir = v1_mount
            psi_path: str | None = None
            unified = os.path.join(root, "unified")
            if v2_path is not None and os.path.isdir(unified):
                candidate = os.path.join(_join_under(unified, v2_path), "memory.pressure")
                if not os.path.exists(candidate):
                    candidate = os.path.join(unified, "memory.pressure")
                if os.path.exists(candidate):
                    psi_path = candidate
            return cls("cgroup1", cg_dir, v1_mount, psi_path)

        controllers = _read(os.path.join(root, "cgroup.controllers"))
        if v2_path is not None and controllers is not None and "memory" in controllers.split():
            cg_dir = _join_under(root, v2_path)
            if not os.path.isdir(cg_dir):
                cg_dir = root
            # A leaf without the memory controller enabled has no memory.current: use the nearest
            # ancestor that accounts memory (it contains us).
            for d in _ancestry(cg_dir, root):
                if os.path.exists(os.path.join(d, "memory.current")):
                    cg_dir = d
                    break
            return cls("cgroup2", cg_dir, root, os.path.join(cg_dir, "memory.pressure"))

        return cls("none", "", "", None)

    # ------------------------------------------------------------------------------------------ sample

    def sample(self) -> CgroupSample:
        """Read the current figures. Never raises; unreadable figures are ``None``."""
        try:
            if self.source == "cgroup2":
                return self._sample_v2()
            if self.source == "cgroup1":
                return self._sample_v1()
        except Exception:  # a probe must never take the supervisor down
            pass
        return CgroupSample(self.source, None, None, None, None, None, {}, None, None)

    def _psi(self) -> tuple[float | None, float | None]:
        if self.psi_path is None:
            return None, None
        text = _read(self.psi_path)
        if text is None:
            return None, None
        psi = parse_psi(text)
        return psi.get("some", {}).get("avg10"), psi.get("full", {}).get("avg10")

    def _sample_v2(self) -> CgroupSample:
        d = self.path
        usage = _read_int(os.path.join(d, "memory.current"))
        stat = _read_keyed(os.path.join(d, "memory.stat"))
        working_set = _working_set(usage, None if stat is None else stat.get("inactive_file"))

        high: int | None = None
        mx: int | None = None
        owner = d
        tightest: int | None = None
        for cur in self._dirs:
            h = _read_limit(os.path.join(cur, "memory.high"))
            m = _read_limit(os.path.join(cur, "memory.max"))
            high = _tightest(high, h)
            mx = _tightest(mx, m)
            here = _tightest(h, m)
            if here is not None and (tightest is None or here < tightest):
                tightest, owner = here, cur
        limit = _tightest(high, mx)

        events = _read_keyed(os.path.join(owner, "memory.events"))
        if events is None and owner != d:
            events = _read_keyed(os.path.join(d, "memory.events"))
        some, full = self._psi()
        return CgroupSample("cgroup2", usage, working_set, limit, high, mx, events or {}, some, full)

    def _sample_v1(self) -> CgroupSample:
        d = self.path
        usage = _read_int(os.path.join(d, "memory.usage_in_bytes"))
        stat = _read_keyed(os.path.join(d, "memory.stat"))
        inactive: int | None = None
        hier_limit: int | None = None
        if stat is not None:
            inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
            raw_hier = stat.get("hierarchical_memory_limit")
            if raw_hier is not None and raw_hier < V1_UNLIMITED_THRESHOLD:
                hier_limit = raw_hier
        working_set = _working_set(usage, inactive)

        mx: int | None = None
        owner = d
        for cur in self._dirs:
            m = _read_limit(os.path.join(cur, "memory.limit_in_bytes"))
            if m is not None and (mx is None or m < mx):
                mx, owner = m, cur
        mx = _tightest(mx, hier_limit)

        events: dict[str, int] = {}
        for cur in dict.fromkeys((d, owner)):  # our own counters, plus the limit owner's (v1 is local)
            failcnt = _read_int(os.path.join(cur, "memory.failcnt"))
            if failcnt is not None:
                events["max"] = events.get("max", 0) + failcnt
            oom = _read_keyed(os.path.join(cur, "memory.oom_control"))
            if oom is not None and "oom_kill" in oom:
                events["oom_kill"] = events.get("oom_kill", 0) + oom["oom_kill"]
        some, full = self._psi()
        return CgroupSample("cgroup1", usage, working_set, mx, None, mx, events, some, full)


def _working_set(usage: int | None, inactive_file: int | None) -> int | None:
    if usage is None:
        return None
    if inactive_file is None:
        return usage
    return max(usage - inactive_file, 0)


def container_limit() -> tuple[int | None, str]:
    """The effective memory limit of this process's cgroup and where it came from."""
    s = CgroupProbe.detect().sample()
    return s.limit_bytes, s.source


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
