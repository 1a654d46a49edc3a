"""The run's process tree from /proc (pid, ppid, state, cpu %, rss, threads, zombies).

Equivalent: ``ps -o pid,ppid,stat,pcpu,rss,nlwp,comm --ppid ... --forest``.
Children are found through ``/proc/<pid>/task/<tid>/children`` when the kernel
has it, else by one scan of ``/proc/*/stat``. ``cpu_pct`` is over the interval
since the previous call of the same :class:`ProcSampler`; on the first call it is
the average since the process started. A process that vanishes mid-read is
skipped, never an error.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator.wire.model import ProcessInfo

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_MIB = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) / 1048576.0
MAX_PROCS = 256


def parse_stat_fields(text: str) -> tuple[str, str, int, int, int, int, int, int]:
    """``/proc/<pid>/stat`` -> (comm, state, ppid, pgrp, cpu ticks, threads, start ticks, rss pages).

    >>> parse_stat_fields("42 (python3 (x)) S 1 40 40 0 -1 4194560 1 0 0 0 150 50 0 0 20 0 7 0 1000 1 2560 x")
    ('python3 (x)', 'S', 1, 40, 200, 7, 1000, 2560)
    """
    left = text.index("(")
    right = text.rindex(")")
    comm = text[left + 1 : right]
    f = text[right + 2 :].split()
    # f[0] is field 3 (state); pgrp=5, utime=14, stime=15, threads=20, starttime=22, rss=24
    return (
        comm,
        f[0],
        int(f[1]),
        int(f[2]),
        int(f[11]) + int(f[12]),
        int(f[17]),
        int(f[19]),
        int(f[21]),
    )


def parse_stat(text: str) -> tuple[int, str, str, int, int, int, int, int]:
    """Parse ``/proc/<pid>/stat`` into (pid, comm, state, ppid, cpu ticks, threads, start ticks, rss pages).

    >>> parse_stat("42 (python3 (x)) S 1 42 42 0 -1 4194560 1 0 0 0 150 50 0 0 20 0 7 0 1000 1 2560 x")
    (42, 'python3 (x)', 'S', 1, 200, 7, 1000, 2560)
    """
    comm, state, ppid, _pgrp, ticks, threads, start, rss = parse_stat_fields(text)
    return int(text[: text.index("(")]), comm, state, ppid, ticks, threads, start, rss


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None


def children_by_parent(proc: str = "/proc") -> dict[int, list[int]]:
    """Child pids of every process (parent pid -> children), from one scan of ``/proc/*/stat``.

    A process that vanishes or whose stat cannot be parsed mid-scan is left out.
    """
    by_parent: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return by_parent
    for name in names:
        if not name.isdigit():
            continue
        text = read_text(f"{proc}/{name}/stat")
        if text:
            try:
                st = parse_stat(text)
            except (ValueError, IndexError):
                continue
            by_parent.setdefault(st[3], []).append(st[0])
    return by_parent


def descendants(pid: int, proc: str = "/proc") -> list[int]:
    """Every process below ``pid`` (not ``pid`` itself), parents before their children."""
    by_parent = children_by_parent(proc)
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int, proc: str = "/proc") -> bool:
    """True if ``pid`` exists and is not a zombie (state ``Z`` in ``/proc/<pid>/stat``)."""
    text = read_text(f"{proc}/{pid}/stat")
    if not text:
        return False
    try:
        return text[text.rindex(")") + 1 :].split()[0] != "Z"
    except (ValueError, IndexError):
        return False


def decode_wait_status(code: int) -> tuple[int | None, int | None]:
    """(exit status, signal) from a ``waitpid`` status word; one of the two is ``None``.

    >>> decode_wait_status(3 << 8), decode_wait_status(9), decode_wait_status(0x80 | 11)
    ((3, None), (None, 9), (None, 11))
    """
    sig = code & 0x7F
    return (None, sig) if sig else ((code >> 8) & 0xFF, None)


def zombie_exit(
    pid: int, parent: int | None = None, proc: str = "/proc"
) -> tuple[int | None, int | None] | None:
    """(exit status, signal) of ``pid`` while it is an unreaped zombie, else ``None``.

    Reads field 52 (``exit_code``, Linux >= 3.5). The kernel shows it only to whoever
    may ptrace-read the process and prints 0 otherwise, so it is trusted only for a
    process of this user (or when running as root). ``parent``, when given, must be
    its parent pid, so a recycled pid is never read as the one asked about. ``None``
    when the process is alive, already reaped, someone else's child, or not ours.
    """
    try:
        if os.geteuid() != 0 and os.stat(f"{proc}/{pid}").st_uid != os.geteuid():
            return None
    except OSError:
        return None
    text = read_text(f"{proc}/{pid}/stat")
    if not text:
        return None
    try:
        f = text[text.rindex(")") + 2 :].split()
        if f[0] != "Z" or (parent is not None and int(f[1]) != parent) or len(f) < 50:
            return None
        return decode_wait_status(int(f[49]))  # f[0] is field 3: field 52 is f[49]
    except (ValueError, IndexError):
        return None


def read_pid_file(path: str) -> int | None:
    """The pid in a pid file (digits, surrounding white space allowed); ``None`` when the file
    is missing, unreadable or holds anything else.
    """
    text = read_text(path)
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


class ProcSampler:
    """Samples the tree under a root pid; keeps CPU ticks between calls for ``cpu_pct``."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self._prev: dict[int, tuple[int, float]] = {}
        self._children_file: bool | None = None

    def _uptime_s(self) -> float:
        text = read_text(f"{self.proc}/uptime")
        return float(text.split()[0]) if text else 0.0

    def _children(self, pid: int) -> list[int] | None:
        """Child pids through the ``children`` files; ``None`` when the kernel lacks them."""
        if self._children_file is None:
            me = os.getpid()
            self._children_file = os.path.exists(f"{self.proc}/{me}/task/{me}/children")
        if not self._children_file:
            return None
        kids: list[int] = []
        try:
            tids = os.listdir(f"{self.proc}/{pid}/task")
        except OSError:
            return []
        for tid in tids:
            text = read_text(f"{self.proc}/{pid}/task/{tid}/children")
            if text:
                kids.extend(int(x) for x in text.split())
        return kids

    def tree(self, root: int | None) -> tuple[ProcessInfo, ...]:
        """The processes under ``root`` (included), breadth first, at most ``MAX_PROCS``."""
        if not root:
            return ()
        now = time.monotonic()
        uptime = None
        out: list[ProcessInfo] = []
        scan: dict[int, list[int]] | None = None
        queue = [root]
        seen: set[int] = set()
        prev, self._prev = self._prev, {}
        while queue and len(out) < MAX_PROCS:
            pid = queue.pop(0)
            if pid in seen:
                continue
            seen.add(pid)
            text = read_text(f"{self.proc}/{pid}/stat")
            if not text:
                continue
            try:
                _pid, comm, state, ppid, ticks, threads, start, rss = parse_stat(text)
            except (ValueError, IndexError):
                continue
            cpu_pct: float | None
            if pid in prev:
                last_ticks, last_t = prev[pid]
                dt = now - last_t
                cpu_pct = 100.0 * (ticks - last_ticks) / _CLK_TCK / dt if dt > 0 else None
            else:
                if uptime is None:
                    uptime = self._uptime_s()
                age_s = uptime - start / _CLK_TCK
                cpu_pct = 100.0 * ticks / _CLK_TCK / age_s if age_s > 0 else None
            self._prev[pid] = (ticks, now)
            out.append(
                ProcessInfo(
                    pid=pid,
                    ppid=ppid,
                    name=comm,
                    state=state,
                    cpu_pct=round(cpu_pct, 1) if cpu_pct is not None else None,
                    rss_mib=round(rss * _PAGE_MIB, 1),
                    threads=threads,
                    zombie=state == "Z",
                )
            )
            kids = self._children(pid)
            if kids is None:
                if scan is None:
                    scan = children_by_parent(self.proc)
                kids = scan.get(pid, [])
            queue.extend(kids)
        return tuple(out)


_HOST_NS: bool | None = None


def in_host_pid_namespace(proc: str = "/proc") -> bool:
    """Whether this process sees the host's PIDs: only the initial PID namespace shows the
    kernel threads (PID 2 is ``kthreadd``). Inside an LXC container NVML reports host PIDs,
    which there are missing or another process, so their names are not read there."""
    global _HOST_NS
    if _HOST_NS is None or proc != "/proc":
        found = (read_text(f"{proc}/2/comm") or "").strip() == "kthreadd"
        if proc != "/proc":
            return found
        _HOST_NS = found
    return _HOST_NS


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgrp, starttime in clock ticks) of ``pid`` from /proc; ``None``: gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) PIDs in process group ``pgid`` or descended from its leader."""
    table: dict[int, tuple[str, int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st:
                table[int(entry)] = st
    members = {pid for pid, st in table.items() if st[2] == pgid}
    if pgid in table:
        members.add(pgid)
    grew = True
    while grew:  # children that left the group (setsid, setpgid) are still the run's
        grew = False
        for pid, st in table.items():
            if st[1] in members and pid not in members:
                members.add(pid)
                grew = True
    return sorted(p for p in members if table[p][0] != "Z")
