"""Where to connect: a host of hosts.yaml merged with its ``~/.ssh/config`` alias (address,
port, user, identity files, ProxyJump) into an :class:`Endpoint` (reads the file; no network).

The pooled connection itself is :mod:`orchestrator.transport.ssh`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.config.inventory import HostConfig


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A host's SSH settings after merging hosts.yaml with ``~/.ssh/config``."""

    name: str
    address: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: Path
    proxy_jump: str | None
    connect_timeout_s: float
    keepalive_s: float

    @property
    def known_name(self) -> str:
        """The name known_hosts files use: ``addr`` on port 22, else ``[addr]:port``."""
        return known_host_name(self.address, self.port)


def known_host_name(address: str, port: int) -> str:
    """
    >>> known_host_name("10.1.2.6", 22), known_host_name("127.0.0.1", 2222)
    ('10.1.2.6', '[127.0.0.1]:2222')
    """
    return address if port == 22 else f"[{address}]:{port}"


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """The first hop of a ProxyJump spec ``[user@]host[:port][,next...]``.

    >>> parse_jump("admin@bastion:2222"), parse_jump("bastion"), parse_jump("a,b")
    (('admin', 'bastion', 2222), (None, 'bastion', None), (None, 'a', None))
    """
    first = spec.split(",")[0].strip()
    user, _, hostport = first.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else None
    elif hostport.count(":") == 1:
        host, port_s = hostport.split(":")
        port = int(port_s)
    return (user or None), host, port


def default_ssh_config() -> Path:
    return Path("~/.ssh/config").expanduser()


def resolve(host: HostConfig, ssh_config_path: Path | None = None) -> Endpoint:
    """Merge ``host`` with its ``ssh_config`` alias: hosts.yaml wins for what it sets.

    A field counts as set when hosts.yaml named it (``HostConfig.explicit``) or it differs
    from the dataclass default. Reads ``ssh_config_path`` (default ``~/.ssh/config``) only
    when ``host.ssh_config`` is set.
    """
    explicit: frozenset[str] = getattr(host, "explicit", frozenset())

    def given(field: str, default: object) -> bool:
        return field in explicit or getattr(host, field) != default

    address, port, user = host.address, host.port, host.user
    identity = (host.identity_file,) if host.identity_file else ()
    jump = host.proxy_jump
    path = ssh_config_path or default_ssh_config()
    alias = host.ssh_config
    if alias:
        found = paramiko.SSHConfig.from_path(str(path)).lookup(alias) if path.is_file() else {}
        if address in ("", alias) or "address" not in explicit and address == host.name:
            address = found.get("hostname", alias)
        if not given("port", 22) and "port" in found:
            port = int(found["port"])
        if not given("user", "root") and "user" in found:
            user = found["user"]
        if not identity and found.get("identityfile"):
            identity = tuple(found["identityfile"])
        if not jump and found.get("proxyjump") and found["proxyjump"].lower() != "none":
            jump = found["proxyjump"]
    known = Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()
    return Endpoint(
        name=host.name,
        address=address,
        port=port,
        user=user,
        identity_files=tuple(os.path.expanduser(p) for p in identity),
        known_hosts=known,
        proxy_jump=jump,
        connect_timeout_s=host.connect_timeout_s,
        keepalive_s=host.keepalive_s,
    )
