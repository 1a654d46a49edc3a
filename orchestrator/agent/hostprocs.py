"""A container's processes as the Proxmox host sees them: host PID, PID inside, group, cgroup.

``/proc/<pid>/status`` on the host holds ``NSpid: 41234 17`` (the PID in each PID namespace
from the host's down: the last one is the PID inside the container) and ``NSpgid`` (the
process group, likewise); ``/proc/<pid>/stat`` gives comm, state, parent, CPU ticks, start
time, threads and RSS (host numbering). A process's NS ids never change, so they are
read once per (PID, start time) and kept.

Equivalent: ``ps -o pid,ppid,pgid,stat,comm -p $(cat .../lxc/200/**/cgroup.procs)`` plus
``grep NSpid /proc/PID/status``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.agent.cgroups import read_text
from orchestrator.agent.procs import _CLK_TCK, _PAGE_MIB, parse_stat_fields


@dataclass(frozen=True, slots=True)
class HostProcess:
    """One process: host numbering (``pid``, ``ppid``, ``pgrp``) and the container's (``inner``,
    ``inner_pgid``; ``None`` for a process in the host's own PID namespace).

    ``start`` is the start time in clock ticks since boot (the same in every namespace: with
    the PID it names one process for good); ``ticks`` its CPU time so far.
    """

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    start: int
    ticks: int
    threads: int
    rss_mib: float
    inner: int | None = None
    inner_pgid: int | None = None


def parse_ns_ids(text: str) -> tuple[int | None, int | None]:
    """(PID, process group) inside the innermost PID namespace, from ``/proc/<pid>/status``;
    ``None`` for each when the process is in the reader's own namespace (one entry).

    >>> parse_ns_ids("Name:\\tpython3\\nNSpid:\\t41234\\t17\\nNSpgid:\\t41230\\t12\\n")
    (17, 12)
    >>> parse_ns_ids("NSpid:\\t99\\nNSpgid:\\t99\\n")
    (None, None)
    """
    pid = pgid = None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            pid = int(ids[-1]) if len(ids) > 1 and ids[-1].isdigit() else None
        elif line.startswith("NSpgid:"):
            ids = line.split()[1:]
            pgid = int(ids[-1]) if len(ids) > 1 and ids[-1].isdigit() else None
            break  # NSpgid follows NSpid
    return pid, pgid


class ProcessReader:
    """Reads host processes, keeping each one's namespace ids (read once per PID and start)."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._ns: dict[tuple[int, int], tuple[int | None, int | None]] = {}

    def read(self, pid: int) -> HostProcess | None:
        """One process now; ``None`` when it is gone (or its files cannot be parsed)."""
        text = read_text(f"{self.proc}/{pid}/stat", 4096)
        if not text:
            return None
        try:
            comm, state, ppid, pgrp, ticks, threads, start, rss = parse_stat_fields(text)
        except (ValueError, IndexError):
            return None
        key = (pid, start)
        ns = self._ns.get(key)
        if ns is None:
            status = read_text(f"{self.proc}/{pid}/status", 8192)
            if status is None:
                return None
            ns = self._ns[key] = parse_ns_ids(status)
        return HostProcess(
            pid=pid,
            comm=comm,
            state=state,
            ppid=ppid,
            pgrp=pgrp,
            start=start,
            ticks=ticks,
            threads=threads,
            rss_mib=round(rss * _PAGE_MIB, 1),
            inner=ns[0],
            inner_pgid=ns[1],
        )

    def read_all(self, pids: Iterable[int]) -> dict[int, HostProcess]:
        """Every process of ``pids`` still there, by host PID; forgets the ids of the others."""
        out = {}
        for pid in pids:
            p = self.read(pid)
            if p is not None:
                out[pid] = p
        return out

    def forget(self, alive: Iterable[tuple[int, int]]) -> None:
        """Drop the kept ids of every (PID, start) not in ``alive``."""
        keep = set(alive)
        for key in [k for k in self._ns if k not in keep]:
            del self._ns[key]


def start_ticks(pid: int, proc: str = "/proc") -> int | None:
    """The start time (clock ticks since boot) of ``pid``, ``None`` when it is gone."""
    text = read_text(f"{proc}/{pid}/stat", 4096)
    if not text:
        return None
    try:
        return parse_stat_fields(text)[6]
    except (ValueError, IndexError):
        return None


def descendants(root: int, table: dict[int, HostProcess]) -> list[int]:
    """``root`` and every process below it in ``table`` (host PIDs), parents first.

    >>> t = {p: HostProcess(p, "x", "S", pp, p, 0, 0, 1, 0.0) for p, pp in ((1, 0), (2, 1), (3, 2), (4, 9))}
    >>> descendants(1, t)
    [1, 2, 3]
    """
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo, seen = [], [root], set()
    while todo:
        pid = todo.pop(0)
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        out.append(pid)
        todo.extend(sorted(children.get(pid, ())))
    return out


def cpu_pct(ticks: int, prev: tuple[int, float] | None, now: float, age_s: float) -> float | None:
    """CPU % since the previous sample ``prev`` (ticks, monotonic s), else since the start.

    >>> cpu_pct(150, (100, 10.0), 11.0, 50.0)
    50.0
    """
    if prev is not None:
        dt = now - prev[1]
        return round(100.0 * (ticks - prev[0]) / _CLK_TCK / dt, 1) if dt > 0 else None
    return round(100.0 * ticks / _CLK_TCK / age_s, 1) if age_s > 0 else None
