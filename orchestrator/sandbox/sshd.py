"""A real OpenSSH ``sshd`` on 127.0.0.1, run as the current user, for the sandbox and tests.

Everything lives in one state directory (absolute paths: sshd refuses relative
ones): its own ed25519 host key, a client key with its ``authorized_keys``, a
``known_hosts`` holding the host key as ``[127.0.0.1]:PORT``, ``sshd_config``,
the pid file and the log. Keys are reused when the directory already holds them,
so a restarted sshd presents the same host key (and may keep the same port).

Equivalent by hand::

    ssh-keygen -t ed25519 -N '' -f DIR/ssh_host_ed25519_key
    /usr/sbin/sshd -D -e -f DIR/sshd_config 2>>DIR/sshd.log &
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent.procs import alive, descendants, read_pid_file
from orchestrator.errors import OrchError

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = "/run/sshd"
HOST = "127.0.0.1"


class SshdError(OrchError):
    """The sandbox sshd could not be started or stopped (the message carries its log tail)."""


@dataclass(frozen=True, slots=True)
class Sshd:
    """A running sandbox sshd; every path is absolute."""

    port: int
    pid: int
    host_key_path: Path
    host_key_line: str
    client_key_path: Path
    known_hosts_path: Path
    user: str
    log_path: Path
    state_dir: Path

    @property
    def pid_path(self) -> Path:
        return self.state_dir / "sshd.pid"

    @property
    def config_path(self) -> Path:
        return self.state_dir / "sshd_config"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path, comment: str) -> None:
    """Create an ed25519 key pair at ``path`` (+ ``.pub``) unless it exists."""
    if path.exists() and path.with_suffix(".pub").exists():
        return
    for stale in (path, path.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    path.chmod(0o600)


def _setenv_value(key: str, value: str) -> str:
    """One ``SetEnv`` word; sshd_config words cannot carry quotes or newlines."""
    if not key or "=" in key or not (key[0].isalpha() or key[0] == "_"):
        raise ValueError(f"not a valid environment variable name: {key!r}")
    if any(c in value for c in '"\n\r\\'):
        raise ValueError(f"sshd SetEnv cannot carry quotes, backslashes or newlines: {key}")
    return f'"{key}={value}"'


def _config(
    state_dir: Path,
    port: int,
    path_prepend: Sequence[str],
    env: Mapping[str, str],
    address: str = HOST,
) -> str:
    base_path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    path = ":".join([*(str(Path(p).absolute()) for p in path_prepend), base_path])
    # SHLVL=1: Debian's bash sources ~/.bashrc for ssh commands only at shell level < 2;
    # this machine's rc files (pyenv init: ~100 ms, PATH rewrites) are no part of a Proxmox host
    merged = {"SHLVL": "1", **env, "PATH": path}
    setenv = [_setenv_value(k, v) for k, v in merged.items()]
    lines = [
        f"ListenAddress {address}:{port}",
        f"HostKey {state_dir / 'ssh_host_ed25519_key'}",
        f"AuthorizedKeysFile {state_dir / 'authorized_keys'}",
        f"PidFile {state_dir / 'sshd.pid'}",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "PermitUserEnvironment no",
        "AllowTcpForwarding yes",
        "X11Forwarding no",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "MaxSessions 10",
        "MaxStartups 100:30:200",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
        "SetEnv " + " ".join(setenv),
    ]
    return "\n".join(lines) + "\n"


def _port_open(port: int, address: str = HOST) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as sock:
            sock.settimeout(0.5)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _log_tail(log_path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_sshd(
    state_dir: Path,
    *,
    path_prepend: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout_s: float = 15.0,
    address: str = HOST,
    netns: str | None = None,
) -> Sshd:
    """Start sshd in ``state_dir`` and wait (up to ``timeout_s``) until it answers with its banner.

    Args:
        state_dir: created if missing; keys already there are reused.
        path_prepend: directories placed first on PATH for remote commands (``SetEnv``).
        env: extra variables for every remote command (values without quotes/newlines).
        port: listen here (e.g. to restart on the same port); ``None`` picks a free one.
        timeout_s: seconds to wait for the banner.
        address: listen address (default 127.0.0.1); with ``netns``, one of that namespace's
            addresses that this namespace can reach (the reliability tests' veth pair).
        netns: run sshd inside this network namespace (``ip netns exec NS``; needs root).
            ``port`` must then be given: the free-port probe only sees this namespace.

    Raises:
        SshdError: sshd exited or did not answer in time; the message carries its log tail.
    """
    state_dir = Path(state_dir).absolute()
    state_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    user = pwd.getpwuid(os.getuid()).pw_name
    host_key, client_key = state_dir / "ssh_host_ed25519_key", state_dir / "id_ed25519"
    _keygen(host_key, "orch-sandbox-host")
    _keygen(client_key, "orch-sandbox-client")
    (state_dir / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    host_pub = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
    log_path = state_dir / "sshd.log"

    attempts = 1 if port is not None else 3
    for _ in range(attempts):
        use_port = port if port is not None else _free_port()
        config = state_dir / "sshd_config"
        config.write_text(_config(state_dir, use_port, path_prepend, env or {}, address))
        prefix = ["ip", "netns", "exec", netns] if netns else []
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [*prefix, SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                close_fds=True,
            )
        deadline = time.monotonic() + timeout_s
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and not _port_open(use_port, address)
        ):
            time.sleep(0.05)
        if proc.poll() is None and _port_open(use_port, address):
            line = f"[{address}]:{use_port} {host_pub}"
            known_hosts = state_dir / "known_hosts"
            known_hosts.write_text(line + "\n")
            known_hosts.chmod(0o600)
            return Sshd(
                port=use_port,
                pid=proc.pid,
                host_key_path=host_key,
                host_key_line=line,
                client_key_path=client_key,
                known_hosts_path=known_hosts,
                user=user,
                log_path=log_path,
                state_dir=state_dir,
            )
        if proc.poll() is None:
            _terminate(proc.pid, 5.0)
            raise SshdError(
                f"sshd did not answer on port {use_port} within {timeout_s} s: "
                f"{_log_tail(log_path)}"
            )
        if "Address already in use" not in _log_tail(log_path, 4):
            break
    raise SshdError(f"sshd exited at start (status {proc.returncode}): {_log_tail(log_path)}")


def _read_pid(target: Sshd | Path | str) -> int | None:
    if isinstance(target, Sshd):
        return target.pid
    path = Path(target)
    if path.is_dir():
        path = path / "sshd.pid"
    return read_pid_file(str(path))


def _alive(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) sshd; reaps it when it is our exited child."""
    with contextlib.suppress(ChildProcessError, OSError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sshd" in cmdline and alive(pid)


def sshd_running(target: Sshd | Path | str) -> bool:
    """Whether the sshd of ``target`` (an :class:`Sshd`, its pid file or state dir) is alive."""
    pid = _read_pid(target)
    return pid is not None and _alive(pid)


def _terminate(pid: int, timeout_s: float) -> None:
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)


def stop_sshd(target: Sshd | Path | str, timeout_s: float = 5.0, *, sessions: bool = True) -> bool:
    """Stop the sshd of ``target`` (SIGTERM, then SIGKILL after ``timeout_s``), by pid.

    With ``sessions`` (default) the per-connection sshd processes below it are
    SIGKILLed first, so open connections drop as when the host goes away; without
    it they live on until they end, as with a real ``systemctl restart ssh``.

    Returns:
        True if an sshd was running and is now stopped; False if none was running.
    """
    pid = _read_pid(target)
    if pid is None or not _alive(pid):
        return False
    if sessions:
        for child in descendants(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
    _terminate(pid, timeout_s)
    return True
