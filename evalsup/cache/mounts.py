"""The file system a cache directory lives on: SQLite's WAL mode needs shared memory between the processes
that open the file, which a network file system does not give (sqlite.org/wal.html: "WAL does not work over a
network filesystem"), so a cache there is refused before the run starts."""

from __future__ import annotations

import os
from pathlib import Path

# fs types of /proc/mounts on which WAL's shared memory is not shared between hosts (or not at all)
NETWORK = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs", "lustre", "gpfs",
    "beegfs", "davfs", "fuse.sshfs", "sshfs", "fuse.glusterfs", "fuse.ceph", "fuse.s3fs", "fuse.rclone",
    "fuse.gcsfuse", "fuse.juicefs", "fuse.davfs2", "fuse.cephfs", "fuse.lustre",
})


def _unescape(field: str) -> str:
    """/proc/mounts writes a space as \\040, a tab \\011, a newline \\012 and a backslash \\134."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def fs_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the file system ``path`` is on (or will be, when it does not exist yet), from ``mounts`` (the text of
    /proc/mounts, read when None); None where it cannot be told (no /proc)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(path.absolute())  # (the links of the part that exists resolved; a new dir as named)
    best, kind = "", None
    for row in mounts.splitlines():
        parts = row.split()
        if len(parts) < 3:
            continue
        point = _unescape(parts[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):  # the last of equal mounts wins (mounted over)
            best, kind = point, parts[2]
    return kind


def network_problem(path: Path, mounts: str | None = None) -> str | None:
    """Why a cache may not live at ``path``, or None."""
    kind = fs_type(path, mounts)
    if kind is None or kind.lower() not in NETWORK:
        return None
    return (f"--cache {path} is on a network file system ({kind}), where SQLite's WAL mode is not safe: put the "
            "cache on a local disk (each host its own), or leave --cache out")
