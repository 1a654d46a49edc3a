"""Transports by inventory name, with ONE pooled SSH connection per host for the process.

``transport_for(inventory, "lxc200")`` gives a :class:`PctTransport` over the host's
pooled :class:`SshTransport`; ``local`` gives a :class:`LocalTransport`. Every caller
asking for the same host (same settings) shares the same connection.
"""

from __future__ import annotations

import threading

from orchestrator.config.inventory import LOCAL, HostConfig, Inventory
from orchestrator.errors import UsageError
from orchestrator.transport.base import Transport
from orchestrator.transport.local import LocalTransport
from orchestrator.transport.pct import PctTransport

_pool: dict[HostConfig, Transport] = {}
_pool_lock = threading.Lock()


def _ssh(host: HostConfig, inventory: Inventory) -> Transport:
    from orchestrator.transport.ssh import SshTransport
    from orchestrator.transport.ssh_config import resolve

    with _pool_lock:
        found = _pool.get(host)
    if found is not None:
        return found
    jump = None
    spec = resolve(host, peers=inventory.hosts).proxy_jump  # raises on a loop of jump hosts
    if spec and spec in inventory.hosts and spec != host.name:
        jump = _ssh(inventory.hosts[spec], inventory)
    transport = SshTransport(host, jump=jump)  # type: ignore[arg-type]
    with _pool_lock:
        return _pool.setdefault(host, transport)


def host_transport(inventory: Inventory, host_name: str) -> Transport:
    """The pooled transport to host ``host_name`` (``local``: this machine).

    Raises:
        UsageError: no such host in the inventory (the message lists the known ones).
    """
    if host_name == LOCAL:
        return LocalTransport()
    host = inventory.hosts.get(host_name)
    if host is None:
        known = ", ".join(sorted(inventory.hosts)) or "none"
        raise UsageError(f"no host named {host_name!r} in the inventory (known: {known})")
    return _ssh(host, inventory)


def transport_for(inventory: Inventory, container_name: str) -> Transport:
    """The transport into container ``container_name`` (pct over the pooled host connection)."""
    container = inventory.container(container_name)
    if container.is_local:
        return LocalTransport()
    if container.vmid is None:
        raise UsageError(f"container {container_name!r} has no vmid")
    host = host_transport(inventory, container.host)
    return PctTransport(host, container.vmid, name=container.name, env=container.env)


def close_all() -> None:
    """Close every pooled connection (safe to call twice; later calls reconnect)."""
    with _pool_lock:
        pooled = list(_pool.values())
        _pool.clear()
    for transport in pooled:
        transport.close()
