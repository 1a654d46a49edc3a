"""Run inside an LXC container through the Proxmox host's ``pct`` (wraps a host transport).

Traps of real ``pct`` (pve-container's pct.pm, pve-common's CLIHandler.pm and
RESTEnvironment.pm, lxc-attach) handled here:

- options are parsed by Getopt::Long, so ``pct exec VMID -- argv`` needs the ``--``;
- ``pct exec`` runs argv without a shell and without a login profile (callers that
  want one say ``bash -lc``);
- pct forces ``PATH=/sbin:/bin:/usr/sbin:/usr/bin`` (no ``/usr/local/bin``: pip's
  ``torchrun`` is "command not found") and then, ``--keep-env`` being the default
  (``--keep-env 0`` only exists since pve-container 5.0.9), hands the host's whole
  environment (``SSH_*``, ``XDG_*``, ...) to the command: orch runs every command
  under ``env -i`` with an explicit environment, :data:`BASE_ENV` under the
  container's ``env`` from hosts.yaml under the call's own; that ``env -i K=V`` is
  argv, which ``ps`` shows to everyone on the host and in the container, so
  secret-looking names (:func:`~orchestrator.wire.secrets.is_secret_name`) are left out
  of it: they reach a run only through ``orch launch``'s stdin;
- exit codes pass through, 128+N for a signal; pct's own failures are a Perl ``die``
  whose exit status is ``$!`` when set (2 for a missing config) else 255, so they
  are recognised by their message, whatever the status, as
  :class:`ContainerNotRunning` / :class:`ContainerNotFound`;
- neither a closed channel nor a killed ``pct exec`` stops the command (lxc-attach
  forwards no signal without a pty), so every bounded command runs under
  ``timeout -k`` inside the container, in its own process group (:func:`deadline`);
- ``pct push`` needs the source on the host and an existing parent directory, and
  drops the exec bit unless ``--perms``; it exits 0 when the copy fails (the error
  is only on stderr); pushes to one container serialize on its config lock, so orch
  serializes them too (one lock per container).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence

from orchestrator.errors import CommandFailed, ContainerNotFound, ContainerNotRunning
from orchestrator.transport.base import LineStream, Result, Transport
from orchestrator.wire.formats import parse_pct_lock, parse_pct_status
from orchestrator.wire.quoting import command_line, with_env
from orchestrator.wire.secrets import is_secret_name

HOST_TMP_DIR = "/tmp"
# what every command in a container gets (a Debian root login's PATH), before hosts.yaml's env
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}
DEADLINE_SLACK_S = 1.0  # the in-container deadline fires after orch's own: orch reports the timeout
KILL_GRACE_S = 2.0  # SIGKILL this long after the deadline's SIGTERM

_push_locks: dict[tuple[str, int], threading.Lock] = {}
_push_locks_guard = threading.Lock()


def pct_failure(stderr: str, vmid: int) -> str | None:
    """Which pct-level failure ``stderr`` reports: ``"not-running"``, ``"not-found"`` or ``None``.

    >>> pct_failure("container '200' not running!\\n", 200)
    'not-running'
    >>> pct_failure("Configuration file 'nodes/pve1/lxc/201.conf' does not exist\\n", 201)
    'not-found'
    >>> pct_failure("can only push files to a running CT\\n", 200)
    'not-running'
    >>> pct_failure("container '200' not running!", 201) is None
    True
    """
    if re.search(rf"^container '{vmid}' not running!$", stderr, re.M) or re.search(
        r"^can only (push|pull) files (to|from) a running (CT|VM)", stderr, re.M
    ):
        return "not-running"
    if re.search(
        rf"^Configuration file 'nodes/[^/']+/lxc/{vmid}\.conf' does not exist$", stderr, re.M
    ):
        return "not-found"
    return None


def deadline(argv: Sequence[str], timeout_s: float) -> list[str]:
    """``argv`` under a deadline enforced inside the container: ``timeout`` makes its own
    process group, SIGTERMs it :data:`DEADLINE_SLACK_S` after orch gave up waiting and
    SIGKILLs it :data:`KILL_GRACE_S` later, children included.

    >>> deadline(["nvidia-smi", "-L"], 30)
    ['timeout', '-k', '2', '31', 'nvidia-smi', '-L']
    >>> deadline(["true"], 0.25)
    ['timeout', '-k', '2', '1.25', 'true']
    """
    return ["timeout", "-k", f"{KILL_GRACE_S:g}", f"{timeout_s + DEADLINE_SLACK_S:g}", *argv]


class PctTransport(Transport):
    """Commands inside container ``vmid`` on the host reached by ``host``.

    Args:
        host: the transport to the Proxmox host (usually the pooled SshTransport).
        vmid: the container id (>= 100).
        name: what messages call the container (the hosts.yaml name).
        env: variables every command gets (the container's ``env`` in hosts.yaml), laid
            over :data:`BASE_ENV`; per-call ``env`` is laid over them. Nothing else of
            the host's environment reaches the command. Secret-looking names are dropped
            here: their values would be on ``pct exec``'s command line.
    """

    def __init__(
        self,
        host: Transport,
        vmid: int,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host, self.vmid = host, int(vmid)
        self.name = name or f"{host.name}/{vmid}"
        self.env = {k: v for k, v in (env or {}).items() if not is_secret_name(k)}

    def argv(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """The host-side argv for ``argv`` run in the container (under :func:`deadline`
        when ``timeout`` is given).

        >>> from orchestrator.transport.local import LocalTransport
        >>> PctTransport(LocalTransport(), 200, env={"LANG": "de_DE.UTF-8"}).argv(["tmux", "ls"], {"A": "1"})[4:]
        ['env', '-i', 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root', 'LANG=de_DE.UTF-8', 'A=1', 'tmux', 'ls']
        >>> PctTransport(LocalTransport(), 200, env={"HF_TOKEN": "hf_x"}).argv(["true"])[-2:]
        ['LANG=C.UTF-8', 'true']
        >>> PctTransport(LocalTransport(), 200).argv(["true"], timeout=5)[:8]
        ['pct', 'exec', '200', '--', 'timeout', '-k', '2', '6']
        """
        command_line(argv)  # validates before anything is sent
        inner = with_env(argv, {**BASE_ENV, **self.env, **(env or {})}, clear=True)
        if timeout is not None:
            inner = deadline(inner, timeout)
        return ["pct", "exec", str(self.vmid), "--", *inner]

    def _raise_for_pct(self, result: Result) -> None:
        """Raise what pct's own failure means; by its message, whatever its exit status."""
        if result.exit_status == 0:
            return
        failure = pct_failure(result.err, self.vmid)
        if failure == "not-running":
            raise ContainerNotRunning(self.host.name, self.vmid)
        if failure == "not-found":
            raise ContainerNotFound(self.host.name, self.vmid)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 30.0,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> Result:
        """Run ``argv`` in the container (no shell); exit codes pass through.

        The command is gone from the container at most ``timeout`` + :data:`DEADLINE_SLACK_S`
        + :data:`KILL_GRACE_S` seconds after it started, whatever happens to the channel.
        ``max_output_bytes`` bounds stdout as in :meth:`Transport.run` (the host transport
        cuts ``pct exec``'s output, which is the command's).

        Raises:
            ContainerNotRunning, ContainerNotFound: pct refused (by its message).
            TransportError: from the host transport (timeout, unreachable, host key).
        """
        result = self.host.run(
            self.argv(argv, env, timeout),
            timeout=timeout,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
        )
        self._raise_for_pct(result)
        return result

    def stream(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        max_line_bytes: int | None = None,
    ) -> LineStream:
        """``pct exec`` under the host's stream; pct's own refusal surfaces when it ends."""
        inner = self.host.stream(self.argv(argv, env), max_line_bytes=max_line_bytes)
        return _PctLineStream(self, inner)

    def status(self, timeout: float = 15.0) -> str:
        """``pct status VMID``: ``running``, ``stopped``, ... ; raises ContainerNotFound."""
        result = self.host.run(["pct", "status", str(self.vmid)], timeout=timeout)
        self._raise_for_pct(result)
        if not result.ok:
            raise CommandFailed(
                self.host.name, f"pct status {self.vmid}", result.exit_status, result.err
            )
        return parse_pct_status(result.out)

    def status_lock(self, timeout: float = 15.0) -> tuple[str, str | None]:
        """``pct status VMID --verbose``: (status, lock or ``None``); a container vzdump is
        backing up in stop mode is ``("stopped", "backup")``. Raises as :meth:`status`."""
        result = self.host.run(["pct", "status", str(self.vmid), "--verbose"], timeout=timeout)
        self._raise_for_pct(result)
        if not result.ok:
            raise CommandFailed(
                self.host.name, f"pct status {self.vmid} --verbose", result.exit_status, result.err
            )
        return parse_pct_status(result.out), parse_pct_lock(result.out)

    def _push_lock(self) -> threading.Lock:
        with _push_locks_guard:
            return _push_locks.setdefault((self.host.name, self.vmid), threading.Lock())

    def put(self, data: bytes, path: str, *, mode: int = 0o644, timeout: float = 60.0) -> None:
        """Write ``data`` to ``path`` in the container, atomically, with mode ``mode``.

        Stages the bytes in a host temp file (pct push reads its source on the host),
        pushes to a temp name beside ``path`` with ``--perms`` (pct push drops the exec
        bit otherwise), renames it into place inside the container, and always removes
        the host temp file. The parent directory must exist. pct push exits 0 when the
        copy fails: the rename then finds no file, and push's stderr is the error.

        Raises:
            ContainerNotRunning, ContainerNotFound: as for :meth:`run`.
            CommandFailed: pct push or the rename failed (no parent directory, ...).
        """
        token = uuid.uuid4().hex[:12]
        host_tmp = f"{HOST_TMP_DIR}/orch-push-{self.vmid}-{token}"
        ct_tmp = f"{path}.orch-tmp-{token}"
        self.host.put(data, host_tmp, mode=0o600)
        try:
            with self._push_lock():
                push = ["pct", "push", str(self.vmid), host_tmp, ct_tmp, "--perms", f"{mode:04o}"]
                result = self.host.run(push, timeout=timeout)
            self._raise_for_pct(result)
            if not result.ok:
                raise CommandFailed(
                    self.host.name, command_line(push), result.exit_status, result.err
                )
            moved = self.run(["mv", "-f", ct_tmp, path], timeout=timeout)
            if not moved.ok:
                self.run(["rm", "-f", ct_tmp], timeout=timeout)
                if result.err.strip():  # the copy failed; pct push said why and exited 0
                    raise CommandFailed(self.host.name, command_line(push), 0, result.err)
                raise CommandFailed(
                    self.name, f"mv -f {ct_tmp} {path}", moved.exit_status, moved.err
                )
        finally:
            self.host.run(["rm", "-f", host_tmp], timeout=timeout)

    def close(self) -> None:
        """The host transport is shared (pooled); closing a container leaves it open."""

    def __repr__(self) -> str:
        return f"PctTransport({self.host!r}, vmid={self.vmid})"


class _PctLineStream(LineStream):
    """A host LineStream of ``pct exec``; raises ContainerNotRunning/NotFound at its end
    when that is why it ended."""

    def __init__(self, owner: PctTransport, inner: LineStream) -> None:
        self._owner, self._inner = owner, inner

    @property
    def dropped(self) -> bool:
        return bool(getattr(self._inner, "dropped", False))

    def readline(self, timeout: float) -> str | None:
        line = self._inner.readline(timeout)
        if line is None:
            self.exit_status, self.stderr_tail = self._inner.exit_status, self._inner.stderr_tail
            self._owner._raise_for_pct(Result(self.exit_status, b"", self.stderr_tail))
        return line

    def __iter__(self) -> Iterator[str]:
        while (line := self.readline(timeout=365 * 86400.0)) is not None:
            yield line

    def close(self) -> None:
        self._inner.close()
        self.exit_status, self.stderr_tail = self._inner.exit_status, self._inner.stderr_tail
