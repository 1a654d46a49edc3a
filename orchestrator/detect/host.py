"""Host detectors: Xid lines and OOM-killer kills from the Proxmox host's kernel log.

Input is the events of :class:`HostProbe` (``orch check`` of a container observed from
inside) and of the snapshots (observed from the host, each container's own). Events older
than the run's launch are ignored: they belong to someone else. An event the host gave to
another container (its ``vmid``) is never this one's; a host-wide event (no owner) is
this one's only when it names one of the run's processes by host PID (an OOM kill seen
before anyone could read the victim's cgroup); else it is the host's
(:func:`orchestrator.monitor.hostpath.host_judgement`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from orchestrator.config.limits import Limits
from orchestrator.detect.base import History, fmt_time, manifest_of
from orchestrator.wire.model import Finding, HostProbe, KernelEvent, Severity

XID_MEANINGS: dict[int, str] = {
    8: "GPU stopped processing (timeout)",
    13: "graphics engine exception (application-level: bad kernel, out-of-range access)",
    31: "GPU memory page fault (application-level: illegal address)",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing (application-level: the process hit a fault)",
    45: "preemptive cleanup after a previous error (application-level)",
    48: "double-bit ECC error (memory; reset the GPU, check retired pages)",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (memory)",
    64: "ECC page retirement or row remapper failure (memory)",
    68: "video processor exception (application-level)",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus (PCIe link lost; power, thermal or hardware)",
    92: "high single-bit ECC error rate (memory)",
    94: "contained ECC error (memory; the affected process was killed)",
    95: "uncontained ECC error (memory; reset the GPU)",
    109: "context switch timeout (application-level)",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
"""Short meanings of common Xid codes (NVIDIA's Xid catalog; docs/detectors.md lists sources)."""

CRITICAL_XIDS = frozenset({48, 62, 64, 74, 79, 92, 94, 95, 119, 120, 140})

OOM_WINDOW_S = 120.0
"""An OOM kill naming the run's process (not its pid) counts when this close to the death."""


def _since_launch(history: History, events: Sequence[KernelEvent]) -> list[KernelEvent]:
    manifest = manifest_of(history)
    if manifest is None:
        return list(events)
    return [e for e in events if e.at is None or e.at >= manifest.started_at]


def kernel_events(probes: Sequence[HostProbe], history: History = ()) -> list[KernelEvent]:
    """The target's kernel events, each line once: the probes' (oldest first) and the
    snapshots', keeping only its own when its vmid is known (see the module).

    >>> from orchestrator.wire.model import Snapshot
    >>> mine = KernelEvent(kind="xid", line="a", at=1.0, xid=79, vmid=200)
    >>> theirs = KernelEvent(kind="xid", line="b", at=1.0, xid=79, vmid=201)
    >>> host = KernelEvent(kind="xid", line="c", at=1.0, xid=79)
    >>> p = HostProbe("h", 0.0, kernel_events=(mine, theirs, host))
    >>> [e.line for e in kernel_events([p], [Snapshot("ct200", 2.0, vmid=200)])]
    ['a']
    >>> [e.line for e in kernel_events([p])]
    ['a', 'b', 'c']
    """
    vmid = next((s.vmid for s in reversed(history) if s.vmid is not None), None)
    host_pids = {p.host_pid for s in history for p in s.processes if p.host_pid is not None}
    gpus = run_host_gpus(history)
    seen: dict[tuple[str, float | None], KernelEvent] = {}
    every = [e for probe in probes for e in probe.kernel_events]
    every += [e for s in history for e in s.kernel_events]
    for e in every:
        named = e.vmid is None and (
            (e.kind == "oom-killer" and e.pid in host_pids) or (e.gpu is not None and e.gpu in gpus)
        )
        if vmid is not None and e.vmid != vmid and not named:
            continue
        seen.setdefault((e.line, e.at), e)
    return list(seen.values())


def run_host_gpus(history: History) -> set[int]:
    """The host indices of the GPUs the run's manifest names (its container's numbering mapped
    through the newest snapshot's ``host_index``; the same numbers when it has none).

    >>> from orchestrator.wire.model import GpuSample, RunManifest, RunState, Snapshot
    >>> m = RunManifest("r", "c", "/w", "t", 0.0, gpus=(0,))
    >>> s = Snapshot("ct", 1.0, run=RunState("r", "/r", manifest=m),
    ...              gpus=(GpuSample(index=0, host_index=4),))
    >>> run_host_gpus([s])
    {4}
    """
    manifest = manifest_of(history)
    if manifest is None:
        return set()
    latest = next((s for s in reversed(history) if s.gpus), None)
    if latest is None:
        return set(manifest.gpus)
    by_index = {g.index: g.host_index if g.host_index is not None else g.index for g in latest.gpus}
    return {by_index.get(i, i) for i in manifest.gpus}


def run_pids_and_names(history: History) -> tuple[set[int], set[str]]:
    """Every PID (inside and, when read from the host, on the host) and process name (``?``
    skipped) the history saw in the run's process tree."""
    pids: set[int] = set()
    names: set[str] = set()
    for s in history:
        for p in s.processes:
            pids.add(p.pid)
            if p.host_pid is not None:
                pids.add(p.host_pid)
            if p.name and p.name != "?":
                names.add(p.name)
    return pids, names


def oom_kills_of_run(
    events: Iterable[KernelEvent],
    *,
    pids: Collection[int],
    names: Collection[str],
    started_at: float | None,
    died_at: float | None,
    window_s: float = OOM_WINDOW_S,
    vmid: int | None = None,
) -> list[KernelEvent]:
    """The OOM-killer events that plausibly killed the run: its PID, or, near its death, a
    kill in its container's memory cgroup (``vmid``) or of a process of its name.

    Inside LXC the container sees its own PIDs while the host kernel logs host PIDs, so
    a kill naming one of ``names`` within ``window_s`` seconds of ``died_at`` counts too
    (any time when either time is unknown), unless the host gave it to another container.
    Kills more than 1 s before ``started_at`` belong to an earlier run. Times are Unix seconds.

    >>> e = KernelEvent(kind="oom-killer", line="Killed process 9 (python3)", at=100.0,
    ...                 pid=9, process="python3")
    >>> len(oom_kills_of_run([e], pids={9}, names=(), started_at=50.0, died_at=None))
    1
    >>> len(oom_kills_of_run([e], pids={7}, names={"python3"}, started_at=50.0, died_at=500.0))
    0
    >>> len(oom_kills_of_run([e], pids={7}, names={"python3"}, started_at=50.0, died_at=101.0))
    1
    >>> len(oom_kills_of_run([e], pids={9}, names=(), started_at=200.0, died_at=None))
    0
    """
    out = []
    for e in events:
        if e.kind != "oom-killer":
            continue
        if started_at is not None and e.at is not None and e.at < started_at - 1.0:
            continue
        if e.vmid is not None and vmid is not None and e.vmid != vmid:
            continue
        near = died_at is None or e.at is None or abs(e.at - died_at) <= window_s
        ours = e.vmid is not None and e.vmid == vmid
        if (e.pid is not None and e.pid in pids) or ((ours or e.process in names) and near):
            out.append(e)
    return out


def xid(
    history: History,
    limits: Limits,
    probes: Sequence[HostProbe] = (),
    *,
    all_xids: bool = False,
) -> list[Finding]:
    """One finding per Xid code seen since launch; application-level codes skipped unless ``all_xids``.

    Xid 79 and bare "fallen off the bus" lines carry playbook ``gpu-fallen-off-bus``;
    the rest ``gpu-xid``.
    """
    events = [
        e
        for e in _since_launch(history, kernel_events(probes, history))
        if e.kind in ("xid", "sxid", "fallen-off-bus")
    ]
    target = history[-1].target if history else (probes[-1].host if probes else "?")
    groups: dict[tuple[str, int], list[KernelEvent]] = {}
    for e in events:
        code = 79 if e.kind == "fallen-off-bus" else e.xid
        if code is None:
            continue
        if e.kind != "sxid" and code in limits.ignored_xids and not all_xids:
            continue
        groups.setdefault(("sxid" if e.kind == "sxid" else "xid", code), []).append(e)
    out: list[Finding] = []
    for (family, code), evs in sorted(groups.items()):
        pcis = sorted({where_on_gpu(e) for e in evs if e.pci})
        ats = [e.at for e in evs if e.at is not None]
        earlier = " (kernel log of the previous boot)" if all(e.boot == -1 for e in evs) else ""
        if family == "sxid":
            fatal = any(", Fatal," in e.line for e in evs)
            head = f"NVSwitch SXid {code} ({'fatal' if fatal else 'non-fatal'})"
            severity = Severity.CRITICAL if fatal else Severity.WARNING
        else:
            head = (
                f"Xid {code} ({XID_MEANINGS.get(code, 'see NVIDIA' + chr(39) + 's Xid catalog')})"
            )
            severity = Severity.CRITICAL if code in CRITICAL_XIDS else Severity.WARNING
        out.append(
            Finding(
                kind="xid",
                severity=severity,
                target=target,
                summary=f"{head} x{len(evs)}"
                + (f" on PCI {', '.join(pcis)}" if pcis else "")
                + earlier,
                since=min(ats) if ats else None,
                evidence=tuple(e.line for e in evs[:5]),
                playbook="gpu-fallen-off-bus" if family == "xid" and code == 79 else "gpu-xid",
            )
        )
    return out


def where_on_gpu(e: KernelEvent) -> str:
    """The GPU an event names, with its MIG GPU / compute instance as the driver prints them.

    >>> where_on_gpu(KernelEvent("xid", "x", pci="0000:3b:00", gpu_instance=2, compute_instance=1))
    '0000:3b:00 GPU-I:02 GPU-CI:01'
    >>> where_on_gpu(KernelEvent("xid", "x", pci="0000:3b:00"))
    '0000:3b:00'
    """
    out = e.pci or "?"
    if e.gpu_instance is not None:
        out += f" GPU-I:{e.gpu_instance:02d}"
    if e.compute_instance is not None:
        out += f" GPU-CI:{e.compute_instance:02d}"
    return out


def oom_killer(history: History, limits: Limits, probes: Sequence[HostProbe] = ()) -> list[Finding]:
    """The kernel OOM killer killed a process since launch (ours when its PID was in the run's tree)."""
    del limits
    events = [
        e for e in _since_launch(history, kernel_events(probes, history)) if e.kind == "oom-killer"
    ]
    if not events:
        return []
    ours, _names = run_pids_and_names(history)
    vmid = next((s.vmid for s in reversed(history) if s.vmid is not None), None)
    target = history[-1].target if history else (probes[-1].host if probes else "?")
    mine = [e for e in events if (e.pid is not None and e.pid in ours) or (vmid and e.vmid == vmid)]
    shown = mine or events
    first = shown[0]
    who = (
        f"{first.process or 'a process'} (pid {first.pid})"
        if first.pid
        else first.process or "a process"
    )
    ats = [e.at for e in shown if e.at is not None]
    return [
        Finding(
            kind="oom-killer",
            severity=Severity.CRITICAL,
            target=target,
            summary=(
                f"the kernel OOM killer killed {who}"
                + (", a process of this run" if mine else "")
                + (f" at {fmt_time(min(ats))}" if ats else "")
                + (f" ({len(shown)} kills)" if len(shown) > 1 else "")
            ),
            since=min(ats) if ats else None,
            evidence=tuple(e.line for e in shown[:5]),
            playbook="oom-killer",
        )
    ]
