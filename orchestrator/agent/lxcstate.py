"""Which containers of the host run, and their init PIDs, without ``pct`` (from LXC itself).

This is how pct learns it (pve-container ``src/PVE/LXC.pm``):

- ``list_active_containers``/``check_running``: a container runs while its monitor's
  command socket exists: the abstract unix socket ``@<lxcpath>/<vmid>/command`` listed in
  ``/proc/net/unix`` (lxcpath ``/var/lib/lxc`` on Proxmox). One read tells every container.
- ``find_lxc_pid``: ``lxc-info -n <vmid> -p``, the line ``PID: <pid>`` (a C program asking
  that socket: a few ms, where a ``pct`` call is a Perl start-up of ~0.3 s of CPU).

LXC names the socket ``<lxcpath>/<name>/command`` unless that is too long for
``sun_path``, then ``lxc/<fnv64 hash>/command`` (lxc ``src/lxc/af_unix.c``,
``lxc_make_abstract_socket_name``): such an lxcpath is not usable here (``None``), and
the caller asks pct. The lxcpath is ``$ORCH_LXC_PATH`` when set (the sandbox's own), else
``/var/lib/lxc``; a container with no ``<lxcpath>/<vmid>`` directory is not LXC's to tell
(never started on this host, deleted, or not LXC): pct is asked.

Equivalent: ``grep -a '@/var/lib/lxc/.*/command' /proc/net/unix``; ``lxc-info -n 200 -p``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

DEFAULT_LXCPATH = "/var/lib/lxc"
MAX_SOCKET_NAME = 105
"""Longest ``<lxcpath>/<name>/command`` LXC uses as is (``sizeof(sun_path)`` 108, less the
leading NUL and the terminating one LXC keeps, less the ``@`` shown)."""
_PID_LINE = re.compile(r"^PID:\s+(\d+)\s*$", re.MULTILINE)


def lxcpath() -> str:
    """The lxcpath in use: ``$ORCH_LXC_PATH``, else Proxmox's ``/var/lib/lxc``."""
    return os.environ.get("ORCH_LXC_PATH") or DEFAULT_LXCPATH


def parse_active(text: str, path: str) -> set[int]:
    """vmids whose command socket ``@<path>/<vmid>/command`` is in ``/proc/net/unix``.

    The socket's name is the last column (``Num RefCount Protocol Flags Type St Inode Path``).

    >>> net = ("Num       RefCount Protocol Flags    Type St Inode Path\\n"
    ...        "0000000000000000: 00000002 00000000 00010000 0001 01 31337 @/var/lib/lxc/200/command\\n"
    ...        "0000000000000000: 00000002 00000000 00010000 0001 01 31338 @/var/lib/lxc/201/command\\n"
    ...        "0000000000000000: 00000003 00000000 00000000 0001 03 31339 @/var/lib/lxc/201/command\\n"
    ...        "0000000000000000: 00000002 00000000 00010000 0001 01 3134 /run/lxc/x/command\\n")
    >>> sorted(parse_active(net, "/var/lib/lxc"))
    [200, 201]
    """
    prefix = "@" + path.rstrip("/") + "/"
    out: set[int] = set()
    for line in text.splitlines():
        name = line.rsplit(None, 1)[-1] if line else ""
        if name.startswith(prefix) and name.endswith("/command"):
            vmid = name[len(prefix) : -len("/command")]
            if vmid.isdigit():
                out.add(int(vmid))
    return out


def parse_lxc_info_pid(text: str) -> int | None:
    """The init PID of ``lxc-info -n VMID -p`` (``PID: 41234``), as ``find_lxc_pid`` reads it.

    >>> parse_lxc_info_pid("PID:            41234\\n"), parse_lxc_info_pid("")
    (41234, None)
    """
    m = _PID_LINE.search(text)
    return int(m.group(1)) if m else None


class LxcState:
    """LXC's word on the containers of this host (one ``/proc/net/unix`` read per call of
    :meth:`active`; ``lxc-info`` per init PID asked).

    Args:
        path: the lxcpath (default :func:`lxcpath`).
        proc: the proc file system.
    """

    def __init__(self, path: str | None = None, proc: str = "/proc") -> None:
        self.path = (path or lxcpath()).rstrip("/") or "/"
        self.proc = proc

    def knows(self, vmid: int) -> bool:
        """LXC can tell this container's state: its ``<lxcpath>/<vmid>`` exists and the
        socket name is not hashed."""
        name = f"{self.path}/{vmid}/command"
        return len(name) <= MAX_SOCKET_NAME and os.path.isdir(f"{self.path}/{vmid}")

    def active(self, vmids: Iterable[int]) -> dict[int, bool] | None:
        """``{vmid: running}`` for those of ``vmids`` LXC :meth:`knows`; ``None`` when
        ``/proc/net/unix`` cannot be read (then nothing is known)."""
        known = [v for v in vmids if self.knows(v)]
        if not known:
            return {}
        try:
            with open(f"{self.proc}/net/unix", "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return None
        running = parse_active(text, self.path)
        return {v: v in running for v in known}

    def init_pid(self, vmid: int, timeout_s: float = 10.0) -> tuple[int | None, str]:
        """(init PID, why not) from ``lxc-info -n VMID -p [-P lxcpath]``."""
        import subprocess

        argv = ["lxc-info", "-n", str(vmid), "-p"]
        if self.path != DEFAULT_LXCPATH:
            argv += ["-P", self.path]
        try:
            p = subprocess.run(
                argv, capture_output=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"lxc-info {vmid}: {exc}"
        pid = parse_lxc_info_pid(p.stdout.decode("utf-8", "replace"))
        if pid is None:
            why = (p.stderr or p.stdout).decode("utf-8", "replace").strip()[:200]
            return None, f"lxc-info {vmid}: {why or f'exit {p.returncode}, no PID'}"
        return pid, ""
