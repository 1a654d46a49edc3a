"""The host probe: runs on the Proxmox HOST (not in a container).

It gathers what only the host knows:

- the status of each container asked about: one ``pct list`` (``pct status VMID``
  for any it does not show, or when only one is asked about);
- kernel-log lines with ``NVRM: Xid``, "fallen off the bus", the OOM killer and a network
  link going down (agent/netlog.py) since a given time, from ``journalctl -k`` (``-o short-unix``) or ``dmesg``,
  whichever exists;
- the host-side GPU compute processes (NVML, or nvidia-smi) mapped to their
  container through ``/proc/<pid>/cgroup`` (``lxc/<vmid>``): inside LXC, NVML
  reports host PIDs that do not exist in the container.

Fetch apart from parse: the ``parse_*`` functions are pure and doctested.
``ORCH_PROC_ROOT`` (or ``proc_root``) points the cgroup lookup at another /proc.
Every command runs under a timeout; a failure is an entry in ``errors``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from datetime import datetime

from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.netlog import parse_link_down
from orchestrator.formats import parse_pct_status
from orchestrator.model import HostProbe, KernelEvent

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)(?:, pid=(\d+|'<unknown>'))?(?:, name=([^,]*))?"
)
_FALLEN = re.compile(r"(?:GPU at PCI:|GPU )([0-9a-fA-F:.]+)?.*fallen off the bus", re.IGNORECASE)
_OOM = re.compile(
    r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+) \(([^)]*)\)"
)
_MONO = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_UNIX = re.compile(r"^(\d{9,}\.\d+)\s+(.*)$")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?([+-]\d\d:?\d\d|Z)?\s+(.*)$")
_CGROUP_VMID = re.compile(r"/lxc(?:\.payload)?[./](\d+)(?:/|$)")


def parse_pct_list(text: str) -> dict[int, str]:
    """``pct list`` output -> ``{vmid: status}`` (the header and unreadable lines skipped).

    The Lock column may be empty, so only the first two columns are read.

    >>> parse_pct_list("VMID       Status     Lock         Name\\n"
    ...                "200        running                 ct200\\n"
    ...                "201        stopped    backup       ct201\\n")
    {200: 'running', 201: 'stopped'}
    """
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            out[int(parts[0])] = parts[1]
    return out


def parse_cgroup_vmid(text: str) -> int | None:
    """The LXC vmid owning a process, from ``/proc/<pid>/cgroup`` (``None``: a host process).

    >>> parse_cgroup_vmid("0::/lxc/200/ns/user.slice/session-1.scope\\n")
    200
    >>> parse_cgroup_vmid("12:pids:/lxc.payload.201/init.scope\\n0::/lxc.payload.201\\n")
    201
    >>> parse_cgroup_vmid("0::/system.slice/pvedaemon.service\\n") is None
    True
    """
    for line in text.splitlines():
        m = _CGROUP_VMID.search(line.split(":", 2)[-1])
        if m:
            return int(m.group(1))
    return None


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


def parse_kernel_line(line: str, boot_time: float | None = None) -> KernelEvent | None:
    """A kernel-log line that matters as a :class:`KernelEvent`, else ``None``.

    >>> e = parse_kernel_line("[ 5.0] NVRM: Xid (PCI:0000:5d:00): 79, pid=412304, name=python3, GPU has fallen off the bus.", 0.0)
    >>> (e.kind, e.xid, e.pci, e.pid, e.process, e.at)
    ('xid', 79, '0000:5d:00', 412304, 'python3', 5.0)
    >>> parse_kernel_line("NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.").kind
    'fallen-off-bus'
    >>> e = parse_kernel_line("Out of memory: Killed process 4242 (python3) total-vm:1kB")
    >>> (e.kind, e.pid, e.process)
    ('oom-killer', 4242, 'python3')
    >>> parse_kernel_line("usb 1-1: new device") is None
    True
    """
    at, msg = split_timestamp(line, boot_time)
    m = _XID.search(msg)
    if m:
        pid = m.group(3)
        return KernelEvent(
            kind="xid",
            line=msg.strip(),
            at=at,
            xid=int(m.group(2)),
            pci=m.group(1),
            pid=int(pid) if pid and pid.isdigit() else None,
            process=(m.group(4) or "").strip() or None,
        )
    if "fallen off the bus" in msg:
        f = _FALLEN.search(msg)
        pci = f.group(1).rstrip(":") if f and f.group(1) else None
        return KernelEvent(kind="fallen-off-bus", line=msg.strip(), at=at, pci=pci)
    m = _OOM.search(msg)
    if m:
        return KernelEvent(
            kind="oom-killer", line=msg.strip(), at=at, pid=int(m.group(1)), process=m.group(2)
        )
    device = parse_link_down(msg)  # a job node's network: agent/netlog.py
    if device is not None:
        return KernelEvent(kind="link-down", line=msg.strip(), at=at, device=device)
    return None


def parse_kernel_log(
    lines: Iterable[str], since: float | None, boot_time: float | None = None
) -> list[KernelEvent]:
    """Events from kernel-log lines at or after ``since`` (events with no time are kept).

    >>> log = ["[10.0] NVRM: Xid (PCI:0000:5d:00): 13, pid=1, name=x, Graphics Exception",
    ...        "[20.0] NVRM: Xid (PCI:0000:5d:00): 79, pid=2, name=y, GPU has fallen off the bus."]
    >>> [e.xid for e in parse_kernel_log(log, since=1015.0, boot_time=1000.0)]
    [79]
    """
    out = []
    for line in lines:
        ev = parse_kernel_line(line, boot_time)
        if ev is not None and (since is None or ev.at is None or ev.at >= since):
            out.append(ev)
    return out


def _run(argv: Sequence[str], timeout_s: float) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return None, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return None, "", f"{argv[0]}: no answer within {timeout_s} s"
    except OSError as exc:
        return None, "", f"{argv[0]}: {exc}"
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _boot_time(proc_root: str) -> float | None:
    try:
        with open(os.path.join(proc_root, "uptime"), encoding="ascii") as fh:
            return time.time() - float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def kernel_events(
    since: float | None, timeout_s: float, proc_root: str = "/proc"
) -> tuple[list[KernelEvent], str | None, list[str]]:
    """(events, source, errors) from ``journalctl -k`` if present, else ``dmesg``."""
    errors: list[str] = []
    if shutil.which("journalctl"):
        argv = ["journalctl", "-k", "-o", "short-unix", "--no-pager", "-q"]
        if since is not None:
            argv.append(f"--since=@{int(since)}")
        rc, out, err = _run(argv, timeout_s)
        if rc == 0:
            return parse_kernel_log(out.splitlines(), since), "journalctl", errors
        errors.append(f"journalctl -k failed: {(err or out).strip()[:200]}")
    if shutil.which("dmesg"):
        rc, out, err = _run(["dmesg"], timeout_s)
        if rc == 0:
            return parse_kernel_log(out.splitlines(), since, _boot_time(proc_root)), "dmesg", errors
        errors.append(f"dmesg failed: {(err or out).strip()[:200]}")
    else:
        errors.append("neither journalctl nor dmesg found")
    return [], None, errors


def probe(
    vmids: Sequence[int],
    since: float | None,
    *,
    host: str = "",
    timeout_s: float = 10.0,
    gpu_deadline_s: float = 2.0,
    gpu_source: str | None = None,
    proc_root: str | None = None,
) -> HostProbe:
    """Everything above as one :class:`HostProbe`. Never raises; failures go to ``errors``."""
    proc_root = proc_root or os.environ.get("ORCH_PROC_ROOT") or "/proc"
    errors: list[str] = []
    status: dict[int, str] = {}
    listed: dict[int, str] = {}
    if len(vmids) > 1:  # one `pct list` for all (pct is ~0.3 s of CPU a call on a real host)
        rc, out, _err = _run(["pct", "list"], timeout_s)
        listed = parse_pct_list(out) if rc == 0 else {}
    for vmid in vmids:
        if vmid in listed:
            status[vmid] = listed[vmid]
            continue
        rc, out, err = _run(["pct", "status", str(vmid)], timeout_s)
        if rc == 0:
            status[vmid] = parse_pct_status(out)
        else:
            text = (err or out).strip()
            status[vmid] = (
                "missing" if "does not exist" in text or "no such" in text.lower() else "unknown"
            )
            errors.append(f"pct status {vmid}: {text[:200] or f'exit {rc}'}")
    events, source, kerr = kernel_events(since, timeout_s, proc_root)
    errors.extend(kerr)
    collector = GpuCollector(deadline_s=gpu_deadline_s, source=gpu_source)
    gpus, nvml = collector.collect()
    collector.close()
    if not nvml.ok:
        errors.append(f"host GPUs ({nvml.source}): {nvml.error_kind}: {nvml.message}")
    gpu_pids: dict[str, int | None] = {}
    for g in gpus:
        for p in g.processes or ():
            try:
                with open(
                    os.path.join(proc_root, str(p.pid), "cgroup"),
                    encoding="utf-8",
                    errors="replace",
                ) as fh:
                    gpu_pids[str(p.pid)] = parse_cgroup_vmid(fh.read(65536))
            except OSError:
                gpu_pids[str(p.pid)] = None
    return HostProbe(
        host=host or os.uname().nodename,
        taken_at=time.time(),
        container_status=status,
        kernel_events=tuple(events),
        gpu_pids=gpu_pids,
        kernel_log_source=source,
        errors=tuple(errors),
    )
