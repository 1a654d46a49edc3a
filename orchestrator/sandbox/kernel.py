"""The sandbox's kernel log: ``<state>/kernel.log``, read by the dmesg/journalctl stand-ins
(another simulated host's: ``<state>/hosts/<host>/kernel.log``, see hosts.py).

One record per line: ``EPOCH_S LEVEL TEXT`` (level as in syslog: 3 err, 4 warn, 6 info); a
newline inside a record (the kernel prints some notices as one record of several lines, such
as newer drivers' "fallen off the bus") is stored as ``\\x0a`` and a backslash as ``\\x5c``,
as ``/dev/kmsg`` escapes them. A line ``EPOCH_S B BOOT_ID`` starts a new boot
(:func:`reboot`): dmesg then shows only the records after it (a reboot empties the ring
buffer), ``journalctl -k`` the current boot, ``journalctl -k -b -1`` the one before.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

KERNEL_LOG = "kernel.log"
BOOT = "B"
"""The level field of a boot line."""


def escape(text: str) -> str:
    """A record's text as stored (``\\`` and newlines escaped as ``/dev/kmsg`` does).

    >>> escape("NVRM: The NVIDIA GPU 0000:b3:00.0\\nNVRM: fallen off the bus")
    'NVRM: The NVIDIA GPU 0000:b3:00.0\\\\x0aNVRM: fallen off the bus'
    """
    return text.replace("\\", "\\x5c").replace("\r", "").replace("\n", "\\x0a")


def unescape(text: str) -> str:
    r"""The record's text back (:func:`escape` undone).

    >>> unescape(escape("a\\b\nc")) == "a\\b\nc"
    True
    """
    return text.replace("\\x0a", "\n").replace("\\x5c", "\\")


def format_kernel_line(text: str, level: int, at_s: float) -> str:
    """One stored record (several lines of ``text`` stay one record).

    >>> format_kernel_line("NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has fallen off the bus.", 4, 12.5)
    '12.500000 4 NVRM: Xid (PCI:0000:5d:00): 79, pid=1, GPU has fallen off the bus.\\n'
    """
    if not 0 <= level <= 7:
        raise ValueError(f"kernel log level must be 0..7, got {level}")
    return f"{at_s:.6f} {level} {escape(text)}\n"


def _append(state_dir: Path | str, line: str, host: str | None = None) -> None:
    """One ``O_APPEND`` write per line, so concurrent writers never interleave within a line;
    ``host`` names another simulated host's log (default: the first, ``sandbox``)."""
    from orchestrator.sandbox.hosts import kernel_log_path

    path = kernel_log_path(Path(state_dir), host)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def append_kernel_line(
    state_dir: Path | str,
    text: str,
    *,
    level: int = 4,
    at_s: float | None = None,
    host: str | None = None,
) -> None:
    """Append ``text`` to the sandbox kernel log (as the kernel would print it), at ``at_s``
    (default now); a ``text`` of several lines is one record, as the kernel's own. ``host``
    names another simulated host's log (default: the first, ``sandbox``)."""
    line = format_kernel_line(text, level, time.time() if at_s is None else at_s)
    _append(state_dir, line, host)


def reboot(state_dir: Path | str, *, at_s: float | None = None) -> str:
    """Start a new boot in the kernel log at ``at_s`` (default now); returns its boot id."""
    boot_id = secrets.token_hex(16)
    _append(state_dir, f"{time.time() if at_s is None else at_s:.6f} {BOOT} {boot_id}\n")
    return boot_id


VOLATILE = "journal.volatile"
"""A file beside a host's kernel log: its journal is volatile (journald ``Storage=volatile``,
or ``auto`` without /var/log/journal): the journalctl stand-in then keeps no earlier boot."""


def set_volatile_journal(state_dir: Path | str, on: bool = True, host: str | None = None) -> None:
    """Make ``host``'s journal volatile (``on``) or persistent again: ``journalctl -b -1`` then
    answers as systemd 252 does without a persistent journal (stderr "Specifying boot ID or
    boot offset has no effect, no persistent journal was found.", exit 0, no lines)."""
    from orchestrator.sandbox.hosts import kernel_log_path

    flag = kernel_log_path(Path(state_dir), host).parent / VOLATILE
    if on:
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text("Storage=volatile\n")
    else:
        flag.unlink(missing_ok=True)


def guest_port_lines(
    vmid: int,
    *,
    start: bool = True,
    vm: bool = False,
    firewall: bool = True,
    bridge: str = "vmbr0",
    port: int = 2,
    netid: int = 0,
) -> list[str]:
    """What a Proxmox VE 8 host's kernel (Linux 6.8) logs when guest ``vmid``'s NIC ``netid``
    is plugged (``start``) or unplugged: ports added in the order pve-common
    src/PVE/Network.pm's ``$create_firewall_bridge_linux`` adds them (``fwpr`` to the bridge,
    ``fwln`` and the guest's ``veth``/``tap`` to ``fwbr``), each as br_add_if logs it
    (net/bridge/br_stp.c ``br_log_state``: "port %u(%s) entered %s state"; net/core/dev.c
    ``netdev_info(dev, "%s allmulticast mode\\n")`` / ``"%s promiscuous mode\\n"``); at
    removal "entered disabled state", "(unregistering): left ... mode", disabled again.

    >>> guest_port_lines(201, firewall=False)[:2]
    ['vmbr0: port 2(veth201i0) entered blocking state', 'vmbr0: port 2(veth201i0) entered disabled state']
    >>> guest_port_lines(300, vm=True, start=False, firewall=False)[1]
    'tap300i0 (unregistering): left allmulticast mode'
    """
    dev = f"{'tap' if vm else 'veth'}{vmid}i{netid}"
    if firewall:
        fwbr = f"fwbr{vmid}i{netid}"
        ports = [
            (bridge, port, f"fwpr{vmid}p{netid}"),
            (fwbr, 1, f"fwln{vmid}i{netid}"),
            (fwbr, 2, dev),
        ]
    else:
        ports = [(bridge, port, dev)]
    out: list[str] = []
    for br, no, name in ports if start else reversed(ports):
        head = f"{br}: port {no}({name}) entered"
        if start:
            out += [
                f"{head} blocking state",
                f"{head} disabled state",
                f"{name}: entered allmulticast mode",
                f"{name}: entered promiscuous mode",
                f"{head} blocking state",
                f"{head} forwarding state",
            ]
        else:
            out += [
                f"{head} disabled state",
                f"{name} (unregistering): left allmulticast mode",
                f"{name} (unregistering): left promiscuous mode",
                f"{head} disabled state",
            ]
    return out


def append_guest_ports(
    state_dir: Path | str,
    vmid: int,
    *,
    start: bool = True,
    host: str | None = None,
    at_s: float | None = None,
    **kw: object,
) -> list[str]:
    """Write :func:`guest_port_lines` to ``host``'s kernel log (level 6, all at ``at_s``,
    default now, as one guest start or stop); returns the lines."""
    lines = guest_port_lines(vmid, start=start, **kw)  # type: ignore[arg-type]
    at = time.time() if at_s is None else at_s
    for i, text in enumerate(lines):
        _append(state_dir, format_kernel_line(text, 6, at + i * 1e-4), host)
    return lines
