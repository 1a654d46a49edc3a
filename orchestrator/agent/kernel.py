"""The Proxmox host's kernel log: read it (journalctl, else dmesg) and parse what matters.

What matters (:class:`~orchestrator.wire.model.KernelEvent`): GPU Xid lines
(``NVRM: Xid (PCI:0000:5d:00): 79, pid=..., name=..., ...``), NVSwitch SXid lines
(``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...``), "fallen off the
bus" in its one-line form and in the three-line notice of newer drivers::

    NVRM: The NVIDIA GPU 0000:b3:00.0
    NVRM: (PCI ID: 10de:26b5) installed in this system has
    NVRM: fallen off the bus and is not responding to commands.

(one kernel record with embedded newlines, which journalctl and dmesg print as indented
continuation lines, or three records), and the OOM killer: ``Out of memory: Killed process
PID (comm)`` / ``Memory cgroup out of memory: Killed process ...``, whose owner comes from
the ``oom-kill:...,task_memcg=/lxc/201/ns/...,pid=PID,...`` line the kernel prints before it;
and a network link going down (a NIC, or a container's bridge port: agent/netlog.py), which
cuts a node of a multi-node job off.

Fetch apart from parse: :class:`KernelParser` is pure (fed lines, gives events);
:func:`read_kernel` runs the tools. A line without a time never counts as new: it is
kept only when everything is asked for (``since`` and ``cursor`` both ``None``).

Equivalent shell commands::

    journalctl -k -o short-unix --no-pager -q --show-cursor --after-cursor=CURSOR  # or --since=@T
    journalctl -k -b -1 -o short-unix --no-pager -q --since=@T   # the boot before this one
    dmesg --time-format iso                                        # without journald
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator.agent.cgroups import vmid_of_cgroup_path
from orchestrator.agent.netlog import (
    PORT_SEQUENCE_S,
    guest_of_device,
    parse_link_down,
    parse_port_line,
)
from orchestrator.wire.model import KernelEvent

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?\): (\d+)"
    r"(?:, pid=(\d*|'<unknown>'))?(?:, name=([^,]*))?"
)
"""Every Xid form of the 515-595 drivers (src/nvidia/src/kernel/gpu/rc/kernel_rc.c):
``NVRM: Xid (PCI:%04x:%02x:%02x[ GPU-I:%02u[ GPU-CI:%02u]]): %d, pid=%s, name=%s, %s``, and
since 570 (``XID_PRINT_WITH_ATTR``) without ``pid=``/``name=`` when no process is known;
tests/agent/test_driver_formats.py holds every format string with its line and version."""
_SXID = re.compile(r"(nvidia-nvswitch\d*): SXid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")
_FALLEN = re.compile(r"(?:GPU at PCI:|GPU at |GPU )([0-9a-fA-F]{4,8}:[0-9a-fA-F:.]+)")
_NOTICE_HEAD = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F:.]+)")
_NOTICE_END = "fallen off the bus and is not responding"
_OOM = re.compile(
    r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+) \(([^)]*)\)"
)
_OOM_KILL = re.compile(r"oom-kill:.*?task_memcg=([^,\s]*).*?,pid=(\d+)")
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_UNIX = re.compile(r"^(\d{9,}\.\d+)\s+(.*)$")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?([+-]\d\d:?\d\d|Z)?\s+(.*)$")
_CURSOR = "-- cursor: "
MAX_LINES = 5000
"""Most kernel-log lines one read takes (journalctl ``-n``): the newest of them."""
MAX_LINE_CHARS = 4096
"""The most of one line parsed: the kernel's own records are shorter (kernel/printk/printk.c
``PRINTK_MESSAGE_MAX`` 2048 bytes, Linux 6.6+; ``LOG_LINE_MAX`` 992 before), so a longer line
is not the kernel's (a 1 MB line costs what 4 KiB does)."""
MAX_RECORD_LINES = 16
"""The most continuation lines kept on one record (the three-line notice needs 3)."""
VOLATILE_JOURNAL = "no persistent journal was found"
"""What systemd's journalctl says on stderr for ``-b -1`` without a persistent journal,
exiting 0 with no lines (systemd src/journal/journalctl.c, v252 main() / v254 run(): when
``arg_boot_offset != 0`` and the journal has runtime files only, ``log_info("Specifying boot
ID or boot offset has no effect, no persistent journal was found.")`` then ``return 0``)."""


def split_timestamp(line: str, boot_time: float | None) -> tuple[float | None, str]:
    """Split a kernel-log line into (Unix seconds or ``None``, message).

    Understands ``dmesg`` (``[  123.456] msg``, seconds since boot, needs
    ``boot_time``), ``journalctl -o short-unix`` (``1700000000.123 host kernel: msg``)
    and ``dmesg --time-format iso``.

    >>> split_timestamp("[  100.500000] NVRM: Xid (PCI:0000:5d:00): 79", 1000.0)
    (1100.5, 'NVRM: Xid (PCI:0000:5d:00): 79')
    >>> split_timestamp("1700000000.250000 pve1 kernel: NVRM: boom", None)
    (1700000000.25, 'NVRM: boom')
    >>> split_timestamp("2023-11-14T22:13:20,000000+00:00 NVRM: boom", None)
    (1700000000.0, 'NVRM: boom')
    >>> split_timestamp("no stamp", None)
    (None, 'no stamp')
    """
    line = line.rstrip("\n")
    m = _MONO.match(line)
    if m:
        at = float(m.group(1)) + boot_time if boot_time is not None else None
        return at, m.group(2)
    m = _UNIX.match(line)
    if m:
        msg = m.group(2)
        kernel = msg.find("kernel: ")
        return float(m.group(1)), msg[kernel + 8 :] if kernel >= 0 else msg
    m = _ISO.match(line)
    if m:
        zone = (m.group(3) or "+00:00").replace("Z", "+00:00")
        if ":" not in zone:
            zone = zone[:3] + ":" + zone[3:]
        try:
            at = datetime.fromisoformat(m.group(1) + zone).timestamp()
        except ValueError:
            return None, line
        if m.group(2):
            at += float("0." + m.group(2))
        return at, m.group(4)
    return None, line


def _pid(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def parse_message(msg: str, at: float | None) -> KernelEvent | None:
    """One whole kernel message (continuation lines joined by spaces) as an event, or ``None``.

    >>> e = parse_message("NVRM: Xid (PCI:0000:5d:00): 79, pid=412304, name=python3, GPU has fallen off the bus.", 5.0)
    >>> (e.kind, e.xid, e.pci, e.pid, e.process, e.at)
    ('xid', 79, '0000:5d:00', 412304, 'python3', 5.0)
    >>> e = parse_message("nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32", None)
    >>> (e.kind, e.xid, e.pci, e.process)
    ('sxid', 12028, '0000:05:00.0', 'nvidia-nvswitch3')
    >>> parse_message("NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.", None).pci
    '0000:5d:00.0'
    >>> parse_message("NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: (PCI ID: 10de:26b5) installed in "
    ...               "this system has NVRM: fallen off the bus and is not responding to commands.",
    ...               1.0).pci
    '0000:b3:00.0'
    >>> e = parse_message("Out of memory: Killed process 4242 (python3) total-vm:1kB", None)
    >>> (e.kind, e.pid, e.process)
    ('oom-killer', 4242, 'python3')
    >>> e = parse_message("NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:01): 43, pid=77, name=python3, Ch 00000008", None)
    >>> (e.xid, e.pci, e.gpu_instance, e.compute_instance, e.pid)
    (43, '0000:3b:00', 2, 1, 77)
    >>> e = parse_message("vmbr0: port 3(fwpr201p0) entered disabled state", 2.0)
    >>> (e.device, e.vmid)
    ('fwpr201p0', 201)
    >>> parse_message("usb 1-1: new device", None) is None
    True
    """
    m = _XID.search(msg)
    if m:
        return KernelEvent(
            kind="xid",
            line=msg.strip(),
            at=at,
            xid=int(m.group(4)),
            pci=m.group(1),
            pid=_pid(m.group(5)),
            process=(m.group(6) or "").strip() or None,
            gpu_instance=int(m.group(2)) if m.group(2) else None,
            compute_instance=int(m.group(3)) if m.group(3) else None,
        )
    m = _SXID.search(msg)
    if m:
        return KernelEvent(
            kind="sxid",
            line=msg.strip(),
            at=at,
            xid=int(m.group(3)),
            pci=m.group(2),
            process=m.group(1),
        )
    if "fallen off the bus" in msg:
        f = _NOTICE_HEAD.search(msg) or _FALLEN.search(msg)
        pci = f.group(1).rstrip(":.") if f else None
        return KernelEvent(kind="fallen-off-bus", line=msg.strip(), at=at, pci=pci)
    m = _OOM.search(msg)
    if m:
        return KernelEvent(
            kind="oom-killer", line=msg.strip(), at=at, pid=int(m.group(1)), process=m.group(2)
        )
    device = parse_link_down(msg)  # a job node's network: agent/netlog.py
    if device is not None:
        guest = guest_of_device(device)
        return KernelEvent(
            kind="link-down",
            line=msg.strip(),
            at=at,
            device=device,
            vmid=guest[0] if guest else None,
        )
    return None


@dataclass
class KernelParser:
    """Turns kernel-log lines into events, in order, across calls (one per read).

    Keeps what spans lines: a record's indented continuation lines (they share its time),
    the three-record "fallen off the bus" notice (its head names the GPU), the memory
    cgroup of each ``oom-kill:`` line until its ``Killed process`` line comes, and the recent
    states of bridge ports: a port that "entered disabled state" within
    :data:`~orchestrator.agent.netlog.PORT_SEQUENCE_S` of entering blocking state is a port
    being added (a guest starting), and one next to its "left promiscuous mode" is a port
    being removed (a guest stopping): neither is a link going down. A disabled port waits for
    the rest of the read (:meth:`flush`) before it counts. ``boot`` is stamped on every event
    (``0``: the running boot, ``-1``: the one before).
    """

    boot_time: float | None = None
    boot: int | None = None
    _record: tuple[float | None, list[str]] | None = None
    _notice: tuple[float | None, str, list[str]] | None = None
    _notice_left: int = 0
    _memcg: dict[int, str] = field(default_factory=dict)
    _ports: dict[str, tuple[str, float | None]] = field(default_factory=dict)
    _pending: list[KernelEvent] = field(default_factory=list)

    def feed(self, lines: Iterable[str]) -> list[KernelEvent]:
        """Events completed by ``lines``; the last record waits for :meth:`flush` or more lines."""
        out: list[KernelEvent] = []
        for raw in lines:
            line = raw.rstrip("\n")[:MAX_LINE_CHARS]
            if not line.strip() or line.startswith("-- "):
                continue  # journalctl's "-- No entries --", "-- Boot ... --", cursors
            if line[:1].isspace() and self._record is not None:
                if len(self._record[1]) < MAX_RECORD_LINES:
                    self._record[1].append(line.strip())
                continue
            out.extend(self._close())
            at, msg = split_timestamp(line, self.boot_time)
            self._record = at, [msg]
        return out

    def flush(self) -> list[KernelEvent]:
        """The events of the record still open and the disabled ports no removal followed
        (call after the last line of a read)."""
        out = self._close()
        out.extend(self._pending)
        self._pending.clear()
        return out

    def _close(self) -> list[KernelEvent]:
        if self._record is None:
            return []
        at, parts = self._record
        self._record = None
        return self._message(at, " ".join(p.strip() for p in parts))

    def _port(self, at: float | None, msg: str) -> bool:
        """Track a bridge-port line; ``True`` when it is part of a port being added/removed
        (no event of its own)."""
        port = parse_port_line(msg)
        if port is None:
            return False
        before = self._ports.get(port.device)
        self._ports[port.device] = (port.state, at)
        if len(self._ports) > 256:
            self._ports.pop(next(iter(self._ports)))
        near = before is not None and (
            at is None or before[1] is None or 0.0 <= at - before[1] <= PORT_SEQUENCE_S
        )
        if port.state == "promisc-off":  # removal: the disabled line before it was no link-down
            self._pending = [
                e for e in self._pending if e.device != port.device or not _near(e.at, at)
            ]
            return True
        if port.state != "disabled":
            return port.state.startswith("promisc")
        if near and before is not None and before[0] in ("blocking", "promisc-off"):
            return True  # added (blocking -> disabled) or removed (left promiscuous -> disabled)
        ev = parse_message(msg, at)
        if ev is not None:
            self._pending.append(self._stamp(ev))
        return True

    def _message(self, at: float | None, msg: str) -> list[KernelEvent]:
        if self._port(at, msg):
            return []
        m = _OOM_KILL.search(msg)
        if m:
            self._memcg[int(m.group(2))] = m.group(1)
            return []
        head = _NOTICE_HEAD.search(msg)
        if head and _NOTICE_END not in msg:
            self._notice, self._notice_left = (at, head.group(1), [msg]), 3
            return []
        if self._notice is not None:
            n_at, pci, seen = self._notice
            self._notice_left -= 1
            if _NOTICE_END in msg:
                self._notice = None
                joined = " ".join([*seen, msg])
                return [
                    self._stamp(KernelEvent(kind="fallen-off-bus", line=joined, at=n_at, pci=pci))
                ]
            if msg.startswith("NVRM:") and self._notice_left > 0:
                seen.append(msg)
                return []
            self._notice = None
        ev = parse_message(msg, at)
        return [self._stamp(ev)] if ev is not None else []

    def _stamp(self, ev: KernelEvent) -> KernelEvent:
        memcg = self._memcg.pop(ev.pid, None) if ev.kind == "oom-killer" and ev.pid else None
        vmid = vmid_of_cgroup_path(memcg) if memcg else None
        return replace(ev, boot=self.boot, memcg=memcg, vmid=vmid if vmid is not None else ev.vmid)


def _near(a: float | None, b: float | None) -> bool:
    return a is None or b is None or abs(a - b) <= PORT_SEQUENCE_S


def parse_kernel_log(
    lines: Iterable[str],
    since: float | None,
    boot_time: float | None = None,
    *,
    boot: int | None = None,
) -> list[KernelEvent]:
    """Events from kernel-log lines at or after ``since``; an undated one only when ``since``
    is ``None`` (it never counts as new).

    >>> log = ["[10.0] NVRM: Xid (PCI:0000:5d:00): 13, pid=1, name=x, Graphics Exception",
    ...        "[20.0] NVRM: Xid (PCI:0000:5d:00): 79, pid=2, name=y, GPU has fallen off the bus."]
    >>> [e.xid for e in parse_kernel_log(log, since=1015.0, boot_time=1000.0)]
    [79]
    >>> [e.xid for e in parse_kernel_log(log, since=1015.0)]   # no boot time: undated
    []
    """
    parser = KernelParser(boot_time=boot_time, boot=boot)
    events = [*parser.feed(lines), *parser.flush()]
    if since is None:
        return events
    return [e for e in events if e.at is not None and e.at >= since]


def parse_cursor(text: str) -> tuple[list[str], str | None]:
    """journalctl's output without its ``--show-cursor`` line, and that cursor.

    >>> parse_cursor("1.0 h kernel: a\\n-- cursor: s=ab;i=3\\n")
    (['1.0 h kernel: a'], 's=ab;i=3')
    >>> parse_cursor("")
    ([], None)
    """
    lines = text.splitlines()
    if lines and lines[-1].startswith(_CURSOR):
        return lines[:-1], lines[-1][len(_CURSOR) :].strip()
    return lines, None


@dataclass(frozen=True, slots=True)
class KernelRead:
    """One read of the kernel log: its lines, the tool, where the next read continues, and
    what went wrong (``errors``; ``missing_boot`` when the journal has no such boot;
    ``volatile`` when the journal is not persistent, so no earlier boot is kept at all)."""

    lines: tuple[str, ...] = ()
    source: str | None = None
    cursor: str | None = None
    errors: tuple[str, ...] = ()
    missing_boot: bool = False
    volatile: bool = False


VOLATILE_NOTE = (
    "the previous boot's kernel log is not kept on this host (journald keeps the journal in "
    "memory only); to keep it: Storage=persistent in /etc/systemd/journald.conf, or "
    "mkdir -p /var/log/journal, then systemctl restart systemd-journald"
)
"""What orch says instead of implying the boot before was clean (postmortem, doctor)."""


def is_volatile(stderr: str) -> bool:
    """Whether journalctl's stderr says there is no persistent journal (so ``-b -1`` printed
    nothing and exited 0: systemd v252 src/journal/journalctl.c).

    >>> is_volatile("Specifying boot ID or boot offset has no effect, no persistent journal was found.")
    True
    >>> is_volatile("")
    False
    """
    return VOLATILE_JOURNAL in stderr


def _run(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run(
            list(argv),
            capture_output=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return None, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]}: no answer within {timeout_s} s"
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc}"
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def read_kernel(
    since: float | None,
    *,
    cursor: str | None = None,
    boot: int = 0,
    timeout_s: float = 10.0,
    max_lines: int = MAX_LINES,
) -> KernelRead:
    """The kernel log of boot ``boot`` (0 this one, -1 the one before) after ``cursor`` (else
    since ``since``, Unix s), at most the newest ``max_lines`` lines. journalctl when it
    exists, else ``dmesg --time-format iso`` (this boot only; its cursor is the newest time).
    Never raises: failures are ``errors``.
    """
    errors: list[str] = []
    if shutil.which("journalctl"):
        argv = ["journalctl", "-k", "-o", "short-unix", "--no-pager", "-q", "-n", str(max_lines)]
        if boot != 0:
            argv += ["-b", str(boot)]
        else:
            argv.append("--show-cursor")
        if cursor and boot == 0 and not cursor.startswith("t="):
            argv.append(f"--after-cursor={cursor}")
        elif since is not None:
            argv.append(f"--since=@{since:.6f}")
        rc, out, err = _run(argv, timeout_s)
        if rc == 0 and boot != 0 and is_volatile(err):
            return KernelRead((), "journalctl", None, (), missing_boot=True, volatile=True)
        if rc == 0:
            lines, new_cursor = parse_cursor(out)
            return KernelRead(tuple(lines), "journalctl", new_cursor or cursor, ())
        text = (err or out).strip()
        if (
            boot != 0
            and "boot" in text.lower()
            and ("no journal" in text.lower() or "not available" in text.lower())
        ):
            return KernelRead((), "journalctl", None, (), missing_boot=True)
        errors.append(f"journalctl -k failed: {text[:200] or f'exit {rc}'}")
    if boot != 0:
        return KernelRead(
            (), None, None, (*errors, "the kernel ring buffer (dmesg) holds this boot only")
        )
    if shutil.which("dmesg"):
        rc, out, err = _run(["dmesg", "--time-format", "iso"], timeout_s)
        if rc == 0:
            lines = out.splitlines()[-max_lines:]
            after = float(cursor[2:]) if cursor and cursor.startswith("t=") else since
            kept, newest = newer_than(lines, after)
            new_cursor = f"t={newest:.6f}" if newest is not None else cursor
            return KernelRead(tuple(kept), "dmesg", new_cursor, tuple(errors))
        errors.append(f"dmesg failed: {(err or out).strip()[:200]}")
    else:
        errors.append("neither journalctl nor dmesg found")
    return KernelRead((), None, cursor, tuple(errors))


JOURNAL_DIRS = ("/run/log/journal", "/var/log/journal")
"""Where journald keeps its files (volatile, persistent), one directory per machine id."""


def journal_files() -> list[str]:
    """journald's files: ``$ORCH_JOURNAL_FILES`` (``:``-separated; the sandbox's stand-in
    log), else every ``*.journal`` in a machine directory of :data:`JOURNAL_DIRS`."""
    given = os.environ.get("ORCH_JOURNAL_FILES")
    if given:
        return [p for p in given.split(":") if p]
    out: list[str] = []
    for top in JOURNAL_DIRS:
        try:
            machines = sorted(os.listdir(top))
        except OSError:
            continue
        for m in machines:
            try:
                names = sorted(os.listdir(os.path.join(top, m)))
            except OSError:
                continue
            out.extend(os.path.join(top, m, n) for n in names if n.endswith(".journal"))
    return out


def journal_signature(files: Sequence[str] | None = None) -> str | None:
    """Size and mtime (ns) of every journal file, as one string: equal signatures mean the
    journal has not moved. ``None`` when there is no journal file to go by (then read).

    journald writes through mmap, which moves no mtime, but after each change it
    ``ftruncate``s the file to its own size so that inotify and mtime see it (systemd
    ``src/libsystemd/sd-journal/journal-file.c``, ``journal_file_post_change``; coalesced
    over at most 250 ms): a line written in the last instant before a check is read by the
    next one, after the same cursor, never lost.
    """
    paths = journal_files() if files is None else list(files)
    parts = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        parts.append(f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
    return "|".join(parts) or None


def newer_than(lines: Sequence[str], after: float | None) -> tuple[list[str], float | None]:
    """The records of ``lines`` dated after ``after`` (their continuation lines with them), and
    the newest time seen (``after`` when none is newer).

    >>> newer_than(["2024-01-01T00:00:01Z a", "  b", "2024-01-01T00:00:02Z c"], 1704067201.0)
    (['2024-01-01T00:00:02Z c'], 1704067202.0)
    """
    kept: list[str] = []
    newest = after
    keep = after is None
    for line in lines:
        at = None if line[:1].isspace() else split_timestamp(line, None)[0]
        if not line[:1].isspace():
            keep = after is None or (at is not None and at > after)
            if at is not None and (newest is None or at > newest):
                newest = at
        if keep:
            kept.append(line)
    return kept, newest
