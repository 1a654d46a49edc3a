"""A ProxyCommand as the connection's socket, and paramiko's thread kept from printing
tracebacks of failures orch already reports as one error.

paramiko's transport thread logs every exception that ends it ("Exception (client): ...")
at ERROR, traceback included, before ``start_client`` raises it; orch translates the raised
one (:mod:`orchestrator.transport.ssh`). Those records are shown only at ``-vv`` (debug).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import subprocess

from orchestrator.errors import HostUnreachable
from orchestrator.transport.ssh_config import Endpoint
from orchestrator.transport.sshlib import paramiko


class _OnlyWhenDebugging(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or logging.getLogger().isEnabledFor(logging.DEBUG)


_FILTER = _OnlyWhenDebugging()


def quiet_paramiko() -> None:
    """Install the filter on paramiko's transport logger (idempotent)."""
    logger = logging.getLogger("paramiko.transport")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


STDERR_TAIL_BYTES = 2048


class _ProxyCommand(paramiko.ProxyCommand):
    """paramiko's ProxyCommand, but recv works like a socket's: it returns what is there,
    and the command's end of output is EOF at once (paramiko's spins until its timeout)."""

    def recv(self, size: int) -> bytes:
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError()  # socket.timeout: paramiko reads again
        data = os.read(stdout.fileno(), size)
        if data:
            return data
        raise EOFError(f"ProxyCommand closed the connection{self._why()}")

    def close(self) -> None:
        """SIGTERM, reaped (SIGKILL after 2 s), pipes closed (paramiko's only signals)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def _why(self) -> str:
        err = self.process.stderr
        said = ""
        if err is not None and select.select([err], [], [], 0.5)[0]:
            said = os.read(err.fileno(), STDERR_TAIL_BYTES).decode(errors="replace").strip()
        status = self.process.poll()
        return (f" (exit status {status})" if status is not None else "") + (
            f": {said.splitlines()[-1]}" if said else ""
        )


def proxy_socket(ep: Endpoint) -> paramiko.ProxyCommand:
    """``$SHELL -c 'exec CMD'`` (as ssh runs a ProxyCommand; ``/bin/sh`` without $SHELL), its
    stdin/stdout the socket; the process is killed when the socket closes.

    Raises:
        HostUnreachable: the command could not be started.
    """
    assert ep.proxy_command
    shell = os.environ.get("SHELL") or "/bin/sh"
    try:  # paramiko shlex-splits the line: hand it the shell's argv
        return _ProxyCommand(shlex.join([shell, "-c", ep.proxy_command]))
    except (OSError, paramiko.SSHException) as exc:
        raise HostUnreachable(
            ep.name, f"starting ProxyCommand {ep.proxy_command!r}: {exc}"
        ) from None
