"""Network link lines of a host's kernel log: a NIC or a bridge port going down (pure).

What a Proxmox host logs when a node of a multi-node job loses the job network: its NIC
driver's ``eno1: NIC Link is Down`` (the host's uplink), or the bridge's ``vmbr0: port
3(veth201i0) entered disabled state`` (container 201's port: the container stopped or its
link went down). :func:`orchestrator.agent.kernel.parse_message` makes them
``link-down`` events naming the device.

The bridge lines are the kernel's ``br_log_state`` (net/bridge/br_stp.c, Linux 5.15-6.8:
``br_info(p->br, "port %u(%s) entered %s state\\n", ...)``, printed by netdev_info as
``<bridge>: port <n>(<dev>) entered <state> state``) and ``__dev_set_promiscuity``
(net/core/dev.c: ``"device %s %s promiscuous mode\\n"`` before Linux 6.5, then
``netdev_info(dev, "%s promiscuous mode\\n", ...)``: ``fwln201i0: entered promiscuous
mode``, ``veth201i0 (unregistering): left promiscuous mode``).

Which guest a port belongs to is :data:`PORT_NAMES`: Proxmox names every port it makes after
the guest's vmid (pve-common src/PVE/Network.pm, bookworm 8.x: ``$parse_tap_device_name``
``tap<vmid>i<n>`` / ``veth<vmid>i<n>``, ``$compute_fwbr_names`` ``fwbr<vmid>i<n>``,
``fwln<vmid>i<n>``, ``fwpr<vmid>p<n>``, ``fwln<vmid>o<n>``; qemu-server
src/PVE/QemuServer.pm print_netdev_full ``"tap${vmid}i$i"``; pve-container src/PVE/LXC.pm
update_net ``"veth${vmid}i${netid}"``). A VM's ``tap`` is no container's. Host-wide are only the host's own
devices (:data:`HOST_DEVICES`: physical NICs as pve-common's ``$PHYSICAL_NIC_RE``, bonds,
bridges, VLANs of them) and devices the caller names as job network; anything else (a
Docker veth, a WireGuard tunnel) is neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NIC_DOWN = re.compile(r"(?:^|\s)(\S+?):? (?:NIC )?Link (?:is )?[Dd]own\b")
_PORT_STATE = re.compile(
    r"(\S+): port (\d+)\(([^)\s]+)\) entered (disabled|blocking|listening|learning|forwarding) state"
)
_PROMISC = re.compile(
    r"(?:^|\s)(?:device (\S+) (entered|left) promiscuous mode"
    r"|(\S+?)(?: \(unregistering\))?: (entered|left) promiscuous mode)"
)

PORT_NAMES: tuple[tuple[str, str, str], ...] = (
    (r"veth(\d+)i\d+", "ct", "pve-container src/PVE/LXC.pm update_net: veth${vmid}i${netid}"),
    (r"tap(\d+)i\d+", "vm", "qemu-server src/PVE/QemuServer.pm print_netdev_full: tap${vmid}i$i"),
    (r"fwbr(\d+)i\d+", "guest", "pve-common src/PVE/Network.pm $compute_fwbr_names: fwbr"),
    (r"fwln(\d+)[io]\d+", "guest", "pve-common src/PVE/Network.pm $compute_fwbr_names: fwln"),
    (r"fwpr(\d+)p\d+", "guest", "pve-common src/PVE/Network.pm $compute_fwbr_names: fwpr"),
)
"""Proxmox's port names: (pattern with the vmid as group 1, guest kind, source). ``guest``:
a firewall port, made for a VM's tap or a container's veth alike."""

HOST_DEVICES = re.compile(
    r"(?:eth\d+|en[^:.\s]+|ib[^:.\s]+|(?:nic|if)\d+|bond\d+|vmbr\d+(?:v\d+)?)(?:\.\d+)?"
)
"""The host's own devices: pve-common src/PVE/Network/Interfaces.pm ``$PHYSICAL_NIC_RE``
(``eth\\d+|en[^:.]+|ib[^:.]+|(?:nic|if)\\d+``), bonds, Proxmox bridges (``vmbr0``, and the
``vmbr0v100`` of a VLAN tag on a non-VLAN-aware bridge) and VLAN sub-devices (``eno1.100``)."""

_PORTS = tuple((re.compile(p), kind) for p, kind, _src in PORT_NAMES)

PORT_SEQUENCE_S = 5.0
"""How close the lines of a port being added (blocking, disabled, forwarding) or removed
(disabled, left promiscuous mode) are: within it, they are a guest starting or stopping."""


@dataclass(frozen=True, slots=True)
class PortLine:
    """A bridge-port or promiscuous-mode line: ``device``, ``state`` (``disabled``,
    ``blocking``, ``forwarding``..., or ``promisc-on`` / ``promisc-off``), ``bridge`` (or
    ``None``)."""

    device: str
    state: str
    bridge: str | None = None


def parse_port_line(message: str) -> PortLine | None:
    """The port a bridge-state or promiscuous-mode kernel line names, else ``None``.

    >>> parse_port_line("fwbr201i0: port 2(veth201i0) entered blocking state")
    PortLine(device='veth201i0', state='blocking', bridge='fwbr201i0')
    >>> parse_port_line("veth201i0 (unregistering): left promiscuous mode")
    PortLine(device='veth201i0', state='promisc-off', bridge=None)
    >>> parse_port_line("device tap300i0 entered promiscuous mode").state
    'promisc-on'
    >>> parse_port_line("usb 1-1: new device") is None
    True
    """
    m = _PORT_STATE.search(message)
    if m:
        return PortLine(m.group(3), m.group(4), m.group(1))
    m = _PROMISC.search(message)
    if m:
        dev, word = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        return PortLine(dev, "promisc-on" if word == "entered" else "promisc-off")
    return None


def parse_link_down(message: str) -> str | None:
    """The device a kernel message says went down, else ``None``.

    >>> parse_link_down("ixgbe 0000:3b:00.0 eno1: NIC Link is Down")
    'eno1'
    >>> parse_link_down("mlx5_core 0000:3b:00.0 ens1f0np0: Link down")
    'ens1f0np0'
    >>> parse_link_down("igb 0000:07:00.0 eno1: igb: eno1 NIC Link is Down")
    'eno1'
    >>> parse_link_down("vmbr0: port 3(veth201i0) entered disabled state")
    'veth201i0'
    >>> parse_link_down("vmbr0: port 3(veth201i0) entered forwarding state") is None
    True
    """
    port = _PORT_STATE.search(message)
    if port:
        return port.group(3) if port.group(4) == "disabled" else None
    m = _NIC_DOWN.search(message)
    return m.group(1).rstrip(":") if m else None


def guest_of_device(device: str) -> tuple[int, str] | None:
    """(vmid, kind) of a Proxmox guest's port (kind ``ct``, ``vm`` or ``guest`` for a
    firewall port of either), else ``None``.

    >>> guest_of_device("veth201i0"), guest_of_device("tap300i1"), guest_of_device("fwpr201p0")
    ((201, 'ct'), (300, 'vm'), (201, 'guest'))
    >>> guest_of_device("eno1") is None, guest_of_device("vethab12cd") is None
    (True, True)
    """
    for pattern, kind in _PORTS:
        m = pattern.fullmatch(device)
        if m:
            return int(m.group(1)), kind
    return None


def vmid_of_device(device: str) -> int | None:
    """The guest a Proxmox port belongs to (veth, tap, fwbr, fwln, fwpr), else ``None``.

    >>> vmid_of_device("veth201i0"), vmid_of_device("fwln201i0"), vmid_of_device("eno1")
    (201, 201, None)
    """
    guest = guest_of_device(device)
    return guest[0] if guest else None


def is_host_device(device: str, job_devices: frozenset[str] = frozenset()) -> bool:
    """Whether ``device`` is the host's own (a physical NIC, bond, bridge, VLAN of them) or
    one the caller names as job network: its link going down cuts every guest off.

    >>> is_host_device("eno1"), is_host_device("vmbr0"), is_host_device("bond0.100")
    (True, True, True)
    >>> is_host_device("fwpr201p0"), is_host_device("docker0"), is_host_device("wg0", frozenset({"wg0"}))
    (False, False, True)
    """
    if device in job_devices:
        return True
    return guest_of_device(device) is None and HOST_DEVICES.fullmatch(device) is not None
