"""One container seen from the Proxmox host: its state, processes, tmux and run, with no
``pct exec`` and nothing run inside it.

- Running or not: its init process (host PID from ``pct status VMID --verbose``'s ``pid:``,
  what pve-container's ``vmstatus`` reports) still exists with the same start time.
- Processes: the members of its cgroup (:mod:`orchestrator.agent.cgroups`), each with its
  PID inside (``NSpid``) and process group inside (``NSpgid``).
- The run: ``runs/current`` and the run directory read through its root
  (:class:`~orchestrator.agent.rootfs.ContainerRoot`: never a host file) by the same
  :class:`~orchestrator.agent.runfacts.RunReader` the in-container agent uses.
- The run's processes: the tree under its wrapper (``wrapper.pid``: PID inside and start
  time) plus its process group (``pgid``), so a command that outlived its wrapper counts.
- tmux: the server that counts is the run's own: the wrapper's parent (``tmux: server``),
  else the one ``tmux.pid`` names (PID inside and start time, written at launch), never any
  process whose ``comm`` is ``tmux: server`` (a root ``tmux -L other`` session, a non-root
  user's renamed binary). The pane's screen is not read from here (that takes ``pct exec``): a live
  wrapper means a live pane; a dead one with the server up means a dead pane kept by
  ``remain-on-exit``, whose status is the run's ``exit_status``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import BinaryIO

from orchestrator.agent.cgroups import CgroupMounts, members, read_text
from orchestrator.agent.hostprocs import (
    HostProcess,
    ProcessReader,
    cpu_pct,
    descendants,
    start_ticks,
)
from orchestrator.agent.procs import _CLK_TCK
from orchestrator.agent.rootfs import ContainerRoot
from orchestrator.agent.rundir import TMUX_PID
from orchestrator.agent.runfacts import RunReader, vfs_mib
from orchestrator.wire.model import ProcessInfo, RunState, SessionState, Snapshot

TMUX_SERVER = "tmux: server"
"""The ``comm`` tmux gives its server process."""
MAX_TREE = 256
"""Most processes a snapshot lists for the run (as the in-container agent)."""
DEVICE_RECHECK_S = 60.0
"""How often the container's GPU device nodes (``/dev/nvidia<N>``) are listed again."""


class RootFiles:
    """:class:`~orchestrator.agent.runfacts.Files` over a container root (nothing when it is
    gone: every file then reads as missing)."""

    def __init__(self) -> None:
        self.root: ContainerRoot | None = None

    def _root(self) -> ContainerRoot:
        if self.root is None:
            raise FileNotFoundError("the container is not running")
        return self.root

    def read(self, path: str, limit: int) -> tuple[bytes | None, float | None]:
        return self.root.read(path, limit) if self.root is not None else (None, None)

    def mtime(self, path: str) -> float | None:
        try:
            return self._root().stat(path).st_mtime
        except OSError:
            return None

    def open(self, path: str) -> BinaryIO:
        return self._root().open(path)

    def disk(self, path: str, fallback: str) -> tuple[float | None, float | None]:
        for p in (path, fallback):
            try:
                return vfs_mib(self._root().statvfs(p))
            except OSError:
                continue
        return None, None


def parse_pid_file(raw: bytes | None) -> tuple[int, int | None] | None:
    """``wrapper.pid`` (``PID START``) or ``pgid`` (``PID``) -> (PID, start ticks or ``None``).

    >>> parse_pid_file(b"17 123456\\n"), parse_pid_file(b"42\\n"), parse_pid_file(b"x")
    ((17, 123456), (42, None), None)
    """
    parts = (raw or b"").decode("ascii", "replace").split()
    if not parts or not parts[0].isdigit():
        return None
    start = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return int(parts[0]), start


def find_inner(
    table: Mapping[int, HostProcess], inner: int, start: int | None = None
) -> HostProcess | None:
    """The process the container knows as PID ``inner`` (and started at ``start``, when given)."""
    for p in table.values():
        if p.inner == inner and (start is None or p.start == start):
            return p
    return None


def run_tree(
    table: Mapping[int, HostProcess], wrapper: HostProcess | None, pgid: int | None
) -> list[HostProcess]:
    """The run's processes: the wrapper's tree, then its process group's members (and their
    trees) not already in it; at most :data:`MAX_TREE`."""
    pids: list[int] = descendants(wrapper.pid, dict(table)) if wrapper is not None else []
    if pgid is not None:
        for p in sorted(table.values(), key=lambda p: p.pid):
            if p.inner_pgid == pgid and p.pid not in pids:
                pids.extend(x for x in descendants(p.pid, dict(table)) if x not in pids)
    return [table[p] for p in pids[:MAX_TREE]]


def session_state(
    name: str,
    table: Mapping[int, HostProcess],
    wrapper: HostProcess | None,
    run: RunState | None,
    own: tuple[int, int | None] | None = None,
) -> SessionState:
    """What the host can tell of the run's tmux session (see the module's docstring).
    ``own``: the run's server from ``tmux.pid`` (PID inside, start ticks).

    >>> w = HostProcess(50, "bash", "S", 40, 50, 1, 0, 1, 0.0, inner=7)
    >>> s = HostProcess(40, TMUX_SERVER, "S", 1, 40, 1, 0, 1, 0.0, inner=3)
    >>> st = session_state("train", {40: s, 50: w}, w, None)
    >>> (st.exists, st.server_running, st.pane_dead, st.pane_pid)
    (True, True, False, 7)
    >>> st = session_state("train", {40: s}, None, RunState("r", "/r", exit_status=1), (3, 1))
    >>> (st.exists, st.pane_dead, st.pane_dead_status)
    (True, True, 1)
    >>> session_state("train", {}, None, None).server_running
    False

    Another server (a root ``tmux -L other``, a renamed binary) is not the run's:

    >>> session_state("train", {40: s}, None, RunState("r", "/r"), (9, 1)).server_running
    False
    >>> session_state("train", {40: s}, None, RunState("r", "/r")).server_running
    False
    """
    server = None
    if wrapper is not None and wrapper.ppid in table and table[wrapper.ppid].comm == TMUX_SERVER:
        server = table[wrapper.ppid]
    if server is None and own is not None:
        server = find_inner(table, own[0], own[1])
        if server is not None and (server.comm != TMUX_SERVER or server.state == "Z"):
            server = None
    running = server is not None
    if wrapper is not None and wrapper.state != "Z":
        return SessionState(
            name, True, server_running=running, pane_dead=False, pane_pid=wrapper.inner
        )
    if not running:
        return SessionState(name, False, server_running=False)
    status = run.exit_status if run is not None else None
    return SessionState(name, True, server_running=True, pane_dead=True, pane_dead_status=status)


class ContainerView:
    """One container of the host, observed again and again (state kept between observations).

    Args:
        name, vmid, workdir, session: the container as hosts.yaml names it.
        log_patterns: its metric regexes.
        mounts: the host's cgroup mounts.
        procs: the host's process reader (shared by every container of the host).
    """

    def __init__(
        self,
        name: str,
        vmid: int,
        workdir: str,
        session: str,
        *,
        mounts: CgroupMounts,
        procs: ProcessReader,
        log_patterns: Mapping[str, str] | None = None,
        proc: str = "/proc",
    ) -> None:
        self.name, self.vmid, self.workdir, self.session = name, vmid, workdir, session
        self.mounts, self.procs, self.proc = mounts, procs, proc
        self.files = RootFiles()
        self.runs = RunReader(workdir, self.files, log_patterns=log_patterns)
        self.init: tuple[int, int] | None = None
        self.cgroup: str | None = None
        self.table: dict[int, HostProcess] = {}
        self.status: str | None = None
        self.checked_at: float | None = None
        self._cpu: dict[tuple[int, int], tuple[int, float]] = {}
        self._devices: tuple[float, frozenset[int] | None] | None = None

    # --- attach / detach --------------------------------------------------------------------

    def running(self) -> bool:
        """Its init (as attached) still exists with the same start time."""
        return self.init is not None and start_ticks(self.init[0], self.proc) == self.init[1]

    def attach(self, pid: int) -> str | None:
        """Take init ``pid`` (host PID) as the container's: open its root, find its cgroup.
        Returns why it could not (``None``: attached)."""
        self.detach()
        start = start_ticks(pid, self.proc)
        if start is None:
            return f"init pid {pid} is gone"
        try:
            self.files.root = ContainerRoot(f"{self.proc}/{pid}/root")
        except OSError as exc:
            return f"cannot open the root of CT {self.vmid} (pid {pid}): {exc.strerror}"
        self.init = (pid, start)
        self.cgroup = self.mounts.directory(pid)
        self._devices = None
        return None

    def detach(self) -> None:
        """Forget the running container (it stopped, or restarts)."""
        if self.files.root is not None:
            self.files.root.close()
            self.files.root = None
        self.init, self.table = None, {}
        self._cpu.clear()

    # --- observation ------------------------------------------------------------------------

    def read_table(self) -> dict[int, HostProcess]:
        """The container's processes now (from its cgroup), by host PID."""
        pids: list[int] = []
        if self.cgroup is not None:
            pids = list(members(self.cgroup))
        if not pids and self.init is not None:
            pids = [self.init[0]]
        self.table = self.procs.read_all(pids)
        return self.table

    def gpu_devices(self, now: float) -> frozenset[int] | None:
        """Minor numbers of the GPU device nodes in its ``/dev`` (``None``: it sees every GPU,
        as the sandbox's ``/dev/orch-nvidia`` stands for all of them; empty: none)."""
        if self._devices is not None and now - self._devices[0] < DEVICE_RECHECK_S:
            return self._devices[1]
        root = self.files.root
        found: frozenset[int] | None = frozenset()
        try:
            names = root.listdir("/dev") if root is not None else []
        except OSError:
            names = []
        minors = {int(n[6:]) for n in names if n.startswith("nvidia") and n[6:].isdigit()}
        if minors:
            found = frozenset(minors)
        elif "orch-nvidia" in names:
            found = None
        self._devices = (now, found)
        return found

    def observe(self, now: float) -> Snapshot:
        """The container's snapshot as the host sees it (``gpus`` left empty: the observer
        knows the host's GPUs). Never raises for what it finds."""
        errors: list[str] = []
        if self.status != "running" or self.files.root is None:
            return Snapshot(
                target=self.name,
                taken_at=now,
                container_status=self.status or "unknown",
                vmid=self.vmid,
                source="host",
            )
        table = self.read_table()
        run, nbytes = self.runs.read(now, errors)
        wrapper = pgid = own = None
        if run is not None:
            rec = parse_pid_file(self.runs.small(run.run_dir, "wrapper.pid")[0])
            wrapper = find_inner(table, rec[0], rec[1]) if rec else None
            own = parse_pid_file(self.runs.small(run.run_dir, TMUX_PID)[0])
            group = parse_pid_file(self.runs.small(run.run_dir, "pgid")[0])
            pgid = group[0] if group and run.exit_status is None else None
        name = run.manifest.session if run is not None and run.manifest else self.session
        session = session_state(name, table, wrapper, run, own)
        tree = run_tree(table, wrapper, pgid) if run is not None else []
        return Snapshot(
            target=self.name,
            taken_at=now,
            session=session,
            run=run,
            processes=self._process_infos(tree, table),
            metrics=self.runs.last_metrics,
            errors=tuple(errors),
            container_status="running",
            vmid=self.vmid,
            source="host",
        )

    def _process_infos(
        self, tree: list[HostProcess], table: Mapping[int, HostProcess]
    ) -> tuple[ProcessInfo, ...]:
        mono = time.monotonic()
        uptime = None
        out = []
        seen: dict[tuple[int, int], tuple[int, float]] = {}
        for p in tree:
            key = (p.pid, p.start)
            prev = self._cpu.get(key)
            if prev is None and uptime is None:
                text = read_text(f"{self.proc}/uptime") or "0"
                uptime = float(text.split()[0]) if text.split() else 0.0
            age = (uptime or 0.0) - p.start / _CLK_TCK
            seen[key] = (p.ticks, mono)
            parent = table.get(p.ppid)
            out.append(
                ProcessInfo(
                    pid=p.inner if p.inner is not None else p.pid,
                    ppid=parent.inner if parent is not None and parent.inner is not None else 0,
                    name=p.comm,
                    state=p.state,
                    cpu_pct=cpu_pct(p.ticks, prev, mono, age),
                    rss_mib=p.rss_mib,
                    threads=p.threads,
                    zombie=p.state == "Z",
                    host_pid=p.pid,
                )
            )
        self._cpu = seen
        return tuple(out)
