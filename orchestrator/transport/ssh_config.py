"""Where to connect: a host of hosts.yaml merged with its ``~/.ssh/config`` alias (address,
port, user, identity files, ProxyJump chain, ProxyCommand) into an :class:`Endpoint` (reads
the files as OpenSSH does, see :mod:`orchestrator.transport.openssh_config`; no network).

The pooled connection itself is :mod:`orchestrator.transport.ssh`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.inventory import HostConfig
from orchestrator.errors import ConfigError
from orchestrator.transport.openssh_config import (
    SshOptions,
    expand_identity,
    parse_jump,
    proxy_command_line,
    resolve_options,
)

MAX_HOPS = 16
"""Jump hosts one route may cross (a chain of jump hosts jumping through each other ends)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A host's SSH settings after merging hosts.yaml with ``~/.ssh/config``.

    ``via``: the jump host connected through (itself an Endpoint, with its own ``via``);
    ``proxy_command``: the expanded command whose stdin/stdout is the connection (run by
    ``$SHELL -c``; never both). ``proxy_jump`` is the raw ProxyJump list that made ``via``.
    """

    name: str
    address: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: Path
    proxy_jump: str | None
    connect_timeout_s: float
    keepalive_s: float
    proxy_command: str | None = None
    via: Endpoint | None = None
    notes: tuple[str, ...] = ()

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


def default_ssh_config() -> Path:
    return Path("~/.ssh/config").expanduser()


def _identities(opts: SshOptions, where: str) -> tuple[str, ...]:
    try:
        return tuple(expand_identity(p, opts) for p in opts.identity_files if p.lower() != "none")
    except ValueError as exc:
        raise ConfigError(where, None, "identityfile", str(exc)) from None


def _command(opts: SshOptions, where: str) -> str | None:
    if opts.proxy_command is None:
        return None
    try:
        return proxy_command_line(opts)
    except ValueError as exc:
        raise ConfigError(where, None, "proxycommand", f"{opts.proxy_command!r}: {exc}") from None


def _chain(spec: str, path: Path | None, target: HostConfig, known: Path, depth: int) -> Endpoint:
    """The last hop of ``spec`` resolved as ``ssh -J REST -l U -p P HOP`` resolves it (ssh.c
    main builds that command), its own earlier hops behind it in ``via``."""
    where = str(path or default_ssh_config())
    hops = parse_jump(spec)
    if hops is None:
        raise ConfigError(where, None, "proxyjump", f"bad ProxyJump {spec!r} of {target.name}")
    if depth + len(hops) - 1 > MAX_HOPS:
        raise ConfigError(
            where,
            None,
            "proxyjump",
            f"{target.name}: more than {MAX_HOPS} jump hosts (do jump hosts jump through each other?)",
        )
    last = hops[-1]
    rest = ",".join(spec.split(",")[:-1]) or None
    opts = resolve_options(last.host, path, user=last.user, port=last.port, jump=rest)
    via = _chain(opts.proxy_jump, path, target, known, depth + 1) if opts.proxy_jump else None
    return Endpoint(
        name=last.host,
        address=opts.hostname,
        port=opts.port,
        user=opts.user,
        identity_files=_identities(opts, where),
        known_hosts=known,
        proxy_jump=opts.proxy_jump,
        connect_timeout_s=target.connect_timeout_s,
        keepalive_s=target.keepalive_s,
        proxy_command=_command(opts, where),
        via=via,
    )


def resolve(
    host: HostConfig,
    ssh_config_path: Path | None = None,
    *,
    local_user_default: bool = False,
    peers: Mapping[str, HostConfig] | None = None,
    depth: int = 1,
) -> Endpoint:
    """Merge ``host`` with its ``ssh_config`` alias: hosts.yaml wins for what it sets.

    A field counts as set when hosts.yaml named it (``HostConfig.explicit``) or it differs
    from the dataclass default; set ones act like ssh's ``-l``/``-p``/``-J`` (they win, and
    ``Match user`` sees them). The files are read only when ``host.ssh_config`` is set or a
    ProxyJump names hops: ``ssh_config_path`` alone (like ``ssh -F``), or by default
    ``~/.ssh/config`` then ``/etc/ssh/ssh_config``. Every hop is resolved as its own host
    (its user from the files, else the local user); the user of an alias without ``User``
    stays hosts.yaml's default, ``root`` (the local user with ``local_user_default``, as
    ``ssh`` itself: :func:`alias_host`'s bare aliases). A ProxyJump that names one of
    ``peers`` (the inventory's hosts) is that host, resolved in turn (as the pool connects).

    Raises:
        ConfigError: the ssh config is malformed (file:line), or the chain is too long.
    """
    explicit: frozenset[str] = getattr(host, "explicit", frozenset())

    def given(field: str, default: object) -> bool:
        return field in explicit or getattr(host, field) != default

    address, port, user = host.address, host.port, host.user
    identity: tuple[str, ...] = (
        (os.path.expanduser(host.identity_file),) if host.identity_file else ()
    )
    jump, command = host.proxy_jump or None, None
    notes: tuple[str, ...] = ()
    known = Path(host.known_hosts or "~/.ssh/known_hosts").expanduser()
    alias = host.ssh_config
    if alias:
        where = str(ssh_config_path or default_ssh_config())
        opts = resolve_options(
            alias,
            ssh_config_path,
            user=user if given("user", "root") else None,
            port=port if given("port", 22) else None,
            jump=jump,
        )
        if address in ("", alias) or "address" not in explicit and address == host.name:
            address = opts.hostname
        port = opts.port
        if opts.user_given or local_user_default:
            user = opts.user
        identity = identity or _identities(opts, where)
        jump, command, notes = opts.proxy_jump, _command(opts, where), opts.notes
    return Endpoint(
        name=host.name,
        address=address,
        port=port,
        user=user,
        identity_files=identity,
        known_hosts=known,
        proxy_jump=jump,
        connect_timeout_s=host.connect_timeout_s,
        keepalive_s=host.keepalive_s,
        proxy_command=command,
        via=_via(jump, ssh_config_path, host, known, peers, depth),
        notes=notes,
    )


def _via(
    jump: str | None,
    path: Path | None,
    host: HostConfig,
    known: Path,
    peers: Mapping[str, HostConfig] | None,
    depth: int,
) -> Endpoint | None:
    if not jump:
        return None
    if peers is None or jump not in peers or jump == host.name:
        return _chain(jump, path, host, known, depth)
    if depth >= MAX_HOPS:
        raise ConfigError(
            "hosts.yaml", None, f"hosts.{host.name}.proxy_jump", f"more than {MAX_HOPS} jump hosts"
        )
    return resolve(peers[jump], path, peers=peers, depth=depth + 1)


def alias_host(alias: str) -> HostConfig:
    """A hosts.yaml-like entry for a bare ``~/.ssh/config`` alias (``ssh ALIAS``); resolve it
    with ``local_user_default=True``."""
    return HostConfig(name=alias, address=alias, ssh_config=alias)


def hop_host(ep: Endpoint) -> HostConfig:
    """A hosts.yaml-like entry for a resolved hop (its transport uses ``ep`` as is)."""
    return HostConfig(
        name=ep.name,
        address=ep.address,
        port=ep.port,
        user=ep.user,
        known_hosts=str(ep.known_hosts),
        connect_timeout_s=ep.connect_timeout_s,
        keepalive_s=ep.keepalive_s,
    )


def hops(ep: Endpoint) -> list[Endpoint]:
    """``ep``'s jump hosts in connection order (the first one orch connects to first)."""
    chain: list[Endpoint] = []
    hop = ep.via
    while hop is not None:
        chain.insert(0, hop)
        hop = hop.via
    return chain


def route(ep: Endpoint) -> dict[str, object]:
    """What ``orch hosts HOST --ssh --json`` prints: where orch connects, as whom, through what.

    ``identity_files`` empty: orch tries ~/.ssh/id_ed25519, id_ecdsa, id_rsa and ssh-agent.
    """
    jumps: list[dict[str, object]] = []
    for hop in hops(ep):
        item: dict[str, object] = {"hostname": hop.address, "port": hop.port, "user": hop.user}
        if hop.proxy_command:
            item["proxy_command"] = hop.proxy_command
        jumps.append(item)
    return {
        "hostname": ep.address,
        "port": ep.port,
        "user": ep.user,
        "identity_files": list(ep.identity_files),
        "jump": jumps,
        "proxy_command": ep.proxy_command,
    }
