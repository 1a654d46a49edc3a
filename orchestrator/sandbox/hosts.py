"""Several simulated Proxmox hosts in one sandbox (``orch sandbox up --hosts M``).

Host ``sandbox`` (the first, the only one before ``--hosts``) keeps the state directory's
top level: ``sshd/``, ``kernel.log``. Host ``sandboxN`` (N >= 2) lives in
``hosts/sandboxN/``: its own sshd (own port and host key), its own kernel log. Each sshd
sets ``ORCH_SANDBOX_NODE`` (the Proxmox node name) and ``ORCH_SANDBOX_KERNEL_LOG`` for
what runs on that host, so its ``pct`` sees only its own containers (their configs live in
``etc/pve/nodes/<node>/lxc/``, as in Proxmox's cluster file system, where
``/etc/pve/lxc`` is the local node's) and its ``dmesg`` reads its own ring buffer.

Containers are placed in blocks, in vmid order: 4 containers on 2 hosts are ct200 and
ct201 on ``sandbox``, ct202 and ct203 on ``sandbox2``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.sandbox.state import HOST_NAME, host_env


def host_names(count: int) -> list[str]:
    """The names of ``count`` simulated hosts.

    >>> host_names(3)
    ['sandbox', 'sandbox2', 'sandbox3']
    """
    return [HOST_NAME] + [f"{HOST_NAME}{i}" for i in range(2, count + 1)]


def host_dir(state_dir: Path, host: str) -> Path:
    """The directory holding ``host``'s sshd and kernel log."""
    return state_dir if host == HOST_NAME else state_dir / "hosts" / host


def sshd_dir(state_dir: Path, host: str) -> Path:
    return host_dir(state_dir, host) / "sshd"


def kernel_log_path(state_dir: Path, host: str | None = None) -> Path:
    """``host``'s kernel ring buffer (the dmesg/journalctl stand-ins read it)."""
    return host_dir(state_dir, host or HOST_NAME) / "kernel.log"


def pve_conf_dir(state_dir: Path, host: str) -> Path:
    """``etc/pve/nodes/<host>/lxc``: the container configs of one node."""
    return state_dir / "etc" / "pve" / "nodes" / host / "lxc"


def placement(vmids: list[int], hosts: list[str]) -> dict[int, str]:
    """Which host runs each container: consecutive blocks, in vmid order.

    >>> placement([200, 201, 202, 203], ["sandbox", "sandbox2"])
    {200: 'sandbox', 201: 'sandbox', 202: 'sandbox2', 203: 'sandbox2'}
    >>> placement([200, 201, 202], ["a", "b"])
    {200: 'a', 201: 'a', 202: 'b'}
    """
    n, m = len(vmids), len(hosts)
    return {v: hosts[i * m // n] for i, v in enumerate(vmids)}


def node_env(state_dir: Path, host: str) -> dict[str, str]:
    """The variables ``host``'s sshd sets for every command (besides PATH)."""
    return {
        **host_env(state_dir),
        "ORCH_SANDBOX_NODE": host,
        "ORCH_SANDBOX_KERNEL_LOG": str(kernel_log_path(state_dir, host)),
        "ORCH_JOURNAL_FILES": str(kernel_log_path(state_dir, host)),
    }


def hosts_yaml(
    state_dir: Path,
    servers: Mapping[str, Any],
    placed: Mapping[str, str],
    addresses: Mapping[str, str],
    roles: Mapping[str, Sequence[int]],
    isolation: str,
) -> str:
    """The sandbox's hosts.yaml: one entry per host (its sshd's port, client key and
    known_hosts), one per container (its host, vmid, workdir, GPUs by role, the bundled
    trainer's ``tiny-cpu`` config, and its ``address`` on the job network)."""
    import sys

    import yaml

    from orchestrator.sandbox import process
    from orchestrator.sandbox.state import SESSION, WORKDIR

    containers: dict[str, dict[str, Any]] = {}
    for name, host in placed.items():
        vmid = int(name.removeprefix("ct"))
        ct: dict[str, Any] = {"host": host, "vmid": vmid}
        if name in addresses:
            ct["address"] = addresses[name]
        if isolation == "lxc":  # the operator's Python is bind-mounted at the same path
            ct.update(workdir="/" + WORKDIR, python=sys.executable)
        else:
            ct["workdir"] = str(process.container_root(state_dir, vmid) / WORKDIR)
        ct.update(
            session=SESSION,
            gpus={k: list(ids) for k, ids in roles.items()},
            trainer_config="tiny-cpu",  # the sandbox's torch is CPU-only: dflash-8gpu cannot run
        )
        containers[name] = ct
    first = next(iter(servers.values()))
    doc = {
        "defaults": {"user": first.user, "poll_interval": 2},
        "hosts": {
            h: {
                "address": "127.0.0.1",
                "port": srv.port,
                "user": srv.user,
                "identity_file": str(srv.client_key_path),
                "known_hosts": str(srv.known_hosts_path),
                # the host observer lives in the sandbox (a host's is /var/lib/orch)
                "agent_dir": str(host_dir(state_dir, h) / "host-agent"),
                # process-mode containers are no containers to a host: observed from inside
                **({} if isolation == "lxc" else {"observe": "container"}),
            }
            for h, srv in servers.items()
        },
        "containers": containers,
    }
    n = len(servers)
    head = (
        f"# Generated by `orch sandbox up --dir {state_dir}`: {n} simulated Proxmox "
        f"host{'s' if n != 1 else ''} on this machine\n"
        f"# ({isolation} isolation). Use it with: orch -c {state_dir / 'hosts.yaml'} hosts\n"
    )
    if addresses:
        names = list(placed)
        head += (
            "# The containers' `address` is on the job network; a job over two of them:\n"
            f"#   jobs: {{pair: {{nodes: [{', '.join(names[:2])}]}}}}\n"
        )
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)
