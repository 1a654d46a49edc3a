"""The host path: one host document becomes per-container snapshots, so history, detectors,
views and alerts stay per container (the monitor's half of :mod:`orchestrator.remote.hostlink`).

- :func:`fan_out` gives each container its snapshot: the GPUs it sees (numbered as it
  numbers them, each process named with its container and PID inside), the host's NVML
  status, and the kernel events that belong to it.
- :func:`host_own` is THE rule of which events are the host's own (no container of hosts.yaml
  owns it, no run holds its GPU, no container's finding shows it); :func:`host_judgement`
  reports them once, for the host (``host:<name>``).
- :mod:`orchestrator.monitor.hostfeed` keeps a host's documents in order (a stream's, or a
  round's); :mod:`orchestrator.monitor.ledger` applies the rule.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config.inventory import Inventory
from orchestrator.config.limits import Limits
from orchestrator.detect import host as host_detect
from orchestrator.detect.base import alive
from orchestrator.wire.model import (
    Finding,
    GpuSample,
    HostDocument,
    HostProbe,
    KernelEvent,
    Severity,
    Snapshot,
)

log = logging.getLogger(__name__)

HOST_EVENTS_KEEP_S = 3600.0
"""How long a host-wide event stays shown in a stream (seconds)."""
KEEP_HOST_EVENTS = 64
"""Most host-wide events kept per host (the newest)."""
HOST_PREFIX = "host:"
"""The target name of a host's own findings (``host:pve1``)."""


def container_gpus(
    doc: HostDocument, visible: Sequence[int] | None, names: Mapping[int, str]
) -> tuple[GpuSample, ...]:
    """The host's GPUs a container sees, numbered as it numbers them (0.. in host order),
    each process's container named (``names``: vmid -> hosts.yaml name).

    >>> from orchestrator.wire.model import GpuProcess
    >>> doc = HostDocument("h", 1.0, gpus=(GpuSample(index=2, processes=(GpuProcess(9, vmid=201),)),
    ...                                  GpuSample(index=5)))
    >>> [(g.index, g.host_index) for g in container_gpus(doc, [5], {})]
    [(0, 5)]
    >>> container_gpus(doc, None, {201: "ct201"})[0].processes[0].container
    'ct201'
    """
    chosen = (
        list(doc.gpus)
        if visible is None
        else [g for h in visible for g in doc.gpus if g.index == h]
    )
    out = []
    for i, g in enumerate(chosen):
        procs = g.processes
        if procs:
            procs = tuple(
                dataclasses.replace(p, container=names.get(p.vmid, p.container))
                if p.vmid is not None
                else p
                for p in procs
            )
        index = g.index if visible is None else i
        out.append(dataclasses.replace(g, index=index, host_index=g.index, processes=procs))
    return tuple(out)


def fan_out(
    doc: HostDocument,
    inventory: Inventory,
    names: Iterable[str],
    known_pids: Mapping[int, str] | None = None,
) -> tuple[dict[str, Snapshot], list[KernelEvent]]:
    """Per-container snapshots of ``doc`` for ``names``, and the host's own events (no owner,
    or a container hosts.yaml does not name). An OOM kill the host could not place (the
    victim was gone before its cgroup was read) goes to the container whose run had that
    host PID at an earlier observation (``known_pids``: host PID -> container name)."""
    vmids: dict[int, str] = {}
    for n, c in inventory.containers.items():
        if c.vmid is not None and c.host == doc.host:
            vmids[c.vmid] = n
    mine = {n: inventory.container(n).vmid for n in names}
    events = [_placed(e, known_pids or {}, mine) for e in doc.kernel_events]
    out: dict[str, Snapshot] = {}
    for name, vmid in mine.items():
        snap = doc.containers.get(name)
        if snap is None:
            snap = Snapshot.unreachable(
                name, doc.taken_at, f"{doc.host}: the host observer did not report this container"
            )
            out[name] = snap
            continue
        running = snap.container_status in (None, "running")
        gpus = container_gpus(doc, doc.visible_gpus.get(name), vmids) if running else ()
        out[name] = dataclasses.replace(
            snap,
            target=name,
            vmid=vmid,
            gpus=gpus,
            nvml=doc.nvml if running else None,
            kernel_events=tuple(e for e in events if e.vmid == vmid),
            reachable=True,
        )
    host_events = [e for e in events if e.vmid is None or e.vmid not in vmids]
    return out, host_events


def _placed(
    e: KernelEvent, known_pids: Mapping[int, str], vmids: Mapping[str, int | None]
) -> KernelEvent:
    """``e`` with the vmid of the container that had its victim's host PID, when it has none."""
    if e.vmid is not None or e.kind != "oom-killer" or e.pid is None or e.pid not in known_pids:
        return e
    return dataclasses.replace(e, vmid=vmids.get(known_pids[e.pid]))


def run_host_pids(snaps: Iterable[Snapshot]) -> dict[int, str]:
    """Host PID -> container name of every run process in ``snaps`` (read from the host)."""
    return {p.host_pid: s.target for s in snaps for p in s.processes if p.host_pid is not None}


def needs_pane(snap: Snapshot) -> bool:
    """The host cannot tell without the pane: a live run whose log does not exist (the
    tee-bypass check: does the pane show the command's output?)."""
    run = snap.run
    return (
        snap.source == "host"
        and run is not None
        and run.exit_status is None
        and not run.log_exists
        and alive(snap)
    )


def with_pane(snap: Snapshot, pane: Snapshot | None) -> Snapshot:
    """``snap`` with the pane lines ``pane`` (an in-container snapshot) saw."""
    if pane is None or pane.session is None or snap.session is None:
        return snap
    return dataclasses.replace(
        snap, session=dataclasses.replace(snap.session, pane_tail=pane.session.pane_tail)
    )


def host_judgement(host: str, events: Sequence[KernelEvent], limits: Limits) -> list[Finding]:
    """Findings for a host's own events (Xid on a GPU no container holds, OOM kills outside
    every container of hosts.yaml), on the target ``host:<name>``.

    >>> e = KernelEvent(kind="xid", line="NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.",
    ...                 at=5.0, xid=79, pci="0000:5d:00")
    >>> [(f.target, f.kind, str(f.severity)) for f in host_judgement("pve1", [e], Limits())]
    [('host:pve1', 'xid', 'critical')]
    """
    if not events:
        return []
    probe = HostProbe(host=HOST_PREFIX + host, taken_at=0.0, kernel_events=tuple(events))
    found = [*host_detect.xid([], limits, [probe]), *host_detect.oom_killer([], limits, [probe])]
    return [dataclasses.replace(f, summary=f"{f.summary} (no container of hosts.yaml owns it)")
            for f in found]  # fmt: skip


def host_own(
    events: Iterable[KernelEvent],
    vmids: Collection[int],
    claimed_gpus: Collection[int],
    shown: Collection[str],
) -> list[KernelEvent]:
    """THE rule of which kernel events are the host's own, for check, watch and export alike:
    no container of hosts.yaml on that host owns it (``vmids``), it is not on a GPU a run there
    holds (``claimed_gpus``: host NVML indices, :func:`~orchestrator.detect.host.run_host_gpus`), and no
    container's finding shows its line (``shown``: :func:`owned_lines`). Each line once.

    >>> mine = KernelEvent(kind="xid", line="a", at=1.0, xid=79, vmid=200)
    >>> stray = KernelEvent(kind="xid", line="b", at=1.0, xid=79, vmid=999)
    >>> held = KernelEvent(kind="xid", line="c", at=1.0, xid=79, gpu=3)
    >>> free = KernelEvent(kind="xid", line="d", at=1.0, xid=79)
    >>> [e.line for e in host_own([mine, stray, held, free, free], {200}, {3}, set())]
    ['b', 'd']
    """
    out: dict[tuple[str, float | None], KernelEvent] = {}
    for e in events:
        if e.vmid is not None and e.vmid in vmids:
            continue
        if (e.gpu is not None and e.gpu in claimed_gpus) or e.line in shown:
            continue
        out.setdefault((e.line, e.at), e)
    return list(out.values())


@dataclass
class HostView:
    """What is known of one host: its own events of the last hour and their findings."""

    host: str
    events: list[KernelEvent] = dataclasses.field(default_factory=list)
    findings: tuple[Finding, ...] = ()
    errors: tuple[str, ...] = ()
    taken_at: float | None = None


def severity_of(findings: Iterable[Finding]) -> Severity | None:
    """The worst severity among ``findings`` (``None`` when there is none)."""
    return max((f.severity for f in findings), default=None)


def owned_lines(findings: Iterable[Finding]) -> set[str]:
    """The kernel lines some container's Xid or OOM finding already shows (its evidence)."""
    return {e for f in findings if f.kind in ("xid", "oom-killer", "crashed") for e in f.evidence}
