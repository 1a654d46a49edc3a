"""Network link lines of a host's kernel log: a NIC or a bridge port going down (pure).

What a Proxmox host logs when a node of a multi-node job loses the job network: its NIC
driver's ``eno1: NIC Link is Down`` (the host's uplink), or the bridge's ``vmbr0: port
3(veth201i0) entered disabled state`` (container 201's port: the container stopped or its
link went down). :func:`orchestrator.agent.kernel.parse_message` makes them
``link-down`` events naming the device.
"""

from __future__ import annotations

import re

_NIC_DOWN = re.compile(r"(?:^|\s)(\S+?):? (?:NIC )?Link (?:is )?[Dd]own\b")
_PORT_DISABLED = re.compile(r"\S+: port \d+\((\S+)\) entered disabled state")
_VETH_VMID = re.compile(r"^veth(\d+)i\d+$")


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
    m = _PORT_DISABLED.search(message)
    if m:
        return m.group(1)
    m = _NIC_DOWN.search(message)
    return m.group(1).rstrip(":") if m else None


def vmid_of_device(device: str) -> int | None:
    """The container a Proxmox veth belongs to (``veth<vmid>i<n>``), else ``None``.

    >>> vmid_of_device("veth201i0"), vmid_of_device("eno1")
    (201, None)
    """
    m = _VETH_VMID.match(device)
    return int(m.group(1)) if m else None
