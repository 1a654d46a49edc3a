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
    SandboxError,
    host_env,
    read_state,
    resolve_state_dir,
    write_state,
)


def _local_env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(host_env(state_dir))
    env["PATH"] = f"{state_dir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def run_pct(
    state_dir: Path | str, *args: str, timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run the sandbox's pct stand-in locally (as the sshd would: its environment, cwd ``~``)."""
    state_dir = resolve_state_dir(state_dir)
    return subprocess.run(
        [str(state_dir / "bin" / "pct"), *args],
        env=_local_env(state_dir),
        cwd=os.path.expanduser("~"),  # where an ssh session starts
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def start_container(state_dir: Path | str | None, container: str | int) -> None:
    """``pct start`` a sandbox container; raises SandboxError with pct's message on failure."""
    proc = run_pct(resolve_state_dir(state_dir), "start", str(vmid_of(container)))
    if proc.returncode != 0:
        raise SandboxError(f"pct start {vmid_of(container)}: {proc.stderr.strip()}")


def stop_container(state_dir: Path | str | None, container: str | int) -> None:
    """``pct stop``: kills every process of the container (its tmux server included)."""
    proc = run_pct(resolve_state_dir(state_dir), "stop", str(vmid_of(container)))
    if proc.returncode != 0:
        raise SandboxError(f"pct stop {vmid_of(container)}: {proc.stderr.strip()}")


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
    state = read_state(state_dir)
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
    write_state(state_dir, state)
    return server.pid


def kill_tmux_server(state_dir: Path | str | None, container: str | int) -> int | None:
    """Fault injection: SIGKILL the container's tmux server (every session in it dies silently).

    Returns the killed server's host pid, or None when no server was running.
    """
    state_dir = resolve_state_dir(state_dir)
    vmid = vmid_of(container)
    proc = run_pct(state_dir, "exec", str(vmid), "--", "tmux", "display-message", "-p", "#{pid}")
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
