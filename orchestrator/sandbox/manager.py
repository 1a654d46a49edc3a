"""The simulated Proxmox host on this machine: ``orch sandbox up|down|status|scenario``.

A sandbox is a real sshd on 127.0.0.1 (sshd.py), a ``pct`` stand-in (pct/), the fake
libnvidia-ml (fakenvml.c), GPU scenarios (scenario.py) and containers ct200, ct201, ...
in one of two isolations:

- ``lxc`` (as root where LXC 5 is installed): each container is a real LXC container
  with its own PID, mount, UTS and IPC namespaces and a cgroup in Proxmox's layout
  (lxc.py); ``pct`` drives it with lxc-attach, lxc-info, lxc-start and lxc-stop.
- ``process`` (everywhere else): a container is a directory and a marker in the
  environment of its processes (process.py); no namespaces.

The state directory's layout is in state.py. ``up`` picks ``lxc`` where it can and
says in one line (``SandboxInfo.fallback``) why it fell back to ``process``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.sandbox import hosts, kernel, lxc, network, process, unpriv
from orchestrator.sandbox.control import (
    kill_tmux_server,
    reboot,
    run_pct,
    start_container,
    start_sshd,
    stop_container,
    stop_sshd,
)
from orchestrator.sandbox.fakenvml import MissingTool, build_fake_nvml, build_init
from orchestrator.sandbox.files import python_link, standin_wrapper, write_atomic
from orchestrator.sandbox.info import SandboxInfo, root_of
from orchestrator.sandbox.scenario import (
    gpu_roles,
    load_scenario,
    read_scenario,
    resize_scenario,
    scenario_names,
    set_scenario,
)
from orchestrator.sandbox.state import (
    FIRST_VMID,
    HOST_NAME,
    ISOLATIONS,
    SCHEMA_VERSION,
    WORKDIR,
    SandboxError,
    host_env,
    read_state,
    resolve_state_dir,
    write_state,
)

__all__ = [  # the sandbox's API; tests and the reliability suite use these names
    "SandboxError",
    "SandboxInfo",
    "down",
    "host_env",
    "info",
    "kill_tmux_server",
    "load_scenario",
    "read_scenario",
    "reboot",
    "resize_scenario",
    "resolve_state_dir",
    "run_pct",
    "scenario_names",
    "set_scenario",
    "start_container",
    "start_sshd",
    "status",
    "stop_container",
    "stop_sshd",
    "up",
]

log = logging.getLogger(__name__)


def _check_tools() -> None:
    from orchestrator.sandbox import sshd

    if not shutil.which("tmux"):
        raise MissingTool("tmux", "tmux")
    if not os.access(sshd.SSHD, os.X_OK):
        raise MissingTool(f"sshd ({sshd.SSHD})", "openssh-server")
    if not shutil.which(sshd.SSH_KEYGEN):
        raise MissingTool("ssh-keygen", "openssh-client")


# --------------------------------------------------------------------------- up / down / status


def choose_isolation(requested: str, previous: str | None = None) -> tuple[str, str | None]:
    """(isolation, fallback line) for ``--isolation requested`` (``auto``, ``lxc``, ``process``).

    ``auto`` keeps a state directory's ``previous`` isolation, else takes ``lxc`` where
    it can run. Raises SandboxError when ``lxc`` is asked for and cannot run, and
    UsageError for an unknown name.
    """
    if requested not in ("auto", *ISOLATIONS):
        raise UsageError(f"--isolation must be auto, lxc or process, got {requested!r}")
    if requested == "auto" and previous in ISOLATIONS:
        return str(previous), None
    if requested == "process":
        return "process", None
    reason = lxc.unavailable()
    if reason is None:
        return "lxc", None
    if requested == "lxc":
        raise SandboxError(f"LXC containers cannot run here: {reason}; use --isolation process")
    return "process", f"LXC containers cannot run here ({reason}): process mode, no namespaces"


def _pve_conf(
    state_dir: Path, vmid: int, where: Path, host: str = HOST_NAME, unprivileged: bool = True
) -> None:
    """The container's /etc/pve/lxc/<vmid>.conf; ``unprivileged: 1`` as pct writes it for an
    unprivileged container (a privileged one has no such line; process mode keeps it)."""
    old = state_dir / "etc" / "pve" / "lxc"  # a sandbox from before several hosts
    if host == HOST_NAME and old.is_dir() and not old.is_symlink():
        conf = old / f"{vmid}.conf"
    else:
        conf = hosts.pve_conf_dir(state_dir, host) / f"{vmid}.conf"
        if not old.exists():  # as on Proxmox: /etc/pve/lxc is the local node's directory
            old.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                old.symlink_to(Path("nodes") / HOST_NAME / "lxc")
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists():
        write_atomic(
            conf,
            f"# orch sandbox container; its / is {where}\n"
            f"arch: amd64\ncores: 16\nhostname: ct{vmid}\nmemory: 65536\nostype: ubuntu\n"
            f"rootfs: local-lvm:vm-{vmid}-disk-0,size=200G\nswap: 0\n"
            + ("unprivileged: 1\n" if unprivileged else "")
            + "lxc.cgroup2.devices.allow: c 195:* rwm\n",
        )


def _info(state_dir: Path, state: Mapping[str, Any], fallback: str | None = None) -> SandboxInfo:
    vmids = tuple(int(c["vmid"]) for c in state["containers"])
    host_rows = state.get("hosts") or [{"name": HOST_NAME, "port": state["port"]}]
    return SandboxInfo(
        state_dir=state_dir,
        config_path=state_dir / "hosts.yaml",
        port=int(state["port"]),
        sshd_pid=int(state["sshd_pid"]),
        containers=tuple(f"ct{v}" for v in vmids),
        vmids=vmids,
        gpus=int(state["gpus"]),
        scenario=str(state.get("scenario", "")),
        identity_file=Path(state["identity_file"]),
        known_hosts_path=Path(state["known_hosts"]),
        cgroup=bool(state.get("cgroup")),
        isolation=str(state.get("isolation", "process")),
        fallback=fallback,
        hosts=tuple(str(h["name"]) for h in host_rows),
        ports=tuple(int(h["port"]) for h in host_rows),
        placement=tuple(
            (f"ct{c['vmid']}", str(c.get("host", HOST_NAME))) for c in state["containers"]
        ),
        addresses=tuple(
            (f"ct{c['vmid']}", str(c["address"])) for c in state["containers"] if c.get("address")
        ),
        network=state.get("network", {}).get("switch") if state.get("network") else None,
    )


def info(state_dir: Path | str | None = None) -> SandboxInfo:
    """The :class:`SandboxInfo` of the sandbox that ``up`` started in ``state_dir``.

    Raises:
        SandboxError: no sandbox there, or one that never finished starting.
    """
    state_dir = resolve_state_dir(state_dir)
    state = read_state(state_dir)
    if "port" not in state:
        raise SandboxError(f"the sandbox in {state_dir} did not finish starting")
    return _info(state_dir, state)


def _running(state_dir: Path, isolation: str, vmid: int) -> bool:
    if isolation == "lxc":
        return lxc.init_pid(state_dir, vmid) is not None
    return process.is_running(state_dir, vmid)


def up(
    state_dir: Path | str | None = None,
    containers: int = 1,
    gpus: int = 8,
    scenario: str | Path = "healthy",
    isolation: str = "auto",
    host_count: int = 1,
    unprivileged: bool | None = None,
) -> SandboxInfo:
    """Start a sandbox: fake NVML, stand-ins, ``containers`` running containers (ct200...) on
    ``host_count`` simulated Proxmox hosts (each its own sshd), the job network between them.
    ``unprivileged`` (LXC mode): root in each container is uid 100000 outside, as Proxmox
    makes its containers by default (sandbox/unpriv.py); ``None``: unprivileged when
    ``$ORCH_SANDBOX_KIND`` is ``unprivileged`` (how the tests run against both kinds).

    Idempotent: when the sandbox in ``state_dir`` already runs, its info is returned unchanged.
    A failed start stops what it had started (:func:`down`) before raising.

    Raises:
        MissingTool: tmux, sshd, ssh-keygen or a C compiler is missing (exit 2, names the apt package).
        UsageError: bad counts, isolation or an unknown scenario.
        SandboxError / SshdError: something failed to start (the message says what).
    """
    from orchestrator.sandbox import sshd

    if not 1 <= containers <= 50:
        raise UsageError(f"--containers must be 1..50, got {containers}")
    if not 1 <= gpus <= 64:
        raise UsageError(f"--gpus must be 1..64, got {gpus}")
    if not 1 <= host_count <= min(containers, 16):
        raise UsageError(
            f"--hosts must be 1..{min(containers, 16)} (at most one per container), got {host_count}"
        )
    state_dir = resolve_state_dir(state_dir)
    previous = None
    if (state_dir / "state.json").exists():
        old = read_state(state_dir)
        previous = old.get("isolation", "process")
        if sshd.sshd_running(state_dir / "sshd"):
            log.info("sandbox in %s already runs (port %s)", state_dir, old.get("port"))
            return _info(state_dir, old)
    mode, fallback = choose_isolation(isolation, previous)
    asked = bool(unprivileged)
    if unprivileged is None:  # the tests' switch: LXC sandboxes only, auto may still fall back
        unprivileged = mode == "lxc" and os.environ.get("ORCH_SANDBOX_KIND") == "unprivileged"
    if unprivileged and mode != "lxc":
        raise SandboxError(f"unprivileged containers need LXC mode ({fallback or mode})")
    if previous is not None and previous != mode:
        raise SandboxError(
            f"{state_dir} holds a {previous}-mode sandbox; use another --dir for {mode} mode"
        )
    _check_tools()
    load_scenario(scenario)  # fail early on a bad name
    state_dir.mkdir(parents=True, exist_ok=True)
    if unprivileged:  # the sandbox's own directory: traversal for the mapped root, no listing
        state_dir.chmod(state_dir.stat().st_mode | 0o011)
    try:
        return _up(state_dir, containers, gpus, scenario, mode, fallback, host_count, unprivileged)
    except SandboxError as exc:
        with contextlib.suppress(Exception):
            down(state_dir)
        if isolation != "auto" or mode != "lxc" or previous is not None or asked:
            raise
        # LXC is installed but its containers do not start here (e.g. a confined host):
        # a fresh state directory goes on in process mode, saying why
        shutil.rmtree(state_dir / "containers", ignore_errors=True)
        shutil.rmtree(state_dir / "lxc", ignore_errors=True)
        (state_dir / "state.json").unlink(missing_ok=True)
        why = str(exc).splitlines()[0][:160]
        fb = f"LXC containers did not start here ({why}): process mode, no namespaces"
    except BaseException:
        with contextlib.suppress(Exception):
            down(state_dir)
        raise
    try:
        return _up(state_dir, containers, gpus, scenario, "process", fb, host_count)
    except BaseException:
        with contextlib.suppress(Exception):
            down(state_dir)
        raise


def _up(
    state_dir: Path,
    containers: int,
    gpus: int,
    scenario: str | Path,
    mode: str,
    fb: str | None,
    host_count: int = 1,
    unprivileged: bool = False,
) -> SandboxInfo:
    from orchestrator.sandbox import sshd

    lib_dir = state_dir / "lib"
    build_fake_nvml(lib_dir)
    if mode == "lxc":
        build_init(lib_dir)
    (state_dir / "bin").mkdir(exist_ok=True)
    for name in ("pct", "dmesg", "nvidia-smi"):
        standin_wrapper(state_dir / "bin" / name, name)
    standin_wrapper(state_dir / "bin" / "journalctl", "dmesg", "--as-journalctl")
    python_link(state_dir / "bin")
    state: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "isolation": mode,
        "gpus": gpus,
        "containers": [],
    }
    write_state(state_dir, state)
    set_scenario(state_dir, scenario)
    vmids = [FIRST_VMID + i for i in range(containers)]
    names = hosts.host_names(host_count)
    where = hosts.placement(vmids, names)
    for h in names:
        if not hosts.kernel_log_path(state_dir, h).exists():
            kernel.append_kernel_line(
                state_dir,
                "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.172.08  (orch sandbox)",
                level=6,
                host=h,
            )
    netns: dict[str, str] = {}
    why_no_net = network.unavailable() if mode == "lxc" else "process mode"
    if why_no_net is None:
        network.write_hook(lib_dir)
        netns = network.create(state_dir, names)
        state["network"] = {"switch": network.switch_ns(state_dir), "hosts": netns}
        write_state(state_dir, state)
    elif mode == "lxc":
        log.warning("no job network between the containers: %s", why_no_net)
    state["hosts"] = [{"name": h} for h in names]
    for v in vmids:
        address = network.address_of(v, mode) if netns or mode == "process" else None
        state["containers"].append(
            {"name": f"ct{v}", "vmid": v, "host": where[v], "address": address}
        )
        write_state(state_dir, state)  # down() finds what was made so far
        if _running(state_dir, mode, v):
            continue
        if mode == "lxc":
            net = network.lxc_lines(state_dir, v, where[v], netns[where[v]]) if netns else []
            lxc.make_container(
                state_dir, v, lib_dir, net=net, address=address, unprivileged=unprivileged
            )
        else:
            process.make_container(state_dir, v)
        _pve_conf(
            state_dir, v, root_of(state_dir, mode, v), where[v], unprivileged or mode != "lxc"
        )
        start_container(state_dir, v)
    cgroup_ok = _cgroup_named(state_dir, mode, vmids[0])
    if mode == "lxc" and not cgroup_ok:
        raise SandboxError(f"ct{vmids[0]}'s init is not in a cgroup named lxc/{vmids[0]}")
    if not cgroup_ok:
        log.info("cgroup v2 not writable here: container processes are found by ORCH_SANDBOX_CT")

    servers = {
        h: sshd.start_sshd(
            hosts.sshd_dir(state_dir, h),
            path_prepend=[str(state_dir / "bin")],
            env=hosts.node_env(state_dir, h),
        )
        for h in names
    }
    server = servers[HOST_NAME]
    addresses = {f"ct{c['vmid']}": c["address"] for c in state["containers"] if c["address"]}
    text = hosts.hosts_yaml(
        state_dir, servers, {f"ct{v}": where[v] for v in vmids}, addresses, gpu_roles(gpus), mode
    )
    write_atomic(state_dir / "hosts.yaml", text)
    state.update(
        state_dir=str(state_dir),
        port=server.port,
        sshd_pid=server.pid,
        identity_file=str(server.client_key_path),
        known_hosts=str(server.known_hosts_path),
        scenario=read_scenario(state_dir).get("name", str(scenario)),
        cgroup=cgroup_ok,
        started_at=time.time(),
        hosts=[
            {"name": h, "port": srv.port, "sshd_pid": srv.pid, "sshd_dir": str(srv.state_dir)}
            for h, srv in servers.items()
        ],
        containers=[
            {**c, "root": str(root_of(state_dir, mode, int(c["vmid"])))}
            for c in state["containers"]
        ],
    )
    write_state(state_dir, state)
    return _info(state_dir, state, fb)


def _cgroup_named(state_dir: Path, mode: str, vmid: int) -> bool:
    """Whether the host's /proc/PID/cgroup of a process in container ``vmid`` names ``/lxc/<vmid>/``
    (LXC: its init; process mode: a ``cat`` through pct exec)."""
    want = f"/lxc/{vmid}/"
    if mode == "lxc":
        init = lxc.init_pid(state_dir, vmid)
        with contextlib.suppress(OSError):
            return init is not None and want in Path(f"/proc/{init}/cgroup").read_text()
        return False
    probe = run_pct(state_dir, "exec", str(vmid), "--", "cat", "/proc/self/cgroup")
    return probe.returncode == 0 and want in probe.stdout


def _own_vmids(state_dir: Path, state: Mapping[str, Any]) -> list[int]:
    vmids = set(process.own_vmids(state_dir, state)) | set(lxc.defined(state_dir))
    return sorted(vmids)


def down(state_dir: Path | str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Stop everything the sandbox started, by pid: containers (tmux servers too), sshd, stragglers.

    Run logs and the state directory stay. Then the sandbox's cgroups go (LXC: its
    ``orch-<id>`` tree and its lxcpath, so ``lxc-ls -P D/lxc`` lists nothing; process
    mode: its leaves, and the shared ``lxc/<vmid>`` parents when no other sandbox uses
    them). Returns what was stopped: ``{"sshd": bool, "containers": [names], "killed": n}``,
    plus ``"cgroups_left": [paths]`` when one could not be removed (logged; none expected).
    """
    from orchestrator.sandbox import sshd

    state_dir = resolve_state_dir(state_dir)
    state = read_state(state_dir)
    mode = state.get("isolation", "process")
    stopped: list[str] = []
    for vmid in _own_vmids(state_dir, state):
        if _running(state_dir, mode, vmid):
            stop_container(state_dir, vmid)
            stopped.append(f"ct{vmid}")
    sshd_was = sshd.stop_sshd(state_dir / "sshd")
    for h in state.get("hosts") or []:
        if h.get("name") != HOST_NAME:
            sshd.stop_sshd(hosts.sshd_dir(state_dir, str(h["name"])))
    killed = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = process.marked_processes(state_dir)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.05)
    # last: a straggler killed above may have sat in a cgroup
    if mode == "lxc":
        cgroups_left = lxc.remove_cgroups(state_dir)
        if not any(lxc.init_pid(state_dir, v) for v in lxc.defined(state_dir)):
            lxc.undefine(state_dir)
            unpriv.unmount_staging(lxc.cgroup_prefix(state_dir))
    else:
        cgroups_left = [
            str(leaf)
            for leaf in process.own_cgroups(state_dir, state)
            if not process.remove_cgroup(leaf)
        ]
    if state.get("network"):
        network.destroy(state_dir)
    result: dict[str, Any] = {"sshd": sshd_was, "containers": stopped, "killed": killed}
    if cgroups_left:
        result["cgroups_left"] = cgroups_left
    return result


def _container_status(state_dir: Path, mode: str, c: Mapping[str, Any]) -> dict[str, Any]:
    vmid = int(c["vmid"])
    init = None
    if mode == "lxc":
        init = lxc.init_pid(state_dir, vmid)
        running, procs = init is not None, len(lxc.namespace_pids(init)) if init else 0
        workdir = "/" + WORKDIR
    else:
        running = process.is_running(state_dir, vmid)
        procs = len(process.marked_processes(state_dir, vmid))
        workdir = str(process.container_root(state_dir, vmid) / WORKDIR)
    return {
        "name": c["name"],
        "vmid": vmid,
        "status": "running" if running else "stopped",
        "init_pid": init,
        "processes": procs,
        "workdir": workdir,
        "root": c.get("root"),
    }


def status(state_dir: Path | str | None = None) -> dict[str, Any]:
    """What runs in a sandbox: isolation, sshd, each container (status, host PID of its init,
    process count, workdir as orch names it, root on the host) and the scenario."""
    from orchestrator.sandbox import sshd

    state_dir = resolve_state_dir(state_dir)
    state = read_state(state_dir)
    mode = str(state.get("isolation", "process"))
    try:
        scenario = read_scenario(state_dir).get("name", state.get("scenario"))
    except (OSError, ValueError):
        scenario = state.get("scenario")
    return {
        "state_dir": str(state_dir),
        "config": str(state_dir / "hosts.yaml"),
        "isolation": mode,
        "running": sshd.sshd_running(state_dir / "sshd"),
        "port": state.get("port"),
        "sshd_pid": state.get("sshd_pid"),
        "scenario": scenario,
        "gpus": state.get("gpus"),
        "cgroup": state.get("cgroup"),
        "containers": [_container_status(state_dir, mode, c) for c in state.get("containers", [])],
    }
