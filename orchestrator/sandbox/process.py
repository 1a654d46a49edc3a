"""Process mode: a sandbox container as a directory and a marker, for where LXC cannot run.

Container ``<vmid>`` is the directory ``containers/<vmid>/`` (its "/": ``root/`` holds
HOME and the workdir ``root/dflash``, ``tmp/`` its tmux sockets, ``usr/bin/`` nvidia-smi,
dmesg and python3), a ``status`` file and a ``cgroup`` file. There is no namespace: the
workdir in hosts.yaml is the absolute host path, PIDs are host PIDs. ``pct exec`` marks
every process with ``ORCH_SANDBOX_CT=<state>:<vmid>`` and, where cgroup v2 is writable,
puts it in ``<cgroup2>/lxc/<vmid>/ns/orch-sandbox-<id>`` so ``/proc/<pid>/cgroup``
names ``lxc/<vmid>`` as on Proxmox.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.sandbox.files import python_link, rmdir_cgroup, standin_wrapper, write_atomic
from orchestrator.sandbox.state import WORKDIR, SandboxError

log = logging.getLogger(__name__)

_UNIX_SOCKET_MAX = 107  # sun_path holds 108 bytes with the NUL


def container_root(state_dir: Path, vmid: int) -> Path:
    """The host directory that is the container's ``/``."""
    return state_dir / "containers" / str(vmid)


def cgroup2_mount() -> Path | None:
    """Where cgroup v2 is mounted (``/sys/fs/cgroup`` or ``/sys/fs/cgroup/unified``), if anywhere."""
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split()[4])
    except OSError:
        pass
    return None


def cgroup_leaf_path(state_dir: Path, vmid: int) -> Path | None:
    """``<cgroup2>/lxc/<vmid>/ns/orch-sandbox-<id>`` (``id`` from the state dir's path), or None
    without cgroup v2. Only computes the path: nothing is created."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    ident = hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]
    return mount / "lxc" / str(vmid) / "ns" / f"orch-sandbox-{ident}"


def _cgroup_leaf(state_dir: Path, vmid: int) -> Path | None:
    """Create this sandbox's leaf for ``vmid`` (see :func:`cgroup_leaf_path`) if it can, else None.

    Retried a few times: another sandbox's ``down`` may rmdir the shared, empty
    ``lxc/<vmid>/ns`` parent between our mkdirs (FileNotFoundError).
    """
    leaf = cgroup_leaf_path(state_dir, vmid)
    if leaf is None:
        return None
    for _ in range(5):
        try:
            leaf.mkdir(parents=True, exist_ok=True)
            break
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return leaf if os.access(leaf / "cgroup.procs", os.W_OK) else None


def remove_cgroup(leaf: Path, timeout_s: float = 3.0) -> bool:
    """rmdir this sandbox's ``leaf``, then ``lxc/<vmid>/ns`` and ``lxc/<vmid>`` if empty.

    Processes still in the leaf are this sandbox's by construction: they are SIGKILLed
    and the rmdir retried (EBUSY while they exit) until ``timeout_s``. The parents are
    shared with every sandbox on this machine that uses the same vmid; an rmdir of a
    cgroup with children or processes fails (EBUSY/ENOTEMPTY), which is the safe test
    that no other sandbox uses it. ``lxc`` itself goes too when empty (the sandbox
    made it). Returns False when the leaf could not be removed.
    """
    if not rmdir_cgroup(leaf, time.monotonic() + timeout_s):
        return False
    for path in (leaf.parent, leaf.parent.parent, leaf.parent.parent.parent):  # ns, <vmid>, lxc
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # EBUSY / ENOTEMPTY: another sandbox's leaf lives below
            break
    return True


def own_vmids(state_dir: Path, state: Mapping[str, Any]) -> list[int]:
    """The sandbox's containers: those in ``state.json`` and every ``containers/<vmid>``
    (an ``up`` that failed half-way has made and started containers but recorded none)."""
    vmids = {int(c["vmid"]) for c in state.get("containers", [])}
    with contextlib.suppress(OSError):
        vmids.update(int(p.name) for p in (state_dir / "containers").iterdir() if p.name.isdigit())
    return sorted(vmids)


def own_cgroups(state_dir: Path, state: Mapping[str, Any]) -> list[Path]:
    """Every cgroup leaf this sandbox may have made: the recorded one and the computed
    one (:func:`cgroup_leaf_path`) of each of its vmids."""
    leaves: list[Path] = []
    for vmid in own_vmids(state_dir, state):
        recorded = container_root(state_dir, vmid) / "cgroup"
        with contextlib.suppress(OSError):
            text = recorded.read_text().strip()
            if text:
                leaves.append(Path(text))
        computed = cgroup_leaf_path(state_dir, vmid)
        if computed is not None and computed not in leaves:
            leaves.append(computed)
    return leaves


def make_container(state_dir: Path, vmid: int) -> Path:
    """Create (or refresh) container ``vmid``'s directory; returns it. Its status starts stopped."""
    root = container_root(state_dir, vmid)
    for sub in (WORKDIR, "tmp", "usr/bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    socket = root / "tmp" / f"tmux-{os.getuid()}" / "default"
    if len(str(socket)) > _UNIX_SOCKET_MAX:
        raise SandboxError(
            f"state directory too deep: the tmux socket {socket} would exceed {_UNIX_SOCKET_MAX} bytes; "
            f"use a shorter --dir"
        )
    standin_wrapper(root / "usr" / "bin" / "nvidia-smi", "nvidia-smi")
    standin_wrapper(root / "usr" / "bin" / "dmesg", "dmesg")
    python_link(root / "usr" / "bin")
    leaf = _cgroup_leaf(state_dir, vmid)
    write_atomic(root / "cgroup", f"{leaf or ''}\n")
    if not (root / "status").exists():
        write_atomic(root / "status", "stopped\n")
    return root


def is_running(state_dir: Path, vmid: int) -> bool:
    """Whether the container's status file says running."""
    try:
        return (container_root(state_dir, vmid) / "status").read_text().strip() == "running"
    except OSError:
        return False


def environ_has(pid: int, needles: tuple[bytes, ...], prefixes: tuple[bytes, ...]) -> bool:
    """Whether process ``pid``'s environment holds one of ``needles`` or an entry starting with
    one of ``prefixes`` (False when it is gone or unreadable)."""
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(e in needles or e.startswith(prefixes) for e in entries)


def marked_processes(state_dir: Path, vmid: int | None = None) -> list[int]:
    """Processes started through this sandbox (host side, by ``ORCH_SANDBOX_STATE``) and in
    its process-mode containers (``ORCH_SANDBOX_CT``); only container ``vmid``'s when given."""
    if vmid is None:
        needles: tuple[bytes, ...] = (f"ORCH_SANDBOX_STATE={state_dir}".encode(),)
        prefixes: tuple[bytes, ...] = (f"ORCH_SANDBOX_CT={state_dir}:".encode(),)
    else:
        needles, prefixes = (f"ORCH_SANDBOX_CT={state_dir}:{vmid}".encode(),), ()
    me = os.getpid()
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) != me and environ_has(int(p.name), needles, prefixes)
    ]
