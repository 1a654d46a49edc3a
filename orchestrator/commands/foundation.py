"""Foundation commands: ``orch hosts``, ``orch trust`` and ``orch sandbox up|down|status|scenario``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory

from orchestrator.commands._app import app, err_console, load_inventory, out_console, print_json


@app.command("hosts")
def hosts_cmd(
    host: str | None = typer.Argument(
        None, help="With --ssh: a host of hosts.yaml, or an alias of ~/.ssh/config."
    ),
    ssh: bool = typer.Option(
        False, "--ssh", help="Print how orch connects to HOST (address, user, jump hosts)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON document instead of tables."
    ),
) -> None:
    """List the hosts and containers of the inventory (hosts.yaml, validated).

    Exit codes: 0 listed; 2 hosts.yaml is malformed (one line naming file:line and key).
    Env values whose names look secret are masked in --json output.
    `orch hosts HOST --ssh` prints where orch connects for HOST: address, port, user, keys,
    every jump host and any ProxyCommand, read from ~/.ssh/config as OpenSSH reads it.
    """
    if host is not None or ssh:
        _ssh_route(host, ssh, as_json)
        return
    from orchestrator.config.inventory import config_search_paths, inventory_summary

    summary = inventory_summary(load_inventory())
    if as_json:
        print_json(summary)
        return
    from rich.table import Table
    from rich.text import Text

    if summary["config"] is None:
        looked = ", ".join(str(p) for p in config_search_paths())
        err_console.print(
            Text(
                f"no hosts.yaml found ($ORCH_CONFIG, {looked}); showing the built-in local target"
            ),
            soft_wrap=True,
        )
    hosts = Table("host", "address", "user", title=Text(f"hosts ({summary['config']})"))
    for h in summary["hosts"]:
        hosts.add_row(Text(h["name"]), Text(f"{h['address']}:{h['port']}"), Text(h["user"]))
    from orchestrator.wire.formats import gpu_ranges

    cts = Table("container", "host", "address", "vmid", "session", "gpus")
    cts.add_column("workdir", overflow="fold")
    for c in summary["containers"]:
        gpus = " ".join(f"{role}:{gpu_ranges(ids)}" for role, ids in c["gpus"].items())
        cells = (c["name"], c["host"], c["address"], c["vmid"] or "-", c["session"], gpus or "-")
        cts.add_row(*(Text(str(v)) for v in cells), Text(c["workdir"]))
    if summary["hosts"]:
        out_console.print(hosts)
    out_console.print(cts)
    if summary["jobs"]:
        jobs = Table("job", "nodes (rank order)", "rendezvous", "command")
        for j in summary["jobs"]:
            nodes = ", ".join(f"{n['container']} ({n['address']})" for n in j["nodes"])
            cmd = j["command"] or "bundled trainer"
            jobs.add_row(*(Text(str(v)) for v in (j["name"], nodes, j["rendezvous"], cmd)))
        out_console.print(jobs)


def _ssh_route(name: str | None, ssh: bool, as_json: bool) -> None:
    """``orch hosts HOST --ssh``: HOST resolved as orch connects (hosts.yaml over ssh_config)."""
    from orchestrator.errors import UsageError
    from orchestrator.transport.ssh_config import alias_host, hops, resolve, route

    if name is None or not ssh:
        raise UsageError("orch hosts --ssh needs a HOST, and HOST needs --ssh")
    inventory = load_inventory()
    known = inventory.hosts.get(name)
    if known is not None:
        ep = resolve(known, peers=inventory.hosts)
    else:
        ep = resolve(alias_host(name), local_user_default=True)
    if as_json:
        print_json(route(ep))
        return
    for note in ep.notes:
        err_console.print(f"note: {note}", soft_wrap=True, markup=False)
    out = [f"{name}: {ep.user}@{ep.address} port {ep.port}"]
    out += [f"  via {h.name}: {h.user}@{h.address} port {h.port}" for h in hops(ep)]
    if ep.proxy_command:
        out.append(f"  through ProxyCommand: {ep.proxy_command}")
    keys = ", ".join(ep.identity_files) or "~/.ssh/id_ed25519, id_ecdsa, id_rsa and ssh-agent"
    out.append(f"  keys: {keys}")
    out.append(f"  host keys checked in {ep.known_hosts} (every hop)")
    print("\n".join(out))


@app.command("trust")
def trust_cmd(
    host: str = typer.Argument(..., help="Host name from hosts.yaml."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Record the key without asking."),
    as_json: bool = typer.Option(False, "--json", help="Print the key and outcome as JSON."),
) -> None:
    """Show HOST's SSH host key fingerprint and record it in its known_hosts on confirmation.

    Compare the fingerprint with the host's own (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`
    on its console) before accepting. A key already recorded is left as is; a CHANGED key is
    refused until you remove the old known_hosts line yourself.

    Exit codes: 0 recorded or already known; 1 not confirmed; 2 no such host;
    3 unreachable, or the key changed (possible man-in-the-middle).
    """
    raise typer.Exit(trust_host(load_inventory(), host, yes=yes, as_json=as_json))


def trust_host(inventory: Inventory, host: str, *, yes: bool = False, as_json: bool = False) -> int:
    """``orch trust HOST``'s work (also ``orch init --trust``'s): scan the key, ask, record.

    Returns 0 (recorded or already known) or 1 (not confirmed); raises ``UsageError`` for an
    unknown host, ``HostKeyChanged`` for a changed key, ``TransportError`` when unreachable.
    """
    from orchestrator.errors import UsageError
    from orchestrator.transport import trust

    if host not in inventory.hosts:
        known = ", ".join(sorted(inventory.hosts)) or "none"
        raise UsageError(f"no host named {host!r} in the inventory (known: {known})")
    from orchestrator.transport.ssh_config import hops, resolve

    ep = resolve(inventory.hosts[host], peers=inventory.hosts)
    for hop in hops(ep):  # each jump host first, in connection order: the next goes through it
        hop_scan = trust.scan_endpoint(hop)
        hop_outcome = _confirm_key(hop_scan, f"jump host {hop.name}", yes)
        if hop_outcome == "declined":
            sys.stderr.write(f"jump host {hop.name}: not recorded; {host} not scanned\n")
            return 1
        if hop_outcome == "added":
            sys.stderr.write(f"jump host {hop.name}: recorded {hop_scan.fingerprint}\n")
    scanned = trust.scan_endpoint(ep)
    outcome = _confirm_key(scanned, host, yes)
    if as_json:
        print_json({**scanned.to_dict(), "outcome": outcome})
    elif outcome == "known":
        print(f"{host}: key {scanned.fingerprint} is already in {scanned.known_hosts}")
    elif outcome == "added":
        print(f"{host}: recorded {scanned.key_type} {scanned.fingerprint} in {scanned.known_hosts}")
    if outcome == "declined":
        sys.stderr.write(f"{host}: not recorded\n")
        return 1
    return 0


def _confirm_key(scanned: Any, label: str, yes: bool) -> str:
    """Record an unknown key when confirmed: "known", "added" or "declined"; a changed key
    raises HostKeyChanged (refused)."""
    from orchestrator.transport import trust

    if scanned.status == trust.CHANGED:
        trust.record(scanned)  # raises HostKeyChanged: refused
    if scanned.status != trust.UNKNOWN:
        return str(scanned.status)
    sys.stderr.write(
        f"{label} ({scanned.address}:{scanned.port}) presents a {scanned.key_type} key\n"
        f"  fingerprint {scanned.fingerprint}\n"
    )
    if yes or typer.confirm(f"record it in {scanned.known_hosts}?", err=True):
        trust.record(scanned)
        return "added"
    return "declined"


sandbox_app = typer.Typer(
    help="A simulated Proxmox host on this machine: real sshd, pct stand-in, fake NVML.",
    no_args_is_help=True,
)
app.add_typer(sandbox_app, name="sandbox")
_SANDBOX_DIR_HELP = "State directory (default ~/.local/state/orch/sandbox); several can coexist."


@sandbox_app.command("up")
def sandbox_up(
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
    containers: int = typer.Option(1, "--containers", help="Containers ct200, ct201, ... (1-50)."),
    host_count: int = typer.Option(
        1,
        "--hosts",
        help="Simulated Proxmox hosts (sandbox, sandbox2, ...), each its own sshd; the "
        "containers are spread over them in blocks, all on one job network.",
    ),
    gpus: int = typer.Option(8, "--gpus", help="Simulated GPUs (1-64)."),
    scenario: str = typer.Option(
        "idle",
        "--scenario",
        help="Bundled scenario name or JSON file (idle: free GPUs to launch on; healthy, "
        "ghost, gpu-lost...: docs/sandbox.md).",
    ),
    isolation: str = typer.Option(
        "auto",
        "--isolation",
        help="lxc: real LXC containers (root, lxc package); process: directories, no "
        "namespaces; auto: lxc where it can run, else process (says why).",
    ),
    unprivileged: bool = typer.Option(
        False,
        "--unprivileged",
        help="LXC containers as Proxmox makes them by default: root inside is uid 100000 "
        "outside (lxc.idmap u/g 0 100000 65536).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"config": ..., "state_dir": ..., ...}.'
    ),
) -> None:
    """Start a sandbox (as the current user) and print its hosts.yaml path.

    Then try: orch -c <config> hosts. Exit codes: 0 running (also when it already ran);
    1 something failed to start (or --isolation lxc cannot run here); 2 a needed tool
    (tmux, sshd, cc) is missing or a flag is bad.
    """
    from orchestrator.sandbox import manager

    info = manager.up(
        state_dir,
        containers=containers,
        gpus=gpus,
        scenario=scenario,
        isolation=isolation,
        host_count=host_count,
        unprivileged=unprivileged,
    )
    if info.fallback:
        sys.stderr.write(f"sandbox: {info.fallback}\n")
    if as_json:
        print_json(info.to_dict())
        return
    print(
        f"sandbox up ({info.isolation}): sshd on 127.0.0.1:{info.port}, containers "
        f"{', '.join(info.containers)}, {info.gpus} GPUs, scenario {info.scenario}"
    )
    for host, port in zip(info.hosts[1:], info.ports[1:], strict=False):
        on = [c for c, h in info.placement if h == host]
        print(f"host {host}: sshd on 127.0.0.1:{port}, containers {', '.join(on)}")
    if info.addresses:
        shown = ", ".join(f"{c} {a}" for c, a in info.addresses)
        print(f"job network: {shown}")
    print(f"config: {info.config_path}")
    print(f"try: orch -c {info.config_path} hosts")


@sandbox_app.command("down")
def sandbox_down(
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print what was stopped as JSON."),
) -> None:
    """Stop everything the sandbox started (by pid); run logs and the state directory stay.

    Exit codes: 0 stopped (or nothing ran); 1 no sandbox in that directory.
    """
    from orchestrator.sandbox import manager

    report = manager.down(state_dir)
    if as_json:
        print_json(report)
        return
    print(
        f"sandbox down: sshd {'stopped' if report['sshd'] else 'was not running'}, "
        f"containers stopped: {', '.join(report['containers']) or 'none'}"
    )


@sandbox_app.command("status")
def sandbox_status(
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Show whether the sandbox runs, its port, scenario and containers.

    Exit codes: 0 running; 1 not running or no sandbox in that directory.
    """
    from orchestrator.sandbox import manager

    st = manager.status(state_dir)
    if as_json:
        print_json(st)
    else:
        print(
            f"sandbox {st['state_dir']} ({st['isolation']}): "
            f"{'running' if st['running'] else 'stopped'}, "
            f"port {st['port']}, scenario {st['scenario']}, {st['gpus']} GPUs"
        )
        for c in st["containers"]:
            init = f", init pid {c['init_pid']}" if c["init_pid"] else ""
            print(
                f"  {c['name']} (vmid {c['vmid']}): {c['status']}{init}, {c['processes']} "
                f"processes, workdir {c['workdir']}"
            )
    if not st["running"]:
        raise typer.Exit(1)


@sandbox_app.command("scenario")
def sandbox_scenario(
    name: str = typer.Argument(
        ..., help="healthy, idle, ghost, driver-mismatch, gpu-lost, gpu-hang, ... or a JSON file."
    ),
    state_dir: Path | None = typer.Option(None, "--dir", help=_SANDBOX_DIR_HELP),
) -> None:
    """Switch the GPU scenario of a sandbox while things run (atomic; NVML re-reads it per call).

    Exit codes: 0 switched; 1 no sandbox there; 2 unknown scenario.
    """
    from orchestrator.sandbox import manager

    print(f"scenario: {manager.set_scenario(state_dir, name)}")
