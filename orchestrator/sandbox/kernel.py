"""The sandbox's kernel ring buffer: ``<state>/kernel.log``, read by the dmesg/journalctl stand-ins
(another simulated host's: ``<state>/hosts/<host>/kernel.log``, see hosts.py).

One line per message: ``EPOCH_S LEVEL TEXT`` (level as in syslog: 3 err, 4 warn, 6 info).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

KERNEL_LOG = "kernel.log"


def format_kernel_line(text: str, level: int, at_s: float) -> str:
    """One stored line; newlines in ``text`` become spaces.

    >>> format_kernel_line("NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has fallen off the bus.", 4, 12.5)
    '12.500000 4 NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has fallen off the bus.\\n'
    """
    if not 0 <= level <= 7:
        raise ValueError(f"kernel log level must be 0..7, got {level}")
    return f"{at_s:.6f} {level} {' '.join(text.splitlines())}\n"


def append_kernel_line(
    state_dir: Path | str,
    text: str,
    *,
    level: int = 4,
    at_s: float | None = None,
    host: str | None = None,
) -> None:
    """Append ``text`` to the sandbox kernel log (as the kernel would print it), at ``at_s`` (default now);
    ``host`` names another simulated host's (default: the first, ``sandbox``).

    One ``O_APPEND`` write per line, so concurrent writers never interleave within a line.
    """
    line = format_kernel_line(text, level, time.time() if at_s is None else at_s)
    from orchestrator.sandbox.hosts import kernel_log_path

    path = kernel_log_path(Path(state_dir), host)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
