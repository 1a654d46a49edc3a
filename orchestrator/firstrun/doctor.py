"""``orch doctor [TARGET]``: a checklist of what orch needs, each failure with its fix.

Operator side (no network): hosts.yaml found and valid, hosts.yaml and the state
directory not writable by others, each host's identity file readable (a warning
when group or others can read it), each host's key in its known_hosts, versions of
the Python packages orch runs on. With a TARGET (a container or a host of the
inventory) the path to it, in order: ssh reachable and authenticated, ``pct``
present on the host and its python3 (>= 3.10 for the host probe: a warning), the
container running (``pct status``), python3 (>= 3.10 for the agent) and tmux in
the container, NVML readable there (the agent's ``facts``; ``nvidia-smi -L`` when
the agent cannot run). A check that depends on a failed one is reported as skipped.

Checks never raise: each catches what its step can raise (``OrchError``, ``OSError``)
and turns it into a failed :class:`Check` whose ``detail`` is that message. Every
remote command has a timeout (``REMOTE_TIMEOUT_S``; the agent's facts ``FACTS_TIMEOUT_S``).
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import (
    ContainerConfig,
    HostConfig,
    Inventory,
    builtin_inventory,
    config_search_paths,
    find_config,
    load_inventory,
)
from orchestrator.errors import (
    AuthFailed,
    ContainerNotFound,
    ContainerNotRunning,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
    OrchError,
    UsageError,
)
from orchestrator.firstrun.checklist import FAIL, OK, SKIP, WARN, Check
from orchestrator.firstrun.observepath import observe_checks
from orchestrator.wire.paths import mode_if_writable_by_others, readable_by_others, state_dir

REMOTE_TIMEOUT_S = 15.0
FACTS_TIMEOUT_S = 90.0
PACKAGES = (
    "paramiko",
    "nvidia-ml-py",
    "typer",
    "rich",
    "PyYAML",
    "tenacity",
    "prometheus-client",
    "libtmux",
)
"""Distributions orch imports on the operator side (nvidia-ml-py is imported as pynvml)."""


# --------------------------------------------------------------------------- operator side


def check_config(explicit: Path | None) -> tuple[Check, Inventory | None]:
    """hosts.yaml found (by the lookup order) and valid. None found is a warning: orch still
    works on the built-in ``local`` target, whose checks then run."""
    name = "config"
    try:
        path = find_config(explicit)
    except OrchError as exc:
        return Check(name, FAIL, str(exc), "fix the path given to -c or $ORCH_CONFIG"), None
    if path is None:
        looked = ", ".join(str(p) for p in config_search_paths())
        detail = f"no hosts.yaml found ($ORCH_CONFIG, {looked}); only the built-in local target"
        return Check(name, WARN, detail, "orch init"), builtin_inventory()
    try:
        inv = load_inventory(path)
    except OrchError as exc:
        return Check(name, FAIL, str(exc), f"edit {path} (keys: docs/hosts-yaml.md)"), None
    detail = f"{path}: {len(inv.hosts)} host(s), {len(inv.containers)} container(s)"
    return Check(name, OK, detail), inv


def _mode_problem(path: Path) -> str | None:
    mode = mode_if_writable_by_others(path)
    if mode is None:
        return None
    kind = "directory" if stat.S_ISDIR(mode) else "file"
    return f"{kind} {path} is writable by group or others (mode {stat.S_IMODE(mode):03o})"


def check_config_perms(path: Path) -> Check:
    """hosts.yaml and its directory not writable by others: whoever edits it runs commands."""
    paths = [path, path.resolve().parent]
    problems = [(p, msg) for p in paths if (msg := _mode_problem(p))]
    if problems:
        detail = "; ".join(m for _, m in problems)
        return Check(
            "config permissions",
            FAIL,
            f"{detail}: whoever can write it can make orch run commands on your hosts",
            "chmod go-w " + " ".join(str(p) for p, _ in problems),
        )
    return Check(
        "config permissions", OK, f"{path} and its directory are writable only by their owner"
    )


def check_state_dir() -> Check:
    """orch's state directory (history DB, postmortem bundles) not writable by others."""
    path = state_dir()
    if not path.exists():
        return Check("state directory", OK, f"{path} (not created yet; orch makes it 0700)")
    problem = _mode_problem(path)
    if problem:
        return Check("state directory", FAIL, problem, f"chmod 700 {path}")
    return Check("state directory", OK, f"{path} is private to its owner")


def check_identity(host: HostConfig) -> Check:
    """The host's identity file exists and is readable; a warning when others can read it."""
    from orchestrator.transport.ssh import DEFAULT_KEYS
    from orchestrator.transport.ssh_config import resolve

    name = f"identity file for {host.name}"
    ep = resolve(host)
    if not ep.identity_files:
        found = [p for n in DEFAULT_KEYS if (p := Path("~/.ssh").expanduser() / n).is_file()]
        if found:
            return _key_file_check(name, host, found[0])
        if os.environ.get("SSH_AUTH_SOCK"):
            return Check(name, OK, "none set; keys come from ssh-agent ($SSH_AUTH_SOCK)")
        return Check(
            name,
            FAIL,
            "none set, no ~/.ssh/id_ed25519 (or id_ecdsa, id_rsa), no ssh-agent",
            _keygen_fix(host, Path("~/.ssh/id_ed25519").expanduser()),
        )
    return _key_file_check(name, host, Path(ep.identity_files[0]))


def _keygen_fix(host: HostConfig, path: Path) -> str:
    return (
        f"ssh-keygen -t ed25519 -f {path} && ssh-copy-id -i {path}.pub -p {host.port} "
        f"{host.user}@{host.address}  (or set identity_file of {host.name} in hosts.yaml)"
    )


def _key_file_check(name: str, host: HostConfig, path: Path) -> Check:
    try:
        with path.open("rb") as fh:
            fh.read(1)
            mode = os.fstat(fh.fileno()).st_mode
    except FileNotFoundError:
        return Check(name, FAIL, f"{path} does not exist", _keygen_fix(host, path))
    except OSError as exc:
        return Check(
            name,
            FAIL,
            f"{path}: cannot read: {exc.strerror or exc}",
            f"check the file's owner and mode: ls -l {path}",
        )
    if readable_by_others(mode):
        return Check(
            name,
            WARN,
            f"{path} is readable by group or others "
            f"(mode {stat.S_IMODE(mode):03o}); a private key must not be",
            f"chmod 600 {path}",
        )
    return Check(name, OK, f"{path} (mode {stat.S_IMODE(mode):03o})")


def check_host_key(host: HostConfig) -> Check:
    """The host's key is recorded in its known_hosts (offline: a changed key shows at ssh)."""
    from orchestrator.transport.known_hosts import known_entries
    from orchestrator.transport.ssh_config import resolve

    ep = resolve(host)
    name = f"host key of {host.name}"
    entries = known_entries(ep.known_hosts, ep.known_name)
    if not entries:
        return Check(
            name,
            FAIL,
            f"{ep.known_name} is not in {ep.known_hosts}",
            f"orch trust {host.name}  (compare the fingerprint with the host's console)",
        )
    types = ", ".join(sorted({t for _, t, _ in entries}))
    return Check(name, OK, f"{ep.known_name} known in {ep.known_hosts} ({types})")


def check_packages() -> Check:
    """The Python packages orch runs on, with their versions."""
    found, missing = [], []
    for dist in PACKAGES:
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            missing.append(dist)
    py = ".".join(map(str, sys.version_info[:3]))
    if missing:
        return Check(
            "python packages",
            FAIL,
            f"missing: {', '.join(missing)}",
            f"{sys.executable} -m pip install {' '.join(missing)}",
        )
    return Check("python packages", OK, f"python {py}, " + ", ".join(found))


# --------------------------------------------------------------------------- the path to a target


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.monotonic()
    value = fn()
    return value, (time.monotonic() - start) * 1000.0


def check_ssh(inv: Inventory, host: HostConfig) -> Check:
    """Connect and authenticate (one ``true`` over the pooled connection)."""
    from orchestrator.transport.connect import host_transport

    name = f"ssh to {host.name}"
    where = f"{host.user}@{host.address}:{host.port}"
    try:
        res, ms = _timed(
            lambda: host_transport(inv, host.name).run(["true"], timeout=REMOTE_TIMEOUT_S)
        )
    except HostKeyUnknown as exc:
        return Check(name, FAIL, str(exc), f"orch trust {host.name}")
    except HostKeyChanged as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            "find out why the key changed before anything else; "
            f"then remove the old line and run: orch trust {host.name}",
        )
    except AuthFailed as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            f"ssh-copy-id -p {host.port} {host.user}@"
            f"{host.address}, or set identity_file of {host.name} in hosts.yaml",
        )
    except HostUnreachable as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            f"is {host.address} up, sshd listening on port "
            f"{host.port}? check address/port of {host.name} in hosts.yaml",
        )
    except OrchError as exc:
        return Check(name, FAIL, str(exc), f"run with -vv for details: orch -vv doctor {host.name}")
    if not res.ok:
        return Check(
            name,
            FAIL,
            f"{where}: `true` exited {res.exit_status}: {res.err.strip()[:200]}",
            "check the user's login shell on the host",
        )
    return Check(name, OK, f"{where}, authenticated ({ms:.0f} ms)")


def check_pct(inv: Inventory, host: HostConfig) -> Check:
    """``pct`` is on the host's PATH (the host is a Proxmox VE node)."""
    from orchestrator.transport.connect import host_transport

    name = f"pct on {host.name}"
    try:
        res = host_transport(inv, host.name).run(
            ["sh", "-c", "command -v pct"], timeout=REMOTE_TIMEOUT_S
        )
    except OrchError as exc:
        return Check(name, FAIL, str(exc), f"orch doctor {host.name}")
    if res.ok and res.out.strip():
        return Check(name, OK, res.out.strip())
    return Check(
        name,
        FAIL,
        "pct not found on the host's PATH",
        f"{host.name} must be a Proxmox VE node (pct comes with pve-container); "
        "check address in hosts.yaml",
    )


def check_container_running(inv: Inventory, ct: ContainerConfig) -> Check:
    """``pct status VMID`` says running."""
    from orchestrator.transport.connect import transport_for

    name = f"container {ct.name} running"
    try:
        word = transport_for(inv, ct.name).status(timeout=REMOTE_TIMEOUT_S)  # type: ignore[attr-defined]
    except ContainerNotFound as exc:
        return Check(
            name,
            FAIL,
            str(exc),
            f"fix vmid of {ct.name} in hosts.yaml (pct list on {ct.host} shows the ids)",
        )
    except OrchError as exc:
        return Check(name, FAIL, str(exc), f"orch doctor {ct.host}")
    if word == "running":
        return Check(name, OK, f"pct status {ct.vmid}: running")
    return Check(name, FAIL, f"pct status {ct.vmid}: {word}", f"ssh {ct.host} pct start {ct.vmid}")


def _in_container(inv: Inventory, ct: ContainerConfig, argv: list[str]) -> Any:
    from orchestrator.transport.connect import transport_for

    return transport_for(inv, ct.name).run(argv, timeout=REMOTE_TIMEOUT_S)


def _install_fix(ct: ContainerConfig, package: str) -> str:
    if ct.is_local:
        return f"install {package} on this machine (apt-get install -y {package})"
    return f"ssh {ct.host} pct exec {ct.vmid} -- apt-get install -y {package}"


def check_tool(
    inv: Inventory, ct: ContainerConfig, label: str, argv: list[str], package: str
) -> Check:
    """``argv`` (a ``--version``-like command) runs in the container: present, with its version.

    Runs with the container's ``env`` from hosts.yaml, as every orch command does, so a
    ``PATH`` set there is the PATH checked.
    """
    name = f"{label} in {ct.name}"
    try:
        res = _in_container(inv, ct, argv)
    except ContainerNotRunning as exc:
        return Check(name, FAIL, str(exc), f"ssh {ct.host} pct start {ct.vmid}")
    except OrchError as exc:
        return Check(name, FAIL, str(exc), f"orch doctor {ct.host}")
    text = (res.out.strip() or res.err.strip()).splitlines()
    if res.ok and text:
        return Check(name, OK, text[0][:120])
    if res.exit_status in (126, 127):
        return Check(
            name, FAIL, f"{argv[0]} not found on the container's PATH", _install_fix(ct, package)
        )
    return Check(
        name,
        FAIL,
        f"{' '.join(argv)} exited {res.exit_status}: {(text[-1] if text else 'no output')[:200]}",
        _install_fix(ct, package),
    )


def _python_verdict(found: Check, where: str, python: str, *, host: bool) -> Check:
    """``found`` (a ``python --version`` check), failed when that python is older than the
    agent's :data:`~orchestrator.remote.deploy.MIN_PYTHON` (on a host: a warning, orch works
    without the host probe)."""
    from orchestrator.remote.deploy import MIN_PYTHON, parse_python_version, too_old

    version = parse_python_version(found.detail) if found.status == OK else None
    if version is None or version[:2] >= MIN_PYTHON:
        return found
    problem, fix = too_old(where, python, version, host=host)
    return Check(found.name, WARN if host else FAIL, problem, fix)


def check_python(inv: Inventory, ct: ContainerConfig) -> Check:
    """The container's python (``python:`` in hosts.yaml) runs, and is >= 3.10 for the agent."""
    found = check_tool(inv, ct, "python3", [ct.python, "--version"], "python3")
    return _python_verdict(found, ct.name, ct.python, host=False)


def check_host_python(inv: Inventory, host: HostConfig) -> Check:
    """The host's python (``host_python:``, default python3) runs and is >= 3.10 for the host
    probe and the host observer; a warning otherwise (orch then observes from inside)."""
    from orchestrator.transport.connect import host_transport

    python = host.host_python
    name = f"{python} on {host.name}"
    try:
        res = host_transport(inv, host.name).run([python, "--version"], timeout=REMOTE_TIMEOUT_S)
    except OrchError as exc:
        return Check(name, WARN, str(exc), f"orch doctor {host.name}")
    text = (res.out.strip() or res.err.strip() or "no output").splitlines()[0][:120]
    if not res.ok:
        return Check(
            name,
            WARN,
            f"{python} --version exited {res.exit_status}: {text}; the "
            "host probe needs Python >= 3.10",
            f"apt-get install -y python3 on {host.name}",
        )
    return _python_verdict(Check(name, OK, text), host.name, python, host=True)


_NVML_FIXES = {
    "library-not-found": "libnvidia-ml.so.1 is not visible in the container: bind-mount the "
    "host's NVIDIA libraries and /dev/nvidia* into it (lxc.mount.entry in /etc/pve/lxc/VMID.conf)",
    "driver-not-loaded": "the NVIDIA kernel module is not loaded on the host: nvidia-smi on the "
    "host, then modprobe nvidia",
    "driver-mismatch": "the container's NVIDIA user-space libraries differ from the host's kernel "
    "module: install the host's driver version in the container (--no-kernel-module)",
    "gpu-lost": "a GPU fell off the bus: check the host's kernel log (dmesg | grep -i xid); a "
    "reset or reboot of the host is usually needed",
    "timeout": "NVML calls hang: a GPU is wedged; check the host's kernel log for Xid errors",
}


def _nvml_fix(ct: ContainerConfig, kind: str) -> str:
    if ct.is_local and kind == "library-not-found":
        return (
            "no NVIDIA driver on this machine: install one (nvidia-smi must work), or try "
            "orch on simulated GPUs: orch sandbox up"
        )
    return _NVML_FIXES.get(
        kind, "nvidia-smi in the container shows the same error; see docs/detectors.md (nvml-error)"
    )


def check_nvml(inv: Inventory, ct: ContainerConfig) -> Check:
    """NVML readable in the container, through the agent's ``facts`` (pynvml, the path orch
    uses); when the agent cannot run, ``nvidia-smi -L`` says at least whether GPUs show."""
    from orchestrator.remote.target import Target

    name = f"NVML in {ct.name}"
    try:
        facts = Target(inv, ct.name).facts(timeout=FACTS_TIMEOUT_S)
    except OrchError as exc:
        agent_error = str(exc)
    else:
        nvml = facts.get("nvml") or {}
        gpus = facts.get("gpus") or []
        if nvml.get("ok"):
            via = nvml.get("source") or "nvml"
            return Check(
                name, OK, f"driver {nvml.get('driver_version')}, {len(gpus)} GPU(s) via {via}"
            )
        kind = nvml.get("error_kind") or "other"
        detail = f"{kind}: {nvml.get('message') or 'no message'}"
        return Check(
            name,
            FAIL,
            detail[:300],
            _nvml_fix(ct, kind),
        )
    try:
        res = _in_container(inv, ct, ["nvidia-smi", "-L"])
    except OrchError as exc:
        return Check(
            name,
            FAIL,
            f"agent failed ({agent_error[:200]}); nvidia-smi: {exc}",
            f"orch doctor {ct.name} after fixing the checks above",
        )
    gpus = [ln for ln in res.out.splitlines() if ln.startswith("GPU ")]
    if res.ok and gpus:
        return Check(
            name,
            WARN,
            f"{len(gpus)} GPU(s) by nvidia-smi -L, but the agent failed: {agent_error[:200]}",
            "fix python3 in the container (see above)",
        )
    return Check(
        name,
        FAIL,
        f"agent failed ({agent_error[:200]}); nvidia-smi -L exited {res.exit_status}",
        _nvml_fix(ct, "library-not-found"),
    )


# --------------------------------------------------------------------------- the checklist


def _resolve_target(
    inv: Inventory, target: str
) -> tuple[HostConfig | None, ContainerConfig | None]:
    if target in inv.containers:
        ct = inv.containers[target]
        return inv.hosts.get(ct.host), ct
    if target in inv.hosts:
        return inv.hosts[target], None
    known = sorted({*inv.containers, *inv.hosts})
    raise UsageError(
        f"no container or host named {target!r} in the inventory "
        f"(known: {', '.join(known) or 'none'})"
    )


def _skip(name: str, because: str) -> Check:
    return Check(name, SKIP, f"skipped: {because}")


def _target_checks(
    inv: Inventory, host: HostConfig | None, ct: ContainerConfig | None
) -> Iterator[Check]:
    if host is not None:
        ssh = check_ssh(inv, host)
        yield ssh
        if not ssh.ok:
            names = [f"pct on {host.name}", f"python3 on {host.name}"]
            if ct is not None:
                names += [
                    f"container {ct.name} running",
                    f"python3 in {ct.name}",
                    f"tmux in {ct.name}",
                    f"NVML in {ct.name}",
                ]
            yield from (_skip(n, f"no ssh to {host.name}") for n in names)
            return
        pct = check_pct(inv, host)
        yield pct
        yield check_host_python(inv, host)
        if ct is None:
            yield from observe_checks(inv, host, None, Check) if pct.ok else ()
            return
        running = (
            check_container_running(inv, ct)
            if pct.ok
            else _skip(f"container {ct.name} running", "no pct")
        )
        yield running
        if not running.ok:
            why = f"{ct.name} is not running" if running.status == FAIL else "no pct"
            yield from (_skip(f"{t} in {ct.name}", why) for t in ("python3", "tmux", "NVML"))
            return
    assert ct is not None
    yield check_python(inv, ct)
    yield check_tool(inv, ct, "tmux", ["tmux", "-V"], "tmux")
    yield check_nvml(inv, ct)
    yield from observe_checks(inv, host, ct, Check)


def run_doctor(
    explicit: Path | None,
    target: str | None = None,
    on_check: Callable[[Check], None] | None = None,
) -> list[Check]:
    """Run every check (the target's path too when ``target`` is given); return them in order.

    ``on_check`` is called with each check as soon as it is known (live output).
    Connections opened here are closed before returning.

    Raises:
        UsageError: ``target`` names neither a container nor a host of a valid inventory.
    """
    checks: list[Check] = []

    def add(c: Check) -> None:
        checks.append(c)
        if on_check is not None:
            on_check(c)

    config, inv = check_config(explicit)
    add(config)
    if inv is not None and inv.path is not None:
        add(check_config_perms(inv.path))
    add(check_state_dir())
    add(check_packages())
    if inv is None:
        if target is not None:
            add(_skip(f"path to {target}", "hosts.yaml is missing or invalid"))
        return checks
    host, ct = _resolve_target(inv, target) if target else (None, None)
    hosts = [host] if host is not None else ([] if target else list(inv.hosts.values()))
    for h in hosts:
        add(check_identity(h))
        add(check_host_key(h))
    if target is None:
        return checks
    from orchestrator.transport.connect import close_all

    try:
        for c in _target_checks(inv, host, ct):
            add(c)
    finally:
        close_all()
    return checks
