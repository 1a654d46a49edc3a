"""``SandboxInfo``: a running sandbox, and how a test or tool reaches into its containers."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.sandbox import lxc, process
from orchestrator.sandbox.state import HOST_NAME, WORKDIR, SandboxError, host_env


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A running sandbox. Paths are absolute; ``containers`` are names (``ct200``, ...).

    ``isolation`` is ``lxc`` or ``process``; ``fallback`` says in one line why ``up``
    chose ``process`` when LXC was not asked for explicitly (``None`` otherwise).
    """

    state_dir: Path
    config_path: Path
    port: int
    sshd_pid: int
    containers: tuple[str, ...]
    vmids: tuple[int, ...]
    gpus: int
    scenario: str
    identity_file: Path
    known_hosts_path: Path
    cgroup: bool
    isolation: str = "process"
    fallback: str | None = None
    host: str = HOST_NAME
    hosts: tuple[str, ...] = (HOST_NAME,)
    ports: tuple[int, ...] = ()
    placement: tuple[tuple[str, str], ...] = ()
    """(container, host) pairs: which simulated host runs each container."""
    addresses: tuple[tuple[str, str], ...] = ()
    """(container, address) pairs: each container's address on the job network."""
    network: str | None = None
    """The job network's switch namespace (``None``: process mode, or no ``ip`` here)."""

    def host_of(self, container: str | int) -> str:
        """The simulated host that runs ``container`` (``sandbox``, ``sandbox2``...)."""
        name = f"ct{vmid_of(container)}"
        return dict(self.placement).get(name, self.host)

    def address(self, container: str | int) -> str | None:
        """``container``'s address on the job network (``None`` without one)."""
        return dict(self.addresses).get(f"ct{vmid_of(container)}")

    def container_root(self, vmid: int) -> Path:
        """The host directory that is the container's ``/`` (LXC: without its mounts)."""
        return root_of(self.state_dir, self.isolation, vmid)

    def workdir(self, container: str | int) -> Path:
        """The workdir of ``ct200`` (or vmid 200) as a host path (its files, seen from outside)."""
        return self.container_root(vmid_of(container)) / WORKDIR

    def container_workdir(self, container: str | int) -> str:
        """The workdir as orch and hosts.yaml name it: ``/root/dflash`` inside an LXC container,
        the host path in process mode."""
        if self.isolation == "lxc":
            return "/" + WORKDIR
        return str(self.workdir(container))

    def host_path(self, container: str | int, path: str | Path) -> Path:
        """A path inside the container as the host reaches it.

        LXC: below the root file system, except what the container mounts (/usr, /run,
        /dev, /proc, /sys), reached through ``/proc/<init>/root`` (SandboxError when the
        container is stopped). Process mode: below the container's directory; a path
        already there stays.
        """
        vmid = vmid_of(container)
        root = self.container_root(vmid)
        rel = str(path).lstrip("/")
        if self.isolation != "lxc":
            return Path(path) if Path(path).is_relative_to(root) else root / rel
        if rel.split("/", 1)[0] not in lxc.MOUNTED:
            return root / rel
        init = lxc.init_pid(self.state_dir, vmid)
        if init is None:
            raise SandboxError(f"ct{vmid} is not running")
        return Path(f"/proc/{init}/root") / rel

    def init_pid(self, container: str | int) -> int | None:
        """Host PID of the container's init (LXC); None when stopped or in process mode."""
        if self.isolation != "lxc":
            return None
        return lxc.init_pid(self.state_dir, vmid_of(container))

    def host_pid(self, container: str | int, pid: int, *, group: bool = False) -> int | None:
        """The host PID of the process (with ``group``: the process group) the container knows
        as ``pid``; None when it has none (process mode: ``pid`` itself)."""
        if self.isolation != "lxc":
            return pid
        return lxc.host_pid(self.state_dir, vmid_of(container), pid, group=group)

    def kill(
        self, container: str | int, pid: int, sig: int = signal.SIGKILL, *, group: bool = False
    ) -> int:
        """Fault injection: send ``sig`` to the process (group) the container knows as ``pid``
        (a PID read inside it: a run's ``pgid``, a tmux pane); returns the host id signalled.

        Raises:
            SandboxError: the container has no such process: a container's PID never
                reaches ``os.kill`` as a host PID.
        """
        host = self.host_pid(container, pid, group=group)
        if host is None or host <= 1:
            raise SandboxError(f"{container} has no process {'group ' if group else ''}{pid}")
        (os.killpg if group else os.kill)(host, sig)
        return host

    def container_pids(self, container: str | int) -> list[int]:
        """Host PIDs of every process in the container (LXC: its PID namespace, init included;
        process mode: those carrying its marker)."""
        vmid = vmid_of(container)
        if self.isolation != "lxc":
            return process.marked_processes(self.state_dir, vmid)
        init = lxc.init_pid(self.state_dir, vmid)
        return lxc.namespace_pids(init) if init else []

    def env(self) -> dict[str, str]:
        """Environment that runs the stand-ins locally as the sandbox sshd would (``pct``, ``dmesg``)."""
        return host_env(self.state_dir)

    def to_dict(self) -> dict[str, Any]:
        """The ``orch sandbox up --json`` document."""
        return {
            "config": str(self.config_path),
            "state_dir": str(self.state_dir),
            "isolation": self.isolation,
            "host": self.host,
            "port": self.port,
            "sshd_pid": self.sshd_pid,
            "containers": list(self.containers),
            "vmids": list(self.vmids),
            "gpus": self.gpus,
            "scenario": self.scenario,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts_path),
            "cgroup": self.cgroup,
            "hosts": [
                {"name": h, "port": p, "containers": [c for c, at in self.placement if at == h]}
                for h, p in zip(self.hosts, self.ports or (self.port,), strict=False)
            ],
            "addresses": dict(self.addresses),
            "network": self.network,
        }


def root_of(state_dir: Path, isolation: str, vmid: int) -> Path:
    if isolation == "lxc":
        return lxc.rootfs(state_dir, vmid)
    return process.container_root(state_dir, vmid)


def vmid_of(container: str | int) -> int:
    try:
        return container if isinstance(container, int) else int(str(container).removeprefix("ct"))
    except ValueError:
        raise UsageError(
            f"not a sandbox container: {container!r} (use ct200, ct201, ... or a vmid)"
        ) from None
