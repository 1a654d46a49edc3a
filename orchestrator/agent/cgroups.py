"""Which container a host process belongs to, and every process of a container, by cgroup.

On Proxmox a process of CT 200 sits in the cgroup ``/lxc/200/ns/...`` (pve-container's
``lxc.cgroup.dir.container = lxc/<vmid>``; newer LXC without that layout says
``/lxc.payload.200/...``); the orch sandbox puts a per-sandbox prefix in front
(``/orch-<id>/lxc/200/ns``). So the vmid is found by ``lxc/<vmid>`` anywhere in the path.

The members of a container are read from its cgroup directory (every ``cgroup.procs``
below ``<cgroup2 mount>/<prefix>/lxc/<vmid>``): no scan of every process on the host.
A cgroup v1-only host uses its ``pids`` (else ``name=systemd``) hierarchy instead.

Equivalent: ``cat /proc/PID/cgroup``; ``find /sys/fs/cgroup/lxc/200 -name cgroup.procs | xargs cat``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

_VMID = re.compile(r"(?:^|/)lxc/(\d+)(?:/|$)|(?:^|/)lxc\.payload\.(\d+)(?:/|$)")
_V1_PREFERRED = ("pids", "name=systemd", "memory", "cpu")
MAX_MEMBERS = 20000
"""Most processes read from one container's cgroup tree (a fork bomb must not stall the host)."""


def vmid_of_cgroup_path(path: str) -> int | None:
    """The vmid in a cgroup path (``None``: not a container's).

    >>> vmid_of_cgroup_path("/lxc/200/ns/user.slice"), vmid_of_cgroup_path("/orch-5f/lxc/201/ns")
    (200, 201)
    >>> vmid_of_cgroup_path("/lxc.payload.202/init.scope"), vmid_of_cgroup_path("/system.slice")
    (202, None)
    >>> vmid_of_cgroup_path("/lxc.monitor/200") is None
    True
    """
    m = _VMID.search(path)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def parse_cgroup_vmid(text: str) -> int | None:
    """The LXC vmid owning a process, from ``/proc/<pid>/cgroup`` (``None``: a host process).

    >>> parse_cgroup_vmid("0::/lxc/200/ns/user.slice/session-1.scope\\n")
    200
    >>> parse_cgroup_vmid("12:pids:/lxc.payload.201/init.scope\\n0::/lxc.payload.201\\n")
    201
    >>> parse_cgroup_vmid("0::/system.slice/pvedaemon.service\\n") is None
    True
    """
    for line in text.splitlines():
        vmid = vmid_of_cgroup_path(line.split(":", 2)[-1])
        if vmid is not None:
            return vmid
    return None


def container_root(path: str) -> str | None:
    """The container's own cgroup (``.../lxc/<vmid>``) from a member's cgroup path.

    >>> container_root("/orch-5f/lxc/200/ns/init.scope"), container_root("/lxc.payload.7/x")
    ('/orch-5f/lxc/200', '/lxc.payload.7')
    >>> container_root("/user.slice") is None
    True
    """
    m = _VMID.search(path)
    if not m:
        return None
    end = m.end()
    if path[end - 1 : end] == "/":
        end -= 1
    return path[:end]


def parse_mountinfo(text: str) -> dict[str, str]:
    """Cgroup mount points by hierarchy: ``""`` for cgroup2, else the v1 controllers (``pids``).

    >>> parse_mountinfo("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\\n"
    ...                 "36 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\\n")
    {'': '/sys/fs/cgroup/unified', 'pids': '/sys/fs/cgroup/pids'}
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or fields[3] != "/":
            continue
        if tail[0] == "cgroup2":
            out.setdefault("", fields[4])
        elif tail[0] == "cgroup":
            opts = [o for o in tail[2].split(",") if o not in ("rw", "ro")]
            for name in _V1_PREFERRED:
                if name in opts:
                    out.setdefault(name, fields[4])
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` by hierarchy, keyed as :func:`parse_mountinfo` keys mounts.

    >>> parse_proc_cgroup("4:pids:/lxc/200/ns\\n9:name=systemd:/lxc/200/ns\\n0::/lxc/200/ns\\n")
    {'pids': '/lxc/200/ns', 'name=systemd': '/lxc/200/ns', '': '/lxc/200/ns'}
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            out[""] = parts[2]
            continue
        for name in parts[1].split(","):
            if name in _V1_PREFERRED:
                out.setdefault(name, parts[2])
    return out


def read_text(path: str, limit: int = 65536) -> str | None:
    """A small file of /proc or /sys, or ``None`` when it is gone or unreadable.

    Read with ``os.read`` (no buffered file object: a check reads some 250 of these).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_fd(fd, limit).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``fd`` from where it is (fewer only at its end), as a buffered
    file's ``read(limit)`` gives them; ``OSError`` as ``os.read`` raises it."""
    data = os.read(fd, limit)
    if not data or len(data) >= limit:
        return data
    parts = [data]
    got = len(data)
    while got < limit:
        chunk = os.read(fd, limit - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class CgroupMounts:
    """Where this host mounts its cgroup hierarchies (read once from ``/proc/self/mountinfo``)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.mounts = parse_mountinfo(read_text(f"{proc}/self/mountinfo", 1 << 20) or "")

    def directory(self, pid: int) -> str | None:
        """The directory of the container cgroup holding ``pid`` (``None``: not in one)."""
        by_hierarchy = parse_proc_cgroup(read_text(f"{self.proc}/{pid}/cgroup") or "")
        for key in ("", *_V1_PREFERRED):
            path, mount = by_hierarchy.get(key), self.mounts.get(key)
            if path is None or mount is None:
                continue
            root = container_root(path)
            if root is not None:
                return mount + root
        return None


def members(directory: str, limit: int = MAX_MEMBERS) -> Iterator[int]:
    """The PIDs in cgroup ``directory`` and every cgroup below it (at most ``limit``): each
    cgroup's ``cgroup.procs``, then its child cgroups in name order, depth first (the order
    ``os.walk`` with sorted directories gives; one ``scandir`` a cgroup, no file list).

    A cgroup that vanishes while it is read (the container stopping) just ends the walk.
    """
    seen = 0
    for root in _cgroup_dirs(directory):
        for word in (read_text(root + "/cgroup.procs", 1 << 20) or "").split():
            if word.isdigit():
                yield int(word)
                seen += 1
                if seen >= limit:
                    return


def _cgroup_dirs(directory: str) -> Iterator[str]:
    """``directory`` and every directory below it, top-down, children sorted by name."""
    try:
        with os.scandir(directory) as it:
            subdirs = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except OSError:
        return
    yield directory
    for name in subdirs:
        yield from _cgroup_dirs(os.path.join(directory, name))
