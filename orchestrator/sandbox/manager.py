"""The simulated Proxmox host on this machine: ``orch sandbox up|down|status|scenario``.

Layout of a state directory (default ``~/.local/state/orch/sandbox``; several can coexist)::

    state.json                 what was started (sshd pid, port, containers, scenario)
    hosts.yaml                 inventory for it: host ``sandbox``, containers ct200, ct201, ...
    scenario.json              the live GPU scenario ($ORCH_FAKE_NVML_SCENARIO)
    kernel.log                 the kernel ring buffer (dmesg/journalctl stand-ins)
    lib/libnvidia-ml.so.1      the fake NVML (fakenvml.c)
    bin/                       pct, dmesg, journalctl, nvidia-smi, python3 (the real
                               interpreter, not a pyenv shim): first on the sshd's PATH
    sshd/                      sshd config, host key, client key, known_hosts, log
    etc/pve/lxc/<vmid>.conf    container configs
    containers/<vmid>/         a container's "/": root/ (HOME, holds the workdir root/dflash),
                               tmp/ (its tmux sockets), usr/bin/ (nvidia-smi, python3),
                               status, cgroup

Everything runs as the current user. When cgroup v2 is writable, ``pct exec``
puts its child in ``<cgroup2>/lxc/<vmid>/ns/orch-sandbox-<id>`` so
``/proc/<pid>/cgroup`` shows ``lxc/<vmid>`` as on a real Proxmox host; every
container process also carries ``ORCH_SANDBOX_CT=<state>:<vmid>`` in its
environment (the fallback, and how ``down`` finds what to stop).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError, UsageError
from orchestrator.sandbox import kernel
from orchestrator.sandbox.fakenvml import MissingTool, build_fake_nvml

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
STANDIN_DIR = PACKAGE_DIR / "bin"
SCENARIO_DIR = PACKAGE_DIR / "scenarios"
DEFAULT_STATE_DIR = Path("~/.local/state/orch/sandbox")
HOST_NAME = "sandbox"
FIRST_VMID = 200
SESSION = "train"
WORKDIR = "root/dflash"
SCHEMA_VERSION = 1
_UNIX_SOCKET_MAX = 107  # sun_path holds 108 bytes with the NUL


class SandboxError(OrchError):
    """The sandbox could not be started, changed or read (exit 1)."""


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """A running sandbox. Paths are absolute; ``containers`` are names (``ct200``, ...)."""

    state_dir: Path
    config_path: Path
    port: int
    sshd_pid: int
    containers: tuple[str, ...]
    vmids: tuple[int, ...]
    gpus: int
    scenario: str
    identity_file: Path
    known_hosts_path: Path
    cgroup: bool
    host: str = HOST_NAME

    def container_root(self, vmid: int) -> Path:
        """The host directory that is the container's ``/``."""
        return self.state_dir / "containers" / str(vmid)

    def workdir(self, container: str | int) -> Path:
        """The workdir of ``ct200`` (or vmid 200): an absolute host path inside the container."""
        vmid = container if isinstance(container, int) else int(str(container).removeprefix("ct"))
        return self.container_root(vmid) / WORKDIR

    def env(self) -> dict[str, str]:
        """Environment that runs the stand-ins locally as the sandbox sshd would (``pct``, ``dmesg``)."""
        return host_env(self.state_dir)

    def to_dict(self) -> dict[str, Any]:
        """The ``orch sandbox up --json`` document."""
        return {
            "config": str(self.config_path),
            "state_dir": str(self.state_dir),
            "host": self.host,
            "port": self.port,
            "sshd_pid": self.sshd_pid,
            "containers": list(self.containers),
            "vmids": list(self.vmids),
            "gpus": self.gpus,
            "scenario": self.scenario,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts_path),
            "cgroup": self.cgroup,
        }


# --------------------------------------------------------------------------- paths and env


def resolve_state_dir(state_dir: Path | str | None) -> Path:
    """``state_dir`` (or the default) as an absolute path, ``~`` expanded."""
    return Path(state_dir or DEFAULT_STATE_DIR).expanduser().absolute()


def host_env(state_dir: Path) -> dict[str, str]:
    """The variables the sandbox sshd sets for every command (besides PATH)."""
    return {
        "ORCH_SANDBOX_STATE": str(state_dir),
        "ORCH_FAKE_NVML_SCENARIO": str(state_dir / "scenario.json"),
        "LD_LIBRARY_PATH": str(state_dir / "lib"),
    }


def _local_env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(host_env(state_dir))
    env["PATH"] = f"{state_dir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _wrapper(path: Path, script: str, *args: str) -> None:
    """A tiny sh wrapper that runs a stand-in with this Python (no exec bit or PATH python needed)."""
    words = " ".join(
        shlex.quote(a) for a in (sys.executable, "-E", "-S", str(STANDIN_DIR / script), *args)
    )
    _write_atomic(path, f'#!/bin/sh\nexec {words} "$@"\n', 0o755)


def _python_link(directory: Path) -> None:
    """``directory/python3``: this machine's interpreter itself, as a host's ``/usr/bin/python3``.

    ``python3`` on this machine's PATH may be a pyenv shim (a bash script, ~0.5 s a
    call); a Proxmox host or container starts its interpreter directly. A symlink to
    the real binary, except in a virtualenv, whose packages only its own ``python``
    finds: then a one-line sh wrapper (``exec`` costs ~1 ms).
    """
    link = directory / "python3"
    if sys.prefix != sys.base_prefix:
        _write_atomic(link, f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n', 0o755)
        return
    real = os.path.realpath(sys.executable)
    if link.is_symlink() and os.readlink(link) == real:
        return
    tmp = directory / f".python3.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(real)
    os.replace(tmp, link)


def _check_tools() -> None:
    if not shutil.which("tmux"):
        raise MissingTool("tmux", "tmux")
    from orchestrator.sandbox import sshd

    if not os.access(sshd.SSHD, os.X_OK):
        raise MissingTool(f"sshd ({sshd.SSHD})", "openssh-server")
    if not shutil.which(sshd.SSH_KEYGEN):
        raise MissingTool("ssh-keygen", "openssh-client")


# --------------------------------------------------------------------------- scenarios


def scenario_names() -> list[str]:
    """The bundled scenario names (``healthy``, ``idle``, ``ghost``, ...)."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def load_scenario(name_or_path: str | Path) -> tuple[str, dict[str, Any]]:
    """(name, document) of a bundled scenario name or a JSON file path.

    Raises:
        UsageError: neither a bundled name nor a readable JSON object (names the bundled ones).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if not path.is_file():
        path = SCENARIO_DIR / f"{text}.json"
    if not path.is_file():
        raise UsageError(
            f"unknown scenario {text!r}; bundled: {', '.join(scenario_names())}, or a JSON file path"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON scenario: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: a scenario is a JSON object")
    return path.stem, doc


def resize_scenario(doc: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """``doc`` with exactly ``gpus`` devices: extra ones cut, missing ones cloned from the last.

    >>> d = resize_scenario({"devices": [{"index": 0, "uuid": "GPU-a", "pci_bus_id": "00000000:18:00.0"}]}, 2)
    >>> [(x["index"], x["uuid"], x["pci_bus_id"]) for x in d["devices"]]
    [(0, 'GPU-a', '00000000:18:00.0'), (1, 'GPU-a-1', '00000000:E1:00.0')]
    """
    out = dict(doc)
    devices = [dict(d) for d in doc.get("devices") or []]
    if devices and gpus > 0:
        while len(devices) < gpus:
            i = len(devices)
            clone = dict(devices[-1])
            clone.update(
                index=i,
                uuid=f"{devices[0].get('uuid', 'GPU')}-{i}",
                pci_bus_id=f"00000000:{0xE0 + i:02X}:00.0",
            )
            devices.append(clone)
        out["devices"] = devices[:gpus]
    return out


def _gpu_roles(gpus: int) -> dict[str, list[int]]:
    """Target/drafter split as in the seeds (8 GPUs: target 0-4, drafter 5-7).

    >>> _gpu_roles(8)
    {'target': [0, 1, 2, 3, 4], 'drafter': [5, 6, 7]}
    >>> _gpu_roles(1)
    {'target': [0]}
    """
    if gpus <= 1:
        return {"target": list(range(gpus))}
    drafter = max(1, (gpus * 3) // 8)
    return {"target": list(range(gpus - drafter)), "drafter": list(range(gpus - drafter, gpus))}


def _read_state(state_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((state_dir / "state.json").read_text())
    except FileNotFoundError:
        raise SandboxError(
            f"no sandbox in {state_dir} (no state.json); start one with: orch sandbox up --dir {state_dir}"
        ) from None
    except ValueError as exc:
        raise SandboxError(f"{state_dir / 'state.json'}: unreadable: {exc}") from exc


def set_scenario(state_dir: Path | str | None, scenario: str | Path | Mapping[str, Any]) -> str:
    """Switch the live scenario atomically (temp + rename) while things run; returns its name.

    ``scenario`` is a bundled name, a JSON file path, or a document (mapping). The
    devices are fitted to the sandbox's GPU count; the scenario's ``kernel_log``
    lines are appended to the kernel log, stamped now.
    """
    state_dir = resolve_state_dir(state_dir)
    state = _read_state(state_dir) if (state_dir / "state.json").exists() else {}
    if isinstance(scenario, Mapping):
        name, doc = str(scenario.get("name", "custom")), dict(scenario)
    else:
        name, doc = load_scenario(scenario)
    doc = resize_scenario(doc, int(state.get("gpus", len(doc.get("devices") or []))))
    doc["name"] = name
    _write_atomic(state_dir / "scenario.json", json.dumps(doc, indent=1) + "\n")
    for line in doc.get("kernel_log") or []:
        kernel.append_kernel_line(state_dir, str(line), level=3)
    if state:
        state["scenario"] = name
        _write_atomic(state_dir / "state.json", json.dumps(state, indent=2) + "\n")
    return name


def read_scenario(state_dir: Path | str | None) -> dict[str, Any]:
    """The live scenario document of a sandbox."""
    return json.loads((resolve_state_dir(state_dir) / "scenario.json").read_text())


# --------------------------------------------------------------------------- cgroups


def _cgroup2_mount() -> Path | None:
    """Where cgroup v2 is mounted (``/sys/fs/cgroup`` or ``/sys/fs/cgroup/unified``), if anywhere."""
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split()[4])
    except OSError:
        pass
    return None


def _cgroup_leaf_path(state_dir: Path, vmid: int) -> Path | None:
    """``<cgroup2>/lxc/<vmid>/ns/orch-sandbox-<id>`` (``id`` from the state dir's path), or None
    without cgroup v2. Only computes the path: nothing is created."""
    mount = _cgroup2_mount()
    if mount is None:
        return None
    ident = hashlib.sha1(str(state_dir).encode()).hexdigest()[:10]
    return mount / "lxc" / str(vmid) / "ns" / f"orch-sandbox-{ident}"


def _cgroup_leaf(state_dir: Path, vmid: int) -> Path | None:
    """Create this sandbox's leaf for ``vmid`` (see :func:`_cgroup_leaf_path`) if it can, else None.

    Retried a few times: another sandbox's ``down`` may rmdir the shared, empty
    ``lxc/<vmid>/ns`` parent between our mkdirs (FileNotFoundError).
    """
    leaf = _cgroup_leaf_path(state_dir, vmid)
    if leaf is None:
        return None
    for _ in range(5):
        try:
            leaf.mkdir(parents=True, exist_ok=True)
            break
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return leaf if os.access(leaf / "cgroup.procs", os.W_OK) else None


def _remove_cgroup(leaf: Path, timeout_s: float = 3.0) -> bool:
    """rmdir this sandbox's ``leaf``, then ``lxc/<vmid>/ns`` and ``lxc/<vmid>`` if empty.

    Processes still in the leaf are this sandbox's by construction: they are SIGKILLed
    and the rmdir retried (EBUSY while they exit) until ``timeout_s``. The parents are
    shared with every sandbox on this machine that uses the same vmid; an rmdir of a
    cgroup with children or processes fails (EBUSY/ENOTEMPTY), which is the safe test
    that no other sandbox uses it. ``lxc`` itself goes too when empty (the sandbox
    made it). Returns False when the leaf could not be removed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            leaf.rmdir()
            break
        except FileNotFoundError:
            break
        except OSError as exc:
            if time.monotonic() >= deadline:
                log.warning("cgroup %s not removed: %s", leaf, exc)
                return False
        with contextlib.suppress(OSError):
            for pid in (leaf / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
    for path in (leaf.parent, leaf.parent.parent, leaf.parent.parent.parent):  # ns, <vmid>, lxc
        try:
            path.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # EBUSY / ENOTEMPTY: another sandbox's leaf lives below
            break
    return True


def _own_vmids(state_dir: Path, state: Mapping[str, Any]) -> list[int]:
    """The sandbox's containers: those in ``state.json`` and every ``containers/<vmid>``
    (an ``up`` that failed half-way has made and started containers but recorded none)."""
    vmids = {int(c["vmid"]) for c in state.get("containers", [])}
    with contextlib.suppress(OSError):
        vmids.update(int(p.name) for p in (state_dir / "containers").iterdir() if p.name.isdigit())
    return sorted(vmids)


def _own_cgroups(state_dir: Path, state: Mapping[str, Any]) -> list[Path]:
    """Every cgroup leaf this sandbox may have made: the recorded one and the computed
    one (:func:`_cgroup_leaf_path`) of each of its vmids."""
    leaves: list[Path] = []
    for vmid in _own_vmids(state_dir, state):
        recorded = state_dir / "containers" / str(vmid) / "cgroup"
        with contextlib.suppress(OSError):
            text = recorded.read_text().strip()
            if text:
                leaves.append(Path(text))
        computed = _cgroup_leaf_path(state_dir, vmid)
        if computed is not None and computed not in leaves:
            leaves.append(computed)
    return leaves


# --------------------------------------------------------------------------- pct helper


def run_pct(
    state_dir: Path | str, *args: str, timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run the sandbox's pct stand-in locally (as the sshd would) and return the finished process."""
    state_dir = resolve_state_dir(state_dir)
    return subprocess.run(
        [str(state_dir / "bin" / "pct"), *args],
        env=_local_env(state_dir),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def _vmid(container: str | int) -> int:
    try:
        return container if isinstance(container, int) else int(str(container).removeprefix("ct"))
    except ValueError:
        raise UsageError(
            f"not a sandbox container: {container!r} (use ct200, ct201, ... or a vmid)"
        ) from None


def start_container(state_dir: Path | str | None, container: str | int) -> None:
    """``pct start`` a sandbox container; raises SandboxError with pct's message on failure."""
    proc = run_pct(resolve_state_dir(state_dir), "start", str(_vmid(container)))
    if proc.returncode != 0:
        raise SandboxError(f"pct start {_vmid(container)}: {proc.stderr.strip()}")


def stop_container(state_dir: Path | str | None, container: str | int) -> None:
    """``pct stop``: kills every process of the container (its tmux server included)."""
    proc = run_pct(resolve_state_dir(state_dir), "stop", str(_vmid(container)))
    if proc.returncode != 0:
        raise SandboxError(f"pct stop {_vmid(container)}: {proc.stderr.strip()}")


def stop_sshd(state_dir: Path | str | None) -> bool:
    """Fault injection: kill the sandbox sshd and its open sessions, as when the host goes away.

    Returns False when it was not running. :func:`start_sshd` brings it back on the same port.
    """
    from orchestrator.sandbox import sshd

    return sshd.stop_sshd(resolve_state_dir(state_dir) / "sshd")


def start_sshd(state_dir: Path | str | None, timeout_s: float = 15.0) -> int:
    """Start the sandbox sshd again on its old port with its old keys; returns its pid.

    Raises:
        SshdError: it did not come up within ``timeout_s`` (e.g. the port was taken meanwhile).
    """
    from orchestrator.sandbox import sshd

    state_dir = resolve_state_dir(state_dir)
    state = _read_state(state_dir)
    if sshd.sshd_running(state_dir / "sshd"):
        return int(state["sshd_pid"])
    server = sshd.start_sshd(
        state_dir / "sshd",
        path_prepend=[str(state_dir / "bin")],
        env=host_env(state_dir),
        port=int(state["port"]),
        timeout_s=timeout_s,
    )
    state["sshd_pid"] = server.pid
    _write_atomic(state_dir / "state.json", json.dumps(state, indent=2) + "\n")
    return server.pid


def kill_tmux_server(state_dir: Path | str | None, container: str | int) -> int | None:
    """Fault injection: SIGKILL the container's tmux server (every session in it dies silently).

    Returns the killed server's pid, or None when no server was running.
    """
    proc = run_pct(
        resolve_state_dir(state_dir),
        "exec",
        str(_vmid(container)),
        "--",
        "tmux",
        "display-message",
        "-p",
        "#{pid}",
    )
    text = proc.stdout.strip()
    if proc.returncode != 0 or not text.isdigit():
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(text), signal.SIGKILL)
    return int(text)


# --------------------------------------------------------------------------- up / down / status


def _make_container(state_dir: Path, vmid: int, uid: int) -> Path:
    root = state_dir / "containers" / str(vmid)
    for sub in (WORKDIR, "tmp", "usr/bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    socket = root / "tmp" / f"tmux-{uid}" / "default"
    if len(str(socket)) > _UNIX_SOCKET_MAX:
        raise SandboxError(
            f"state directory too deep: the tmux socket {socket} would exceed {_UNIX_SOCKET_MAX} bytes; "
            f"use a shorter --dir"
        )
    _wrapper(root / "usr" / "bin" / "nvidia-smi", "nvidia-smi")
    _wrapper(root / "usr" / "bin" / "dmesg", "dmesg")
    _python_link(root / "usr" / "bin")
    conf = state_dir / "etc" / "pve" / "lxc" / f"{vmid}.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists():
        _write_atomic(
            conf,
            f"# orch sandbox container; its / is {root}\n"
            f"arch: amd64\ncores: 16\nhostname: ct{vmid}\nmemory: 65536\nostype: ubuntu\n"
            f"rootfs: local-lvm:vm-{vmid}-disk-0,size=200G\nswap: 0\nunprivileged: 1\n"
            f"lxc.cgroup2.devices.allow: c 195:* rwm\n",
        )
    leaf = _cgroup_leaf(state_dir, vmid)
    _write_atomic(root / "cgroup", f"{leaf or ''}\n")
    if not (root / "status").exists():
        _write_atomic(root / "status", "stopped\n")
    return root


def _hosts_yaml(
    state_dir: Path, port: int, user: str, key: Path, known: Path, vmids: list[int], gpus: int
) -> str:
    import yaml

    roles = _gpu_roles(gpus)
    doc = {
        "defaults": {"user": user, "poll_interval": 2},
        "hosts": {
            HOST_NAME: {
                "address": "127.0.0.1",
                "port": port,
                "user": user,
                "identity_file": str(key),
                "known_hosts": str(known),
            }
        },
        "containers": {
            f"ct{v}": {
                "host": HOST_NAME,
                "vmid": v,
                "workdir": str(state_dir / "containers" / str(v) / WORKDIR),
                "session": SESSION,
                "gpus": {k: list(v) for k, v in roles.items()},
            }
            for v in vmids
        },
    }
    head = (
        f"# Generated by `orch sandbox up --dir {state_dir}`: a simulated Proxmox host on this machine.\n"
        f"# Use it with: orch -c {state_dir / 'hosts.yaml'} hosts\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120)


def _info(state_dir: Path, state: Mapping[str, Any]) -> SandboxInfo:
    vmids = tuple(int(c["vmid"]) for c in state["containers"])
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
    )


def up(
    state_dir: Path | str | None = None,
    containers: int = 1,
    gpus: int = 8,
    scenario: str | Path = "healthy",
) -> SandboxInfo:
    """Start a sandbox: fake NVML, stand-ins, ``containers`` running containers (ct200...), sshd.

    Idempotent: when the sandbox in ``state_dir`` already runs, its info is returned unchanged.

    Raises:
        MissingTool: tmux, sshd, ssh-keygen or a C compiler is missing (exit 2, names the apt package).
        UsageError: bad counts or an unknown scenario.
        SandboxError / SshdError: something failed to start (the message says what).
    """
    from orchestrator.sandbox import sshd

    if not 1 <= containers <= 50:
        raise UsageError(f"--containers must be 1..50, got {containers}")
    if not 1 <= gpus <= 64:
        raise UsageError(f"--gpus must be 1..64, got {gpus}")
    state_dir = resolve_state_dir(state_dir)
    if (state_dir / "state.json").exists():
        old = _read_state(state_dir)
        if sshd.sshd_running(state_dir / "sshd"):
            log.info("sandbox in %s already runs (port %s)", state_dir, old.get("port"))
            return _info(state_dir, old)
    _check_tools()
    load_scenario(scenario)  # fail early on a bad name
    state_dir.mkdir(parents=True, exist_ok=True)
    build_fake_nvml(state_dir / "lib")
    (state_dir / "bin").mkdir(exist_ok=True)
    for name in ("pct", "dmesg", "nvidia-smi"):
        _wrapper(state_dir / "bin" / name, name)
    _wrapper(state_dir / "bin" / "journalctl", "dmesg", "--as-journalctl")
    _python_link(state_dir / "bin")

    vmids = [FIRST_VMID + i for i in range(containers)]
    uid = os.getuid()
    roots = [_make_container(state_dir, v, uid) for v in vmids]
    state: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "gpus": gpus, "containers": []}
    _write_atomic(state_dir / "state.json", json.dumps(state) + "\n")
    set_scenario(state_dir, scenario)
    if not (state_dir / kernel.KERNEL_LOG).exists():
        kernel.append_kernel_line(
            state_dir,
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.172.08  (orch sandbox)",
            level=6,
        )
    for v in vmids:
        if (state_dir / "containers" / str(v) / "status").read_text().strip() != "running":
            start_container(state_dir, v)
    probe = run_pct(state_dir, "exec", str(vmids[0]), "--", "cat", "/proc/self/cgroup")
    cgroup_ok = probe.returncode == 0 and f"/lxc/{vmids[0]}/" in probe.stdout
    if not cgroup_ok:
        log.info(
            "cgroup v2 not writable here: container processes are found by ORCH_SANDBOX_CT instead"
        )

    server = sshd.start_sshd(
        state_dir / "sshd", path_prepend=[str(state_dir / "bin")], env=host_env(state_dir)
    )
    user = server.user
    _write_atomic(
        state_dir / "hosts.yaml",
        _hosts_yaml(
            state_dir,
            server.port,
            user,
            server.client_key_path,
            server.known_hosts_path,
            vmids,
            gpus,
        ),
    )
    state = {
        "schema_version": SCHEMA_VERSION,
        "state_dir": str(state_dir),
        "port": server.port,
        "sshd_pid": server.pid,
        "identity_file": str(server.client_key_path),
        "known_hosts": str(server.known_hosts_path),
        "gpus": gpus,
        "scenario": json.loads((state_dir / "scenario.json").read_text()).get(
            "name", str(scenario)
        ),
        "cgroup": cgroup_ok,
        "started_at": time.time(),
        "containers": [
            {"name": f"ct{v}", "vmid": v, "root": str(r)} for v, r in zip(vmids, roots, strict=True)
        ],
    }
    _write_atomic(state_dir / "state.json", json.dumps(state, indent=2) + "\n")
    return _info(state_dir, state)


def _environ_has(pid: int, needles: tuple[bytes, ...], prefixes: tuple[bytes, ...]) -> bool:
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(e in needles or e.startswith(prefixes) for e in entries)


def _sandbox_processes(state_dir: Path) -> list[int]:
    """Processes started through this sandbox: host-side (ssh) and in its containers."""
    needles = (f"ORCH_SANDBOX_STATE={state_dir}".encode(),)
    prefixes = (f"ORCH_SANDBOX_CT={state_dir}:".encode(),)
    me = os.getpid()
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and int(p.name) != me and _environ_has(int(p.name), needles, prefixes)
    ]


def down(state_dir: Path | str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """Stop everything the sandbox started, by pid: containers (tmux servers too), sshd, stragglers.

    Run logs and the state directory stay. Then this sandbox's cgroup leaves go, and the
    ``lxc/<vmid>/ns`` and ``lxc/<vmid>`` parents when no other sandbox uses them (see
    :func:`_remove_cgroup`). Returns what was stopped:
    ``{"sshd": bool, "containers": [names], "killed": n}``, plus ``"cgroups_left": [paths]``
    when a leaf could not be removed (logged as a warning; none is expected).
    """
    from orchestrator.sandbox import sshd

    state_dir = resolve_state_dir(state_dir)
    state = _read_state(state_dir)
    stopped: list[str] = []
    for vmid in _own_vmids(state_dir, state):
        status_file = state_dir / "containers" / str(vmid) / "status"
        if status_file.exists() and status_file.read_text().strip() == "running":
            stop_container(state_dir, vmid)
            stopped.append(f"ct{vmid}")
    sshd_was = sshd.stop_sshd(state_dir / "sshd")
    killed = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = _sandbox_processes(state_dir)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.05)
    cgroups_left = [  # last: a straggler killed above may have sat in a leaf
        str(leaf) for leaf in _own_cgroups(state_dir, state) if not _remove_cgroup(leaf)
    ]
    result: dict[str, Any] = {"sshd": sshd_was, "containers": stopped, "killed": killed}
    if cgroups_left:
        result["cgroups_left"] = cgroups_left
    return result


def status(state_dir: Path | str | None = None) -> dict[str, Any]:
    """What runs in a sandbox: sshd, each container's status and process count, the scenario."""
    from orchestrator.sandbox import sshd

    state_dir = resolve_state_dir(state_dir)
    state = _read_state(state_dir)
    running = sshd.sshd_running(state_dir / "sshd")
    containers = []
    for c in state.get("containers", []):
        root = Path(c["root"])
        st = (root / "status").read_text().strip() if (root / "status").exists() else "unknown"
        marker = f"ORCH_SANDBOX_CT={state_dir}:{c['vmid']}".encode()
        procs = [
            p
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _environ_has(int(p.name), (marker,), ())
        ]
        containers.append(
            {
                "name": c["name"],
                "vmid": c["vmid"],
                "status": st,
                "processes": len(procs),
                "workdir": str(root / WORKDIR),
            }
        )
    try:
        scenario = read_scenario(state_dir).get("name", state.get("scenario"))
    except (OSError, ValueError):
        scenario = state.get("scenario")
    return {
        "state_dir": str(state_dir),
        "config": str(state_dir / "hosts.yaml"),
        "running": running,
        "port": state.get("port"),
        "sshd_pid": state.get("sshd_pid"),
        "scenario": scenario,
        "gpus": state.get("gpus"),
        "cgroup": state.get("cgroup"),
        "containers": containers,
    }
