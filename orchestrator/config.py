"""hosts.yaml -> a typed, validated inventory; every error names file:line and key path.

The file's top level is exactly three mappings: ``defaults``, ``hosts``,
``containers``. The container named ``local`` is built in (this machine, no
SSH, no pct) and exists even when the file does not name it.

Lookup order: ``-c/--config``, ``$ORCH_CONFIG``, ``./hosts.yaml``,
``~/.config/orch/hosts.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.detect.limits import Limits

LOCAL = "local"


@dataclass(frozen=True, slots=True)
class HostConfig:
    """A Proxmox host reached over SSH.

    ``ssh_config`` names a Host alias in ``~/.ssh/config`` whose HostName, User,
    Port, IdentityFile and ProxyJump fill what this entry leaves unset.
    ``known_hosts`` is the file host keys are checked against (default
    ``~/.ssh/known_hosts``); unknown keys are refused.
    """

    name: str
    address: str
    port: int = 22
    user: str = "root"
    identity_file: str | None = None
    ssh_config: str | None = None
    known_hosts: str | None = None
    proxy_jump: str | None = None
    connect_timeout_s: float = 10.0
    keepalive_s: float = 5.0


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """A training container (or the built-in ``local`` target).

    ``host`` is a key of ``hosts`` or ``"local"``; ``vmid`` is ``None`` for local.
    ``gpus`` maps a role (``target``, ``drafter``, ...) to GPU indices.
    ``command`` is what ``orch launch`` starts (``None``: the bundled trainer).
    ``requires`` lists Python modules that must import before launch.
    """

    name: str
    host: str
    vmid: int | None = None
    workdir: str = "/root/orch"
    session: str = "train"
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    command: str | None = None
    python: str = "python3"
    requires: tuple[str, ...] = ()
    trainer_config: str | None = None
    limits: Limits = field(default_factory=Limits)
    log_patterns: dict[str, str] = field(default_factory=dict)
    poll_interval_s: float = 2.0

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """Every GPU assigned to the container, sorted, each once."""
        return tuple(sorted({i for ids in self.gpus.values() for i in ids}))

    def role_of(self, gpu: int) -> str | None:
        """The role of GPU ``gpu`` (``None`` when unassigned)."""
        for role, ids in self.gpus.items():
            if gpu in ids:
                return role
        return None


@dataclass(frozen=True, slots=True)
class Inventory:
    """The validated contents of one hosts.yaml (``path`` is ``None`` for the built-in default)."""

    path: Path | None
    hosts: dict[str, HostConfig]
    containers: dict[str, ContainerConfig]

    def container(self, name: str) -> ContainerConfig:
        """The container called ``name``; raises ``UsageError`` naming the known ones."""
        raise NotImplementedError  # filled in by the config work (issue 2)

    def host_of(self, container: ContainerConfig) -> HostConfig | None:
        """The host entry of ``container`` (``None`` for local)."""
        return None if container.is_local else self.hosts[container.host]


def find_config(explicit: Path | None) -> Path | None:
    """The hosts.yaml to use, by the lookup order; ``None`` when none exists."""
    raise NotImplementedError  # filled in by the config work (issue 2)


def load_inventory(explicit: Path | None = None) -> Inventory:
    """Load and validate hosts.yaml; raises ``ConfigError`` (exit 2) with file:line and key."""
    raise NotImplementedError  # filled in by the config work (issue 2)
