"""Errors a person can act on.

Every error orch raises on purpose is an :class:`OrchError`. Each subclass is
named for a condition, keeps its facts as attributes and builds its message from
them; the message says what failed, where, and the next command to run.
``cli.py`` catches ``OrchError`` in one place, prints one ``error:`` line and
exits with :attr:`OrchError.exit_code`.

Exit codes (documented in README.md, "Exit codes", and per command in docs/commands.md):

- 1: the operation failed (a run died at launch, a command failed remotely)
- 2: bad input (hosts.yaml, playbooks, flags)
- 3: the target could not be reached (transport, host key, auth)
- 4: refused to act because it could lose data or disturb a live run (use --force)

>>> str(HostKeyUnknown("pve1", "10.1.2.6", 22, "SHA256:abc"))
'pve1 (10.1.2.6:22): host key not known (SHA256:abc); check it, then run: orch trust pve1'
>>> ConfigError("hosts.yaml", 4, "containers.lxc200.vmid", "must be an integer >= 100").exit_code
2
"""

from __future__ import annotations

from typing import Any


class OrchError(Exception):
    """Root of every error orch raises on purpose."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(OrchError):
    """A configuration file (hosts.yaml, a playbook) is malformed.

    >>> str(ConfigError("hosts.yaml", 7, "hosts.pve1.prot", "unknown key; did you mean 'port'?"))
    "hosts.yaml:7: hosts.pve1.prot: unknown key; did you mean 'port'?"
    >>> str(ConfigError("hosts.yaml", None, "", "no such file"))
    'hosts.yaml: no such file'
    """

    exit_code = 2

    def __init__(self, path: str, line: int | None, key: str, problem: str) -> None:
        self.path, self.line, self.key, self.problem = path, line, key, problem
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {key}: {problem}" if key else f"{where}: {problem}")


class UsageError(OrchError):
    """A flag or argument is wrong (exit code 2)."""

    exit_code = 2


class TransportError(OrchError):
    """The transport to a host failed: nothing is known about the remote side."""

    exit_code = 3


class HostUnreachable(TransportError):
    """The host could not be reached (refused, timed out, reset, DNS).

    >>> str(HostUnreachable("pve1", "connection refused"))
    'pve1: unreachable: connection refused; check the host is up and sshd runs (orch doctor pve1)'
    """

    def __init__(self, host: str, reason: str) -> None:
        self.host, self.reason = host, reason
        super().__init__(
            f"{host}: unreachable: {reason}; check the host is up and sshd runs (orch doctor {host})"
        )


class HostKeyUnknown(TransportError):
    """The host's key is not in known_hosts; orch refuses to guess."""

    def __init__(self, host: str, address: str, port: int, fingerprint: str) -> None:
        self.host, self.address, self.port, self.fingerprint = host, address, port, fingerprint
        super().__init__(
            f"{host} ({address}:{port}): host key not known ({fingerprint}); "
            f"check it, then run: orch trust {host}"
        )


class HostKeyChanged(TransportError):
    """The host presented a key different from the one recorded: possible MITM.

    >>> str(HostKeyChanged("pve1", "10.1.2.6", 22, "SHA256:new", "/root/.ssh/known_hosts", 3))
    ... # doctest: +NORMALIZE_WHITESPACE
    'pve1 (10.1.2.6:22): HOST KEY CHANGED (now SHA256:new): someone may be intercepting the
    connection (man-in-the-middle), or the host was reinstalled. Refusing to connect. If the change
    is expected, remove line 3 of /root/.ssh/known_hosts and run: orch trust pve1'
    """

    def __init__(
        self,
        host: str,
        address: str,
        port: int,
        fingerprint: str,
        known_hosts: str,
        line: int | None,
    ) -> None:
        self.host, self.address, self.port = host, address, port
        self.fingerprint, self.known_hosts, self.line = fingerprint, known_hosts, line
        where = f"line {line} of {known_hosts}" if line else f"its entry in {known_hosts}"
        super().__init__(
            f"{host} ({address}:{port}): HOST KEY CHANGED (now {fingerprint}): someone may be "
            f"intercepting the connection (man-in-the-middle), or the host was reinstalled. "
            f"Refusing to connect. If the change is expected, remove {where} and run: orch trust {host}"
        )


class HostKeyRevoked(TransportError):
    """The host presented a key known_hosts marks ``@revoked``: refused, as OpenSSH does.

    >>> str(HostKeyRevoked("pve1", "10.1.2.6", 22, "SHA256:k", "/root/.ssh/known_hosts", 4))
    ... # doctest: +NORMALIZE_WHITESPACE
    'pve1 (10.1.2.6:22): HOST KEY REVOKED (SHA256:k is marked @revoked on line 4 of
    /root/.ssh/known_hosts). Refusing to connect: the host must get a new key; then run: orch trust pve1'
    """

    def __init__(
        self, host: str, address: str, port: int, fingerprint: str, known_hosts: str, line: int
    ) -> None:
        self.host, self.address, self.port = host, address, port
        self.fingerprint, self.known_hosts, self.line = fingerprint, known_hosts, line
        super().__init__(
            f"{host} ({address}:{port}): HOST KEY REVOKED ({fingerprint} is marked @revoked on "
            f"line {line} of {known_hosts}). Refusing to connect: the host must get a new key; "
            f"then run: orch trust {host}"
        )


class AuthFailed(TransportError):
    """SSH authentication failed. Names the key file, never a secret."""

    def __init__(self, host: str, user: str, detail: str) -> None:
        self.host, self.user, self.detail = host, user, detail
        super().__init__(
            f"{host}: authentication failed for user {user!r}: {detail}; "
            f"check identity_file in hosts.yaml or run ssh-add"
        )


class CommandTimeout(TransportError):
    """A remote command did not finish within its deadline (it may still run there).

    >>> str(CommandTimeout("pve1", "pct status 200", 10.0))
    "pve1: command timed out after 10.0 s (it may still be running there): 'pct status 200'"
    """

    def __init__(self, host: str, command: str, timeout_s: float) -> None:
        self.host, self.command, self.timeout_s = host, command, timeout_s
        super().__init__(
            f"{host}: command timed out after {timeout_s} s (it may still be running there): "
            f"{command!r}"
        )


class CommandFailed(OrchError):
    """A helper command orch itself needed (write a file, ``pct push``) failed remotely (exit 1).

    >>> str(CommandFailed("pve1", "pct push 200 /tmp/x /root/a", 255, "failed to create file"))
    "pve1: command failed (exit 255): 'pct push 200 /tmp/x /root/a': failed to create file"
    """

    def __init__(self, host: str, command: str, exit_status: int | None, stderr: str) -> None:
        self.host, self.command, self.exit_status, self.stderr = host, command, exit_status, stderr
        status = "unknown" if exit_status is None else str(exit_status)
        detail = stderr.strip().splitlines()[-1][:300] if stderr.strip() else "no error output"
        super().__init__(f"{host}: command failed (exit {status}): {command!r}: {detail}")


class OutputTooLarge(OrchError):
    """A command printed a line longer than orch agreed to read; orch discarded it (exit 1).

    >>> str(OutputTooLarge("ct200", "python3 -m orchestrator.agent stream", 8388608))
    "ct200: output of 'python3 -m orchestrator.agent stream' exceeds 8388608 bytes; orch discarded it"
    """

    def __init__(self, host: str, command: str, limit_bytes: int) -> None:
        self.host, self.command, self.limit_bytes = host, command, limit_bytes
        super().__init__(
            f"{host}: output of {command!r} exceeds {limit_bytes} bytes; orch discarded it"
        )


class ContainerError(OrchError):
    """Something about the LXC container itself."""


class ContainerNotRunning(ContainerError):
    """``pct`` says the container exists but is stopped.

    >>> str(ContainerNotRunning("pve1", 200))
    "pve1: container 200 is not running; start it with: ssh pve1 'pct start 200'"
    """

    def __init__(self, host: str, vmid: int) -> None:
        self.host, self.vmid = host, vmid
        super().__init__(
            f"{host}: container {vmid} is not running; start it with: ssh {host} 'pct start {vmid}'"
        )


class ContainerNotFound(ContainerError):
    """``pct`` has no configuration for this vmid on the host.

    >>> str(ContainerNotFound("pve1", 201))
    'pve1: container 201 does not exist (no /etc/pve/lxc/201.conf); check vmid in hosts.yaml'
    """

    def __init__(self, host: str, vmid: int) -> None:
        self.host, self.vmid = host, vmid
        super().__init__(
            f"{host}: container {vmid} does not exist (no /etc/pve/lxc/{vmid}.conf); "
            f"check vmid in hosts.yaml"
        )


class AgentError(OrchError):
    """The in-container agent failed or answered something we cannot read."""


class PythonTooOld(AgentError):
    """The interpreter there runs but is older than the agent needs (3.10); the message says
    what was found and what to do. On a Proxmox host, orch then observes from inside."""


class AgentProtocolError(AgentError):
    """The agent's answer is not a snapshot we understand (garbage, truncated, future schema).

    >>> str(AgentProtocolError("lxc200", "truncated JSON line (41 bytes)"))
    'lxc200: agent protocol error: truncated JSON line (41 bytes)'
    """

    def __init__(self, target: str, detail: str) -> None:
        self.target, self.detail = target, detail
        super().__init__(f"{target}: agent protocol error: {detail}")


class AgentRefused(AgentError):
    """An agent command ran and said no: its answer was ``{"ok": false, "error": KIND,
    "message": ...}`` (a bad argument, no such run, a live session in the way). ``kind`` is the
    agent's word for it, ``said`` its message (``None`` when it sent none), ``doc`` the whole
    answer (with the facts it adds, e.g. ``run_dir``).

    >>> exc = AgentRefused("ct200", "stop", {"ok": False, "error": "no-run", "message": "no runs"})
    >>> str(exc), exc.kind, exc.said
    ('ct200: stop: no runs', 'no-run', 'no runs')
    """

    def __init__(self, target: str, command: str, doc: dict[str, Any]) -> None:
        self.target, self.command, self.doc = target, command, doc
        self.kind = str(doc.get("error") or "")
        said = doc.get("message")
        self.said = None if said is None else str(said)
        super().__init__(f"{target}: {command}: {self.said or self.kind or 'refused'}")


class Refused(OrchError):
    """orch refused an action that could lose data or disturb a live run (exit 4)."""

    exit_code = 4


class LaunchFailed(OrchError):
    """A launch started, but the run did not come up (exit 1)."""


class LaunchInterrupted(OrchError):
    """Ctrl-C during ``orch launch``; the message says what was left behind and the command
    that undoes it (exit 130, as for SIGINT)."""

    exit_code = 130
