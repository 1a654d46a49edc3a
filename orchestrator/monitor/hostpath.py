"""The host path: one host document becomes per-container snapshots, so history, detectors,
views and alerts stay per container (the monitor's half of :mod:`orchestrator.remote.hostlink`).

- :func:`fan_out` gives each container its snapshot: the GPUs it sees (numbered as it
  numbers them, each process named with its container and PID inside), the host's NVML
  status, and the kernel events that belong to it. Events that belong to no container of
  hosts.yaml are the host's: :func:`host_judgement` reports them once, for the host.
- :class:`HostFeed` does that for a stream, keeping each container's events since its run
  began (so an Xid stays a finding while the run lives) and the host's of the last hour,
  and fetching the tmux pane through ``pct exec`` only on demand (:func:`needs_pane`: a
  live run without its log, the tee-bypass check), at most every :data:`PANE_EVERY_S`.
- :func:`pump_host` feeds a queue from one host's stream with the one reconnect policy of
  :mod:`orchestrator.monitor.observe`; a lost stream makes every container unreachable.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.config.limits import Limits
from orchestrator.detect import host as host_detect
from orchestrator.detect.base import alive
from orchestrator.monitor.observe import BACKOFF_CAP_S, reconnecting
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

PANE_EVERY_S = 30.0
"""Least seconds between two on-demand pane captures of one container in a stream."""
HOST_EVENTS_KEEP_S = 3600.0
"""How long a host-wide event stays shown in a stream (seconds)."""
KEEP_EVENTS = 64
"""Most events kept per container (the newest)."""
MAX_PIDS = 4096
"""Run processes (host PIDs) a stream remembers, to place an OOM kill of one gone since."""
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
    chosen = list(doc.gpus) if visible is None else [g for h in visible for g in doc.gpus
                                                     if g.index == h]  # fmt: skip
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
            snap = Snapshot.unreachable(name, doc.taken_at, f"{doc.host}: the host observer "
                                        "did not report this container")  # fmt: skip
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


@dataclass
class HostView:
    """What a stream knows of one host: its events of the last hour and their findings."""

    host: str
    events: list[KernelEvent] = dataclasses.field(default_factory=list)
    findings: tuple[Finding, ...] = ()
    errors: tuple[str, ...] = ()
    taken_at: float | None = None


Pane = Callable[[str], "Snapshot | None"]
"""``pane(name)``: an in-container snapshot of ``name`` (its pane lines), or ``None``."""


class HostFeed:
    """Turns one host's stream of documents into per-container snapshots (see the module)."""

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        names: Sequence[str],
        *,
        pane: Pane | None = None,
        fallback: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.inventory = inventory
        self.host = host
        self.names = list(names)
        self.pane = pane
        self.fallback = fallback
        self.view = HostView(host)
        self._events: dict[str, list[KernelEvent]] = {n: [] for n in self.names}
        self._pane_at: dict[str, float] = {}
        self._pane: dict[str, Snapshot] = {}
        self._pids: dict[int, str] = {}

    def apply(self, doc: HostDocument) -> dict[str, Snapshot]:
        """The containers' snapshots of ``doc`` (events accumulated, panes when needed)."""
        snaps, host_events = fan_out(doc, self.inventory, self.names, self._pids)
        self._pids.update(run_host_pids(snaps.values()))
        if len(self._pids) > 4 * MAX_PIDS:
            self._pids = dict(list(self._pids.items())[-MAX_PIDS:])
        out = {}
        for name, snap in snaps.items():
            kept = self._events[name]
            started = (snap.run.manifest.started_at if snap.run is not None and snap.run.manifest
                       else None)  # fmt: skip
            kept.extend(snap.kernel_events)
            if started is not None:
                kept[:] = [e for e in kept if e.at is None or e.at >= started - 1.0]
            del kept[:-KEEP_EVENTS]
            snap = dataclasses.replace(snap, kernel_events=tuple(kept))
            out[name] = self._paned(name, snap)
        claimed = {g for snap in out.values() for g in host_detect.run_host_gpus([snap])}
        host_events = [e for e in host_events if e.gpu is None or e.gpu not in claimed]
        now = doc.taken_at
        self.view.events = [e for e in [*self.view.events, *host_events]
                            if e.at is None or now - e.at <= HOST_EVENTS_KEEP_S][-KEEP_EVENTS:]  # fmt: skip
        self.view.findings = tuple(host_judgement(self.host, self.view.events, Limits()))
        self.view.errors, self.view.taken_at = doc.errors, doc.taken_at
        return out

    def _paned(self, name: str, snap: Snapshot) -> Snapshot:
        if self.pane is None or not needs_pane(snap):
            self._pane.pop(name, None)
            return snap
        now = time.monotonic()
        if name not in self._pane or now - self._pane_at.get(name, 0.0) >= PANE_EVERY_S:
            self._pane_at[name] = now
            try:
                got = self.pane(name)
            except Exception as exc:  # noqa: BLE001 - the pane is extra; the snapshot stands
                log.info("%s: pane capture failed: %s", name, exc)
                got = None
            if got is not None:
                self._pane[name] = got
        return with_pane(snap, self._pane.get(name))

    def fell_back(self) -> bool:
        """Whether the host turned out unable to run the observer: its containers then go to
        ``fallback`` (observed from inside from now on), once."""
        from orchestrator.remote.hostlink import observe_path

        if self.fallback is None or not self.names:
            return False
        if observe_path(self.inventory, self.inventory.container(self.names[0])).mode == "host":
            return False
        log.warning("%s: observing %s from inside", self.host, ", ".join(self.names))
        self.fallback(self.names)
        self.fallback = None
        return True

    def gap(self, marker: Snapshot) -> dict[str, Snapshot]:
        """Every container unreachable, with the host stream's reason."""
        reason = "; ".join(marker.errors) or "host stream ended"
        return {n: Snapshot.unreachable(n, marker.taken_at, f"{self.host}: {reason}")
                for n in self.names}  # fmt: skip


def pump_host(
    feed: HostFeed,
    connect: Callable[[], Iterable[HostDocument]],
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    *,
    backoff_cap_s: float = BACKOFF_CAP_S,
) -> None:
    """Put ``(name, Snapshot)`` for every container of the host, and ``(HOST_PREFIX + host,
    HostView)`` after each document, on ``out`` until ``stop`` is set (a thread's body)."""
    items = reconnecting(feed.host, connect, backoff_cap_s=backoff_cap_s, sleep=stop.wait,
                         stop=stop)  # fmt: skip
    try:
        for item in items:
            if stop.is_set():
                return
            if not isinstance(item, HostDocument) and feed.fell_back():
                return
            batch = feed.apply(item) if isinstance(item, HostDocument) else feed.gap(item)
            for name, snap in batch.items():
                out.put((name, snap))
            out.put((HOST_PREFIX + feed.host, feed.view))
    finally:
        items.close()


def severity_of(findings: Iterable[Finding]) -> Severity | None:
    """The worst severity among ``findings`` (``None`` when there is none)."""
    return max((f.severity for f in findings), default=None)


@dataclass
class HostRound:
    """What one round of one-shot host observations (``orch check``) gave."""

    snaps: dict[str, Snapshot] = dataclasses.field(default_factory=dict)
    host_events: dict[str, list[KernelEvent]] = dataclasses.field(default_factory=dict)
    cursors: dict[str, tuple[str | None, float | None]] = dataclasses.field(default_factory=dict)
    fallback: list[str] = dataclasses.field(default_factory=list)
    """Containers whose host turned out unable to run the observer: observe them from inside."""


def read_round(
    inventory: Inventory,
    groups: Mapping[str, Sequence[str]],
    got: Mapping[str, Any],
    at: float,
    known_pids: Mapping[int, str] | None = None,
) -> HostRound:
    """Turn each host's answer (``got[host]``: a :class:`HostDocument` or the exception its
    observation raised) into per-container snapshots; a failed host's containers are
    unreachable with its reason, or fall back to the in-container path when the host cannot
    run the observer (:func:`~orchestrator.remote.hostlink.observe_path` says so by now)."""
    from orchestrator.monitor.observe import failure_reason
    from orchestrator.remote.hostlink import observe_path

    out = HostRound()
    for host, names in groups.items():
        value = got.get(host)
        if isinstance(value, HostDocument):
            snaps, events = fan_out(value, inventory, names, known_pids)
            out.snaps.update(snaps)
            out.host_events[host] = events
            out.cursors[host] = (value.kernel_cursor, value.taken_at)
            continue
        first = inventory.container(names[0])
        if observe_path(inventory, first).mode == "container":
            out.fallback.extend(names)
            continue
        reason = f"{host}: {failure_reason(value)}"
        log.info("%s", reason)
        out.snaps.update({n: Snapshot.unreachable(n, at, reason) for n in names})
    return out


def owned_lines(findings: Iterable[Finding]) -> set[str]:
    """The kernel lines some container's Xid or OOM finding already shows (its evidence)."""
    return {e for f in findings if f.kind in ("xid", "oom-killer", "crashed") for e in f.evidence}
