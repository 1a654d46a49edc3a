"""The sandbox's job network: what the nodes of a multi-node job talk over (LXC mode, root).

Built like a small cluster, entirely inside network namespaces the sandbox creates, so
nothing in this machine's own namespace routes there (orch reaches the containers only
through the hosts' sshd and pct, as on Proxmox, where the job network is often a separate
fabric):

- a **switch**: namespace ``orchj-<id>`` with bridge ``sw0``;
- each **host** (``sandbox``, ``sandbox2``...): namespace ``orchj-<id>-<n>`` with bridge
  ``vmbr0`` (Proxmox's default bridge) and ``eno1``, its uplink, a veth whose peer
  ``p<n>`` is a port of ``sw0``;
- each **container**: ``eth0`` (address ``10.99.0.<vmid-190>/24``), a veth whose peer
  ``veth<vmid>i0`` (Proxmox's name) is a port of its host's ``vmbr0``, made by the LXC hook
  below when the container starts (``lxc.hook.start-host``; LXC sets ``LXC_PID``) and gone
  with the container's namespace when it stops.

The hook also writes what a Proxmox host's kernel logs about those ports in that host's
kernel log (the port being added: ``vmbr0: port 2(veth200i0) entered blocking state``,
``... disabled state``, ``veth200i0: entered promiscuous mode``, ``... blocking``, ``...
forwarding state``; ``... entered disabled state`` when the container stops), and :func:`partition` / :func:`heal` take a host's
uplink (or one container's port) down and up with the lines a NIC driver prints (``eno1:
NIC Link is Down``): a silent partition, packets vanish, TCP hangs (no reset).

In process mode there are no namespaces: containers get loopback addresses
``127.0.0.<vmid-190>`` (distinct, so torchrun's c10d ranks them in vmid order).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.sandbox import kernel
from orchestrator.sandbox.files import write_atomic
from orchestrator.sandbox.hosts import kernel_log_path
from orchestrator.sandbox.lxc import cgroup_prefix
from orchestrator.sandbox.state import SandboxError

PREFIX_LEN = 24
SUBNET = "10.99.0"
LOOPBACK = "127.0.0"
UPLINK = "eno1"
BRIDGE = "vmbr0"
NIC = "ixgbe 0000:3b:00.0"
"""The uplink's driver and PCI address in the kernel lines (an Intel 10G NIC, as common)."""

HOOK = r"""#!/bin/sh
# orch sandbox: a container's port on the job network (lxc.hook.start-host / post-stop).
# Written by orchestrator/sandbox/network.py. Args: HOST_NETNS ADDRESS/PREFIX KERNEL_LOG PORT,
# then LXC's: NAME SECTION HOOK.
ns=$1 addr=$2 klog=$3 port=$4 name=$5 hook=$7
dev="veth${name}i0"
k() { printf '%s 6 %s\n' "$(date +%s.%6N)" "$1" >>"$klog"; }
case "$hook" in
start-host)
  ip link add "$dev" netns "$ns" type veth peer name eth0 netns "$LXC_PID" || exit 1
  ip -n "$ns" link set "$dev" master vmbr0 up || exit 1
  nsenter -t "$LXC_PID" -n ip link set lo up || exit 1
  nsenter -t "$LXC_PID" -n ip addr add "$addr" dev eth0 || exit 1
  nsenter -t "$LXC_PID" -n ip link set eth0 up || exit 1
  # br_add_if, then the carrier coming up (net/bridge/br_if.c, br_stp.c; net/core/dev.c 6.5+)
  k "vmbr0: port $port($dev) entered blocking state"
  k "vmbr0: port $port($dev) entered disabled state"
  k "$dev: entered allmulticast mode"
  k "$dev: entered promiscuous mode"
  k "vmbr0: port $port($dev) entered blocking state"
  k "vmbr0: port $port($dev) entered forwarding state"
  ;;
post-stop)
  k "vmbr0: port $port($dev) entered disabled state"
  ;;
esac
exit 0
"""


def unavailable() -> str | None:
    """Why the job network cannot be built here (``None``: it can)."""
    for tool in ("ip", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} is not installed (apt-get install -y iproute2 util-linux)"
    return None


def address_of(vmid: int, isolation: str) -> str:
    """Container ``vmid``'s address on the job network.

    >>> address_of(200, "lxc"), address_of(201, "process")
    ('10.99.0.10', '127.0.0.11')
    """
    return f"{SUBNET if isolation == 'lxc' else LOOPBACK}.{vmid - 190}"


def switch_ns(state_dir: Path) -> str:
    """The switch's namespace: ``orchj-<id>`` (the sandbox's id, as its cgroup's)."""
    return "orchj-" + cgroup_prefix(state_dir).removeprefix("orch-")


def host_ns(state_dir: Path, index: int) -> str:
    """Host number ``index`` (1-based)'s namespace."""
    return f"{switch_ns(state_dir)}-{index}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def _names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def create(state_dir: Path, hosts: Sequence[str]) -> dict[str, str]:
    """Build the switch and one namespace per host; returns host -> its namespace.

    Idempotent: namespaces already there are kept. Raises SandboxError (what ``ip`` said).
    """
    sw = switch_ns(state_dir)
    have = set(_names())
    if sw not in have:
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "sw0", "type", "bridge")
        _ip("-n", sw, "link", "set", "sw0", "up")
        _ip("-n", sw, "link", "set", "lo", "up")
    out: dict[str, str] = {}
    for i, host in enumerate(hosts, 1):
        ns = out[host] = host_ns(state_dir, i)
        if ns in have:
            continue
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", ns, "link", "set", BRIDGE, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip(
            "link", "add", UPLINK, "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", sw
        )
        _ip("-n", ns, "link", "set", UPLINK, "master", BRIDGE, "up")
        _ip("-n", sw, "link", "set", f"p{i}", "master", "sw0", "up")
    return out


def destroy(state_dir: Path) -> list[str]:
    """Delete the switch's and the hosts' namespaces (their veths go with them); returns the
    names deleted. Run after the containers stopped (their ends live in their namespaces)."""
    sw = switch_ns(state_dir)
    gone = []
    for name in _names():
        if name == sw or name.startswith(sw + "-"):
            with contextlib.suppress(SandboxError, OSError, subprocess.SubprocessError):
                _ip("netns", "del", name)
                gone.append(name)
    return gone


def write_hook(lib_dir: Path) -> Path:
    """``lib_dir/lxc-net``: the LXC hook above."""
    path = lib_dir / "lxc-net"
    write_atomic(path, HOOK, 0o755)
    return path


def port_of(vmid: int) -> int:
    """The bridge port number a container's veth gets in the kernel lines (``eno1`` is 1)."""
    return vmid - 198


def lxc_lines(state_dir: Path, vmid: int, host: str, netns: str) -> list[str]:
    """The LXC config lines that give container ``vmid`` on ``host`` its job-network port."""
    hook = state_dir / "lib" / "lxc-net"
    args = (
        f"{hook} {netns} {address_of(vmid, 'lxc')}/{PREFIX_LEN} "
        f"{kernel_log_path(state_dir, host)} {port_of(vmid)}"
    )
    return [f"lxc.hook.start-host = {args}", f"lxc.hook.post-stop = {args}"]


def _host_index(state: Mapping[str, Any], host: str) -> int:
    names = [str(h["name"]) for h in state.get("hosts") or []]
    if host not in names:
        raise SandboxError(f"no host {host!r} in this sandbox (hosts: {', '.join(names)})")
    return names.index(host) + 1


def _link(state_dir: Path, state: Mapping[str, Any], host: str, dev: str, up: bool) -> None:
    if not state.get("network"):
        raise SandboxError("this sandbox has no job network (process mode, or ip missing)")
    ns = host_ns(state_dir, _host_index(state, host))
    _ip("-n", ns, "link", "set", dev, "up" if up else "down")


def partition(
    state_dir: Path, state: Mapping[str, Any], host: str, container: int | None = None
) -> None:
    """Take ``host``'s uplink down (every container on it loses the other hosts), or with
    ``container`` only that container's port; logs what the kernel would on that host."""
    _set_link(state_dir, state, host, container, up=False)


def heal(
    state_dir: Path, state: Mapping[str, Any], host: str, container: int | None = None
) -> None:
    """Undo :func:`partition`."""
    _set_link(state_dir, state, host, container, up=True)


def _set_link(
    state_dir: Path, state: Mapping[str, Any], host: str, container: int | None, *, up: bool
) -> None:
    """The uplink (or ``container``'s bridge port) of ``host`` up or down, and the kernel
    lines a Proxmox host prints for it: the NIC driver's for the uplink, the bridge's for
    the port."""
    bridge = "forwarding" if up else "disabled"
    if container is None:
        dev, port = UPLINK, 1
        nic = "NIC Link is Up 10 Gbps, Flow Control: RX/TX" if up else "NIC Link is Down"
        lines = [f"{NIC} {UPLINK}: {nic}"]
    else:
        dev, port, lines = f"veth{container}i0", port_of(container), []
    _link(state_dir, state, host, dev, up=up)
    lines.append(f"{BRIDGE}: port {port}({dev}) entered {bridge} state")
    for line in lines:
        kernel.append_kernel_line(state_dir, line, level=6, host=host)
