"""hosts.yaml -> a typed, validated inventory; every error names file:line and key path.

The file's top level is exactly four mappings: ``defaults``, ``hosts``,
``containers``, ``jobs`` (config/jobs.py). The container named ``local`` is built in (this machine, no
SSH, no pct) and exists even when the file does not name it.

Lookup order: ``-c/--config``, ``$ORCH_CONFIG``, ``./hosts.yaml``,
``~/.config/orch/hosts.yaml``.

The file is read as YAML *nodes* (``yaml.compose``, SafeLoader), never as
objects: every value keeps its line, duplicate keys are caught (PyYAML's loader
silently keeps the last), and nothing in the file can construct a Python object.
Scalars that end up as text (names, env values, commands) keep their literal
spelling: ``FOO: yes`` is the string ``"yes"``, ``VER: 1.10`` is ``"1.10"``.

The field reference (docs/hosts-yaml.md) is generated from config_schema.py:
``python -m orchestrator.config.inventory --markdown > docs/hosts-yaml.md``.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.jobs import JobConfig, build_jobs
from orchestrator.config.limits import Limits
from orchestrator.config.reader import TAG, NodeReader, describe, join_key, show, suggest
from orchestrator.config.reader import compose as _compose
from orchestrator.config.restart import RestartPolicy, build_policy
from orchestrator.config.schema import CONTAINER_FIELDS, HOST_FIELDS, TOP_LEVEL, FieldSpec
from orchestrator.errors import ConfigError, UsageError
from orchestrator.wire.requests import SESSION

log = logging.getLogger(__name__)

LOCAL = "local"
MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A hosts.yaml larger than this is refused (hostile input, not an inventory)."""


@dataclass(frozen=True, slots=True)
class HostConfig:
    """A Proxmox host reached over SSH.

    ``ssh_config`` names a Host alias in ``~/.ssh/config`` whose HostName, User,
    Port, IdentityFile and ProxyJump fill what this entry leaves unset.
    ``known_hosts`` is the file host keys are checked against (default
    ``~/.ssh/known_hosts``); unknown keys are refused. ``explicit`` holds the
    attribute names hosts.yaml set (here or under ``defaults``): the others are
    dataclass defaults that ``~/.ssh/config`` may override.
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
    observe: str = "auto"
    host_python: str = "python3"
    agent_dir: str = "/var/lib/orch"
    explicit: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """A training container (or the built-in ``local`` target).

    ``host`` is a key of ``hosts`` or ``"local"``; ``vmid`` is ``None`` for local.
    ``gpus`` maps a role (``target``, ``drafter``, ...) to GPU indices.
    ``command`` is what ``orch launch`` starts (``None``: the bundled trainer).
    ``requires`` lists Python modules that must import before launch. ``address`` is the
    container's address on the job network (jobs only; orch itself reaches it through pct).
    """

    name: str
    host: str
    vmid: int | None = None
    address: str | None = None
    workdir: str = "/root/orch"
    session: str = SESSION
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    command: str | None = None
    python: str = "python3"
    requires: tuple[str, ...] = ()
    trainer_config: str | None = None
    limits: Limits = field(default_factory=Limits)
    log_patterns: dict[str, str] = field(default_factory=dict)
    log_format: str | None = None
    """The progress reader hosts.yaml names (``None``: detected from the log)."""
    poll_interval_s: float = 2.0
    restart: RestartPolicy | None = None
    """``restart:`` from hosts.yaml (``None``: a dead run is never relaunched)."""

    @property
    def is_local(self) -> bool:
        return self.host == LOCAL

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """Every GPU assigned to the container, sorted, each once."""
        return tuple(sorted({i for ids in self.gpus.values() for i in ids}))

    def role_of(self, gpu: int) -> str | None:
        """The role of GPU ``gpu`` (``None`` when unassigned)."""
        return self.roles_by_gpu.get(gpu)

    @property
    def roles_by_gpu(self) -> dict[int, str]:
        """``gpus`` inverted: GPU index -> role (the first role naming it), for the detectors.

        >>> ContainerConfig("ct", "h", gpus={"target": (0, 1), "drafter": (2,)}).roles_by_gpu
        {0: 'target', 1: 'target', 2: 'drafter'}
        """
        out: dict[int, str] = {}
        for role, ids in self.gpus.items():
            for i in ids:
                out.setdefault(int(i), role)
        return out

    def agent_patterns(self) -> dict[str, str]:
        """What the agent's ``--log-patterns`` carries: ``log_patterns``, and ``log_format``
        under its own key (``orchestrator.agent.metrics.FORMAT_KEY``).

        >>> ContainerConfig("ct", "h", log_format="torchtitan").agent_patterns()
        {'log_format': 'torchtitan'}
        """
        out = dict(self.log_patterns)
        if self.log_format:
            out["log_format"] = self.log_format
        return out


@dataclass(frozen=True, slots=True)
class Inventory:
    """The validated contents of one hosts.yaml (``path`` is ``None`` for the built-in default)."""

    path: Path | None
    hosts: dict[str, HostConfig]
    containers: dict[str, ContainerConfig]
    jobs: dict[str, JobConfig] = field(default_factory=dict)

    def container(self, name: str) -> ContainerConfig:
        """The container called ``name``; raises ``UsageError`` naming the known ones.

        >>> inv = builtin_inventory()
        >>> inv.container("local").host
        'local'
        >>> inv.container("lokal")
        Traceback (most recent call last):
        orchestrator.errors.UsageError: no container 'lokal' in the built-in inventory (no hosts.yaml found); did you mean 'local'?
        """
        found = self.containers.get(name)
        if found is not None:
            return found
        known = list(self.containers)
        where = str(self.path) if self.path else "the built-in inventory (no hosts.yaml found)"
        raise UsageError(f"no container {show(name)!r} in {where}{suggest(name, known, 'known')}")

    def job(self, name: str) -> JobConfig:
        """The job called ``name``; raises ``UsageError`` naming the known ones."""
        found = self.jobs.get(name)
        if found is not None:
            return found
        where = str(self.path) if self.path else "the built-in inventory (no hosts.yaml found)"
        known = list(self.jobs) or ["none"]
        raise UsageError(f"no job {show(name)!r} in {where}{suggest(name, known, 'jobs')}")

    def job_of(self, container: str) -> JobConfig | None:
        """The job container ``container`` is a node of (``None``: none)."""
        return next((j for j in self.jobs.values() if container in j.containers), None)

    def host_of(self, container: ContainerConfig) -> HostConfig | None:
        """The host entry of ``container`` (``None`` for local)."""
        return None if container.is_local else self.hosts[container.host]


_MERGED = ("env", "limits", "log_patterns", "restart")
"""Mappings merged key by key with ``defaults`` (``restart: false`` turns the defaults' off)."""


# --- building the inventory ------------------------------------------------------------------


def _entry(
    r: NodeReader,
    node: yaml.Node,
    key: str,
    specs: tuple[FieldSpec, ...],
) -> tuple[dict[str, Any], dict[str, yaml.Node]]:
    """Read one mapping against ``specs``: (attr -> value, attr -> value node)."""
    by_key = {s.key: s for s in specs}
    values: dict[str, Any] = {}
    nodes: dict[str, yaml.Node] = {}
    for name, knode, vnode in r.mapping(node, key):
        spec = by_key.get(name)
        if spec is None:
            raise r.fail(
                knode,
                join_key(key, name),
                f"unknown key{suggest(name, list(by_key))}",
            )
        values[spec.attr] = r.field(spec, vnode, join_key(key, name))
        nodes[spec.attr] = vnode
    return values, nodes


def _check_name(r: NodeReader, node: yaml.Node, key: str, name: str) -> None:
    if not name or not name.isprintable() or "/" in name or name.startswith("-"):
        raise r.fail(
            node, key, "names must be printable, not empty, without '/' and not starting with '-'"
        )


def _build(r: NodeReader, root: yaml.Node | None) -> Inventory:
    sections: dict[str, yaml.Node] = {}
    if root is not None:
        if not isinstance(root, yaml.MappingNode):
            raise r.fail(
                root,
                "",
                "the top level must be a mapping with the keys defaults, hosts, "
                f"containers, jobs (got {describe(root)})",
            )
        for name, knode, vnode in r.mapping(root, ""):
            if name not in TOP_LEVEL:
                raise r.fail(
                    knode,
                    show(name),
                    f"unknown top-level key{suggest(name, TOP_LEVEL, 'the top level holds exactly')}",
                )
            sections[name] = vnode

    default_specs = tuple(s for s in HOST_FIELDS + CONTAINER_FIELDS if s.in_defaults)
    defaults, dnodes = _entry(r, sections.get("defaults", _NULL), "defaults", default_specs)
    if not defaults.get("workdir", "/").startswith("/"):
        raise r.fail(
            dnodes["workdir"],
            "defaults.workdir",
            "must be an absolute path (it is "
            f"for containers on hosts; got {show(defaults['workdir'])!r})",
        )
    host_attrs = {s.attr for s in HOST_FIELDS}
    host_defaults = {k: v for k, v in defaults.items() if k in host_attrs}
    ct_defaults = {k: v for k, v in defaults.items() if k not in host_attrs}

    hosts: dict[str, HostConfig] = {}
    for name, knode, vnode in r.mapping(sections.get("hosts", _NULL), "hosts", "name"):
        key = join_key("hosts", name)
        _check_name(r, knode, key, name)
        if name == LOCAL:
            raise r.fail(knode, key, "'local' is reserved for this machine; pick another host name")
        own, _ = _entry(r, vnode, key, HOST_FIELDS)
        values = {**host_defaults, **own}
        explicit = frozenset(values)
        if "address" not in values:
            if not values.get("ssh_config"):
                raise r.fail(knode, key, "needs an address (or an ssh_config alias)")
            values["address"] = values["ssh_config"]
        hosts[name] = HostConfig(name=name, explicit=explicit, **values)

    containers: dict[str, ContainerConfig] = {}
    knodes: dict[str, yaml.Node] = {}
    for name, knode, vnode in r.mapping(sections.get("containers", _NULL), "containers", "name"):
        key = join_key("containers", name)
        _check_name(r, knode, key, name)
        own, nodes = _entry(r, vnode, key, CONTAINER_FIELDS)
        containers[name] = _container(r, name, key, knode, own, nodes, ct_defaults, hosts)
        knodes[name] = knode
    if LOCAL not in containers:
        containers[LOCAL] = _container(r, LOCAL, LOCAL, None, {}, {}, ct_defaults, hosts)
    jobs = build_jobs(r, sections.get("jobs", _NULL), containers, knodes)
    return Inventory(path=None, hosts=hosts, containers=containers, jobs=jobs)


def _container(
    r: NodeReader,
    name: str,
    key: str,
    knode: yaml.Node | None,
    own: dict[str, Any],
    nodes: dict[str, yaml.Node],
    defaults: dict[str, Any],
    hosts: dict[str, HostConfig],
) -> ContainerConfig:
    host = own.get("host", LOCAL if name == LOCAL else None)
    if host is None:
        raise r.fail(knode, key, f"needs a host (one of: {', '.join([*hosts, LOCAL])})")
    if name == LOCAL and host != LOCAL:
        raise r.fail(
            nodes["host"],
            f"{key}.host",
            "the container 'local' is this machine; "
            "its host must be local (give a remote container another name)",
        )
    if host != LOCAL and host not in hosts:
        raise r.fail(
            nodes["host"],
            f"{key}.host",
            f"host {show(host)!r} is not defined under "
            f"hosts{suggest(host, [*hosts, LOCAL], 'defined')}",
        )
    values = {k: v for k, v in defaults.items() if k not in _MERGED}
    if host == LOCAL:
        values.pop("workdir", None)
        if own.get("vmid") is not None:
            raise r.fail(
                nodes["vmid"], f"{key}.vmid", "a local target has no vmid (it is this machine)"
            )
        workdir = own.get("workdir", f"~/.local/state/orch/local/{name}")
        path = Path(os.path.expanduser(workdir))
        own = {**own, "workdir": str(path if path.is_absolute() else r.base_dir / path)}
    else:
        if own.get("vmid") is None:
            raise r.fail(
                nodes.get("vmid", knode),
                f"{key}.vmid",
                "needs a vmid (the Proxmox container id, an integer >= 100)",
            )
        workdir = own.get("workdir")
        if workdir is not None and not workdir.startswith("/"):
            raise r.fail(
                nodes["workdir"],
                f"{key}.workdir",
                f"must be an absolute path inside the container (got {show(workdir)!r})",
            )
    values.update({k: v for k, v in own.items() if k not in _MERGED})
    limits = Limits().merged({**defaults.get("limits", {}), **own.get("limits", {})})
    return ContainerConfig(
        name=name,
        env={**defaults.get("env", {}), **own.get("env", {})},
        log_patterns={**defaults.get("log_patterns", {}), **own.get("log_patterns", {})},
        limits=limits,
        restart=build_policy(
            defaults.get("restart"), own.get("restart"), own_given="restart" in own
        ),
        **{**values, "host": host},
    )


_NULL = yaml.ScalarNode(TAG + "null", "")


def builtin_inventory() -> Inventory:
    """The inventory used when no hosts.yaml exists: just the ``local`` target."""
    return _build(NodeReader("<built-in>", Path.cwd()), None)


def config_search_paths() -> list[Path]:
    """Where orch looks for hosts.yaml when neither ``-c`` nor ``$ORCH_CONFIG`` is given."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return [Path("hosts.yaml"), Path(config_home) / "orch" / "hosts.yaml"]


def find_config(explicit: Path | None) -> Path | None:
    """The hosts.yaml to use, by the lookup order; ``None`` when none exists.

    An explicit path or ``$ORCH_CONFIG`` naming a missing file is a ``ConfigError``:
    a typo there must not silently fall through to another inventory.
    """
    if explicit is not None:
        if not Path(explicit).exists():
            raise ConfigError(str(explicit), None, "", "no such file")
        return Path(explicit)
    env = os.environ.get("ORCH_CONFIG")
    if env:
        if not Path(env).exists():
            raise ConfigError(env, None, "", "no such file (named by $ORCH_CONFIG)")
        return Path(env)
    for candidate in config_search_paths():
        if candidate.is_file():
            return candidate
    return None


def _read_text(path: Path) -> str:
    shown = str(path)
    try:
        if path.is_dir():
            raise ConfigError(shown, None, "", "is a directory, not a hosts.yaml file")
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
            mode = os.fstat(fh.fileno()).st_mode
    except OSError as exc:
        raise ConfigError(shown, None, "", f"cannot read: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(shown, None, "", f"larger than {MAX_CONFIG_BYTES // 1024 // 1024} MiB")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        log.warning(
            "%s is writable by group or others (mode %03o): whoever can edit it can make "
            "orch run commands on your hosts; run: chmod go-w %s",
            shown,
            stat.S_IMODE(mode),
            shown,
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(shown, line, "", "not UTF-8 text") from exc


def parse_inventory(text: str, path: str = "hosts.yaml", base_dir: Path | None = None) -> Inventory:
    """Validate hosts.yaml ``text`` (no file I/O); ``path`` only names it in errors.

    >>> inv = parse_inventory("hosts: {pve1: {address: 10.1.2.6}}\\n"
    ...                       "containers: {lxc200: {host: pve1, vmid: 200}}\\n")
    >>> list(inv.containers), inv.containers["lxc200"].vmid
    (['lxc200', 'local'], 200)
    >>> parse_inventory("hosts: {pve1: {adress: 10.1.2.6}}\\n")
    Traceback (most recent call last):
    orchestrator.errors.ConfigError: hosts.yaml:1: hosts.pve1.adress: unknown key; did you mean 'address'?
    """
    reader = NodeReader(path, base_dir if base_dir is not None else Path.cwd())
    return _build(reader, _compose(path, text))


def load_inventory(explicit: Path | None = None) -> Inventory:
    """Load and validate hosts.yaml; raises ``ConfigError`` (exit 2) with file:line and key.

    With no file found by the lookup order, the built-in inventory (just ``local``).
    Logs a warning when the file, or orch's state directory, is writable by group or others.
    """
    from orchestrator.wire.paths import state_dir, warn_if_writable_by_others

    warn_if_writable_by_others(state_dir(), "state directory")
    path = find_config(Path(explicit) if explicit is not None else None)
    if path is None:
        return builtin_inventory()
    inv = parse_inventory(_read_text(path), str(path), path.resolve().parent)
    return Inventory(path=path, hosts=inv.hosts, containers=inv.containers, jobs=inv.jobs)


def inventory_summary(inv: Inventory) -> dict[str, Any]:
    """The inventory as JSON-ready data for ``orch hosts`` (env values of secret names masked)."""
    from orchestrator.wire.secrets import mask_env

    hosts = [
        {
            "name": h.name,
            "address": h.address,
            "port": h.port,
            "user": h.user,
            "identity_file": h.identity_file,
            "ssh_config": h.ssh_config,
            "known_hosts": h.known_hosts,
            "proxy_jump": h.proxy_jump,
        }
        for h in inv.hosts.values()
    ]
    containers = []
    for c in inv.containers.values():
        host = inv.host_of(c)
        containers.append(
            {
                "name": c.name,
                "host": c.host,
                "address": f"{host.address}:{host.port}" if host else LOCAL,
                "vmid": c.vmid,
                "workdir": c.workdir,
                "session": c.session,
                "gpus": {role: list(ids) for role, ids in c.gpus.items()},
                "requires": list(c.requires),
                "env": mask_env(c.env),
                "command": c.command,
                "job_address": c.address,
            }
        )
    jobs = [
        {
            "name": j.name,
            "nodes": [
                {"container": n.container, "rank": n.rank, "address": n.address, "procs": n.procs}
                for n in j.nodes
            ],
            "rendezvous": j.rdzv_endpoint,
            "command": j.command,
        }
        for j in inv.jobs.values()
    ]
    return {
        "config": str(inv.path) if inv.path else None,
        "hosts": hosts,
        "containers": containers,
        "jobs": jobs,
    }


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m orchestrator.config.inventory --markdown")
    from orchestrator.config.schema import schema_markdown

    sys.stdout.write(schema_markdown())
