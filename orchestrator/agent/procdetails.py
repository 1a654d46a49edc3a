"""Who owns a GPU process, what it runs and how busy its CPU is: nvitop's USER, %CPU and
COMMAND columns (``nvitop/api/process.py``, v1.7.0, reads them through psutil: the user name
of the real uid, ``cmdline``, ``cpu_percent``), read from /proc on the Proxmox host or inside
a container.

On the host the owner is named as the container names it. ``/proc/PID/status`` gives the real
uid in the host's numbering (100000 for an unprivileged container's root: pve-container maps
``u 0 100000 65536``); ``/proc/PID/uid_map``, read from the host, maps it back (its lines are
``inside outside count``, outside in the reader's numbering; a privileged container's and the
host's own map is the identity ``0 0 4294967295``, user_namespaces(7)); the name comes from
the container's own ``/etc/passwd``, read through the process's root with
:class:`~orchestrator.agent.rootfs.ContainerRoot` (a planted ``/etc/passwd -> /etc/shadow``
never reads a host file). Inside a container the uid is already the container's (no map).

The command line is the process's own text (hostile): bounded, secrets masked and control
characters shown by :func:`orchestrator.wire.text.command_line`. The user name is the
container's text too: cut to :data:`MAX_USER_CHARS` and shown the same way. Both are read once
per process (PID and start time); CPU % is over the interval since the previous
:meth:`ProcDetails.fill` (the first: the average since the process started).

Equivalent: ``ps -o user=,pcpu=,args= -p PID`` run inside the container.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from orchestrator.agent.cgroups import read_text
from orchestrator.agent.hostprocs import cpu_pct
from orchestrator.agent.procs import _CLK_TCK, parse_stat_fields
from orchestrator.agent.rootfs import ContainerRoot
from orchestrator.wire.model import GpuSample
from orchestrator.wire.text import MAX_CMDLINE_BYTES, command_line, visible

MAX_USER_CHARS = 32
"""The longest user name carried (useradd's limit is 32)."""
MAX_PASSWD_BYTES = 1 << 20
"""How much of a container's ``/etc/passwd`` is read."""


def parse_real_uid(status: str) -> int | None:
    """The real uid from ``/proc/PID/status`` (``Uid:`` real, effective, saved, fs).

    >>> parse_real_uid("Name:\\tpython3\\nUid:\\t101000\\t101000\\t101000\\t101000\\n")
    101000
    >>> parse_real_uid("Name:\\tx\\n") is None
    True
    """
    for line in status.splitlines():
        if line.startswith("Uid:"):
            ids = line.split()[1:2]
            return int(ids[0]) if ids and ids[0].isdigit() else None
    return None


def parse_id_map(text: str) -> tuple[tuple[int, int, int], ...]:
    """``/proc/PID/uid_map`` -> ``((inside, outside, count), ...)`` (bad lines skipped).

    >>> parse_id_map("         0     100000      65536\\n")
    ((0, 100000, 65536),)
    """
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            out.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return tuple(out)


def map_id(uid: int, id_map: Sequence[tuple[int, int, int]]) -> int | None:
    """The uid inside the namespace of a uid outside it; ``None`` when no line maps it.

    >>> map_id(101000, [(0, 100000, 65536)]), map_id(0, [(0, 0, 4294967295)]), map_id(5, [(0, 100000, 65536)])
    (1000, 0, None)
    """
    for inside, outside, count in id_map:
        if outside <= uid < outside + count:
            return inside + uid - outside
    return None


def parse_passwd(text: str) -> dict[int, str]:
    """``/etc/passwd`` -> ``{uid: name}`` (the first entry of a uid wins, as getpwuid's).

    >>> parse_passwd("root:x:0:0:root:/root:/bin/bash\\ntrainee:x:1234:1234::/home/t:/bin/sh\\n# x\\n")
    {0: 'root', 1234: 'trainee'}
    """
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] and parts[2].isdigit():
            out.setdefault(int(parts[2]), parts[0])
    return out


def user_name(uid: int | None, passwd: dict[int, str]) -> str | None:
    """The name of ``uid`` (cut and made visible), its digits when passwd has none.

    >>> user_name(0, {0: "root"}), user_name(1001, {}), user_name(None, {})
    ('root', '1001', None)
    >>> user_name(7, {7: "evil\\x1b[2J" + "x" * 40})
    'evil␛[2Jxxxxxxxxxxxxxxxxxxxxxxxx'
    """
    if uid is None:
        return None
    name = passwd.get(uid)
    return visible(name[:MAX_USER_CHARS]) if name else str(uid)


class ProcDetails:
    """User, CPU % and command of GPU processes, kept between calls (one per observer).

    Args:
        proc: the /proc to read.
        map_ids: map the uid through the process's ``uid_map`` (on the host); ``False`` inside
            a container, where the uid is already its own.
    """

    def __init__(self, proc: str = "/proc", *, map_ids: bool = True) -> None:
        self.proc = proc
        self.map_ids = map_ids
        self._fixed: dict[tuple[int, int], tuple[str | None, str | None]] = {}
        self._cpu: dict[tuple[int, int], tuple[int, float]] = {}

    def fill(self, samples: Sequence[GpuSample]) -> tuple[GpuSample, ...]:
        """``samples`` with each process's ``user``, ``cpu_pct`` and ``command`` (``pid`` is
        read in this /proc's numbering); a process gone or unreadable keeps them ``None``."""
        mono = time.monotonic()
        uptime: list[float] = []
        done: dict[int, tuple[str | None, float | None, str | None] | None] = {}
        cpu: dict[tuple[int, int], tuple[int, float]] = {}
        out = []
        for g in samples:
            if not g.processes:
                out.append(g)
                continue
            procs = []
            for p in g.processes:
                if p.pid not in done:
                    done[p.pid] = self._read(p.pid, mono, uptime, cpu)
                got = done[p.pid]
                if got is not None:
                    p = dataclasses.replace(p, user=got[0], cpu_pct=got[1], command=got[2])
                procs.append(p)
            out.append(dataclasses.replace(g, processes=tuple(procs)))
        self._cpu = cpu
        self._fixed = {k: v for k, v in self._fixed.items() if k in cpu}
        return tuple(out)

    def _read(
        self,
        pid: int,
        mono: float,
        uptime: list[float],
        cpu: dict[tuple[int, int], tuple[int, float]],
    ) -> tuple[str | None, float | None, str | None] | None:
        text = read_text(f"{self.proc}/{pid}/stat", 4096)
        try:
            _comm, _state, _pp, _pg, ticks, _thr, start, _rss = parse_stat_fields(text or "")
        except (ValueError, IndexError):
            return None
        key = (pid, start)
        if not uptime:
            up = (read_text(f"{self.proc}/uptime") or "0").split()
            uptime.append(float(up[0]) if up else 0.0)
        pct = cpu_pct(ticks, self._cpu.get(key), mono, uptime[0] - start / _CLK_TCK)
        cpu[key] = (ticks, mono)
        fixed = self._fixed.get(key)
        if fixed is None:
            fixed = self._fixed[key] = (self._user(pid), self._command(pid))
        return fixed[0], pct, fixed[1]

    def _command(self, pid: int) -> str | None:
        try:
            with open(f"{self.proc}/{pid}/cmdline", "rb") as fh:
                return command_line(fh.read(MAX_CMDLINE_BYTES))
        except OSError:
            return None

    def _user(self, pid: int) -> str | None:
        uid = parse_real_uid(read_text(f"{self.proc}/{pid}/status", 8192) or "")
        if uid is not None and self.map_ids:
            uid = map_id(uid, parse_id_map(read_text(f"{self.proc}/{pid}/uid_map") or ""))
        if uid is None:
            return None
        return user_name(uid, self._passwd(pid))

    def _passwd(self, pid: int) -> dict[int, str]:
        """The passwd of the process's own root (the container's); empty when unreadable."""
        try:
            with ContainerRoot(f"{self.proc}/{pid}/root" if self.map_ids else "/") as root:
                raw, _mtime = root.read("/etc/passwd", MAX_PASSWD_BYTES)
        except OSError:
            return {}
        return parse_passwd(raw.decode("utf-8", "replace")) if raw else {}
