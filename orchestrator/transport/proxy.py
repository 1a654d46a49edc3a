"""A ProxyCommand as the connection's socket, and paramiko's thread kept from printing
tracebacks of failures orch already reports as one error.

paramiko's transport thread logs every exception that ends it ("Exception (client): ...")
at ERROR, traceback included, before ``start_client`` raises it; orch translates the raised
one (:mod:`orchestrator.transport.ssh`). Those records are shown only at ``-vv`` (debug).
"""

from __future__ import annotations

import logging
import os
import shlex

import paramiko

from orchestrator.errors import HostUnreachable
from orchestrator.transport.ssh_config import Endpoint


class _OnlyWhenDebugging(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or logging.getLogger().isEnabledFor(logging.DEBUG)


_FILTER = _OnlyWhenDebugging()


def quiet_paramiko() -> None:
    """Install the filter on paramiko's transport logger (idempotent)."""
    logger = logging.getLogger("paramiko.transport")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


def proxy_socket(ep: Endpoint) -> paramiko.ProxyCommand:
    """``$SHELL -c 'exec CMD'`` (as ssh runs a ProxyCommand; ``/bin/sh`` without $SHELL), its
    stdin/stdout the socket; the process is killed when the socket closes.

    Raises:
        HostUnreachable: the command could not be started.
    """
    assert ep.proxy_command
    shell = os.environ.get("SHELL") or "/bin/sh"
    try:  # paramiko shlex-splits the line: hand it the shell's argv
        return paramiko.ProxyCommand(shlex.join([shell, "-c", ep.proxy_command]))
    except (OSError, paramiko.SSHException) as exc:
        raise HostUnreachable(
            ep.name, f"starting ProxyCommand {ep.proxy_command!r}: {exc}"
        ) from None
