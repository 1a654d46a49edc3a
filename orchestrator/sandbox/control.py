"""Driving a sandbox's parts from this machine: its pct (as the sshd would run it), its
containers and its sshd, for ``up``/``down`` and for fault injection (tests/reliability)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from orchestrator.sandbox import lxc
from orchestrator.sandbox.info import vmid_of
from orchestrator.sandbox.state import (
    HOST_NAME,
    SandboxError,
    host_env,
    read_state,
    resolve_state_dir,
    write_state,
)


def _local_env(state_dir: Path, host: str | None = None) -> dict[str, str]:
    from orchestrator.sandbox.hosts import node_env

    env = dict(os.environ)
    env.update(node_env(state_dir, host) if host else host_env(state_dir))
    env["PATH"] = f"{state_dir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def run_pct(
    state_dir: Path | str, *args: str, timeout_s: float = 30.0, host: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the sandbox's pct stand-in locally (as ``host``'s sshd would: its environment, cwd
    ``~``; default: the first host's)."""
    state_dir = resolve_state_dir(state_dir)
    return subprocess.run(
        [str(state_dir / "bin" / "pct"), *args],
        env=_local_env(state_dir, host),
        cwd=os.path.expanduser("~"),  # where an ssh session starts
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def host_of(state_dir: Path, container: str | int) -> str | None:
    """The simulated host container ``container`` is on (``None``: unknown here)."""
    vmid = vmid_of(container)
    try:
        rows = read_state(state_dir).get("containers") or []
    except SandboxError:
        return None
    return next((str(c["host"]) for c in rows if int(c["vmid"]) == vmid and c.get("host")), None)


def start_container(state_dir: Path | str | None, container: str | int) -> None:
    """``pct start`` a sandbox container (on its host); raises SandboxError with pct's message."""
    state_dir = resolve_state_dir(state_dir)
    proc = run_pct(state_dir, "start", str(vmid_of(container)), host=host_of(state_dir, container))
    if proc.returncode != 0:
        raise SandboxError(f"pct start {vmid_of(container)}: {proc.stderr.strip()}")


def stop_container(state_dir: Path | str | None, container: str | int) -> None:
    """``pct stop``: kills every process of the container (its tmux server included)."""
    state_dir = resolve_state_dir(state_dir)
    proc = run_pct(state_dir, "stop", str(vmid_of(container)), host=host_of(state_dir, container))
    if proc.returncode != 0:
        raise SandboxError(f"pct stop {vmid_of(container)}: {proc.stderr.strip()}")


def stop_sshd(state_dir: Path | str | None, host: str | None = None) -> bool:
    """Fault injection: kill a host's sshd (default the first host's) and its open sessions, as
    when the host goes away.

    Returns False when it was not running. :func:`start_sshd` brings it back on the same port.
    """
    from orchestrator.sandbox import sshd
    from orchestrator.sandbox.hosts import sshd_dir

    return sshd.stop_sshd(sshd_dir(resolve_state_dir(state_dir), host or HOST_NAME))


def start_sshd(
    state_dir: Path | str | None, timeout_s: float = 15.0, host: str | None = None
) -> int:
    """Start a host's sshd (default the first host's) again on its old port with its old keys;
    returns its pid.

    Raises:
        SshdError: it did not come up within ``timeout_s`` (e.g. the port was taken meanwhile).
    """
    from orchestrator.sandbox import sshd
    from orchestrator.sandbox.hosts import node_env, sshd_dir

    state_dir = resolve_state_dir(state_dir)
    state = read_state(state_dir)
    host = host or HOST_NAME
    rows = state.get("hosts") or [{"name": HOST_NAME, "port": state["port"]}]
    row = next((h for h in rows if h["name"] == host), None)
    if row is None:
        raise SandboxError(f"no host {host!r} in the sandbox in {state_dir}")
    where = sshd_dir(state_dir, host)
    if sshd.sshd_running(where):
        return int(row.get("sshd_pid") or state["sshd_pid"])
    server = sshd.start_sshd(
        where,
        path_prepend=[str(state_dir / "bin")],
        env=node_env(state_dir, host) if state.get("hosts") else host_env(state_dir),
        port=int(row["port"]),
        timeout_s=timeout_s,
    )
    row["sshd_pid"] = server.pid
    if host == HOST_NAME:
        state["sshd_pid"] = server.pid
    write_state(state_dir, state)
    return server.pid


def kill_tmux_server(state_dir: Path | str | None, container: str | int) -> int | None:
    """Fault injection: SIGKILL the container's tmux server (every session in it dies silently).

    Returns the killed server's host pid, or None when no server was running.
    """
    state_dir = resolve_state_dir(state_dir)
    vmid = vmid_of(container)
    proc = run_pct(
        state_dir,
        "exec",
        str(vmid),
        "--",
        "tmux",
        "display-message",
        "-p",
        "#{pid}",
        host=host_of(state_dir, vmid),
    )
    text = proc.stdout.strip()
    if proc.returncode != 0 or not text.isdigit():
        return None
    pid: int | None = int(text)
    if read_state(state_dir).get("isolation") == "lxc":
        pid = lxc.host_pid(state_dir, vmid, int(text))
    if pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return pid


def reboot(state_dir: Path | str | None, *, at_s: float | None = None) -> str:
    """Fault injection: the host reboots. Every container stops (and every process in it), the
    kernel log starts a new boot (dmesg forgets the old one; ``journalctl -k -b -1`` keeps it),
    and the containers start again (``onboot``), with empty ``/tmp``. The run directories
    stay, as on a real host. Returns the new boot's id.
    """
    from orchestrator.sandbox import kernel

    state_dir = resolve_state_dir(state_dir)
    vmids = [int(c["vmid"]) for c in read_state(state_dir)["containers"]]
    for vmid in vmids:
        run_pct(state_dir, "stop", str(vmid))
    boot_id = kernel.reboot(state_dir, at_s=at_s)
    for vmid in vmids:
        start_container(state_dir, vmid)
    return boot_id
