"""The judgements of a fleet from what the observer saw: each target's history window judged
(:func:`~orchestrator.monitor.judge.judge`), each host's own events of the last hour judged by
the one rule (:func:`~orchestrator.monitor.hostpath.host_own`). Thread-safe (a stream's judge
thread and an exporter's rounds share one); no I/O.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence

from orchestrator.config.inventory import Inventory
from orchestrator.config.limits import Limits
from orchestrator.detect.host import run_host_gpus
from orchestrator.monitor.hostpath import (
    HOST_EVENTS_KEEP_S,
    HOST_PREFIX,
    KEEP_HOST_EVENTS,
    HostView,
    host_judgement,
    host_own,
    owned_lines,
)
from orchestrator.monitor.judge import Judgement, TargetHistory, with_unreachable
from orchestrator.monitor.state import target_state
from orchestrator.wire.model import Finding, HostProbe, KernelEvent, Snapshot

log = logging.getLogger(__name__)


class Ledger:
    """The newest judgement of every target and the view of every host (see the module)."""

    def __init__(self, inventory: Inventory, names: Sequence[str]) -> None:
        self.inventory = inventory
        self.histories = {n: TargetHistory(n, inventory.container(n)) for n in names}
        self.latest: dict[str, Judgement] = {}
        self.hosts: dict[str, HostView] = {}
        self.lock = threading.RLock()

    def seed(self, name: str, snaps: Iterable[Snapshot]) -> None:
        """Earlier snapshots of ``name`` (a stored history, oldest first), not judged."""
        with self.lock:
            self.histories[name].snapshots.extend(snaps)

    def judge(self, name: str, snap: Snapshot, probes: Sequence[HostProbe] = ()) -> Judgement:
        """``snap`` added to ``name``'s window and judged; a detector that raises leaves the
        ``unreachable`` finding alone (logged: a monitor must not stop on a detector bug)."""
        with self.lock:
            hist = self.histories[name]
            try:
                j = hist.add(snap, probes)
            except Exception:
                log.exception("%s: detectors failed", name)
                cfg = hist.config
                findings = with_unreachable(name, snap, [])
                state = target_state(snap, findings, startup_grace_s=cfg.limits.startup_grace_s)
                j = Judgement(name, snap, state, tuple(findings), host=cfg.host)
            self.latest[name] = j
            return j

    def saw_host(self, view: HostView) -> HostView:
        """Take in a host's candidate events (a document's or a probe's, newest last); its view
        now: the events of the last :data:`HOST_EVENTS_KEEP_S` and their findings."""
        with self.lock:
            old = self.hosts.get(view.host) or HostView(view.host)
            now = view.taken_at if view.taken_at is not None else old.taken_at or 0.0
            events = [
                e
                for e in dict.fromkeys([*old.events, *view.events])
                if e.at is None or now - e.at <= HOST_EVENTS_KEEP_S
            ]
            new = HostView(
                view.host,
                events[-KEEP_HOST_EVENTS:],
                old.findings,
                view.errors,
                view.taken_at or old.taken_at,
            )
            self.hosts[view.host] = new
            return self._judged(new)

    def _judged(self, view: HostView) -> HostView:
        """``view``'s findings set from its own events; a copy whose events are those."""
        own = self.own_events(view.host, view.events)
        view.findings = tuple(host_judgement(view.host, own, Limits()))
        return dataclasses.replace(view, events=own)

    def own_events(self, host: str, events: Iterable[KernelEvent]) -> list[KernelEvent]:
        """:func:`host_own` with what this ledger knows of ``host``'s containers."""
        with self.lock:
            on_host = [c for c in self.inventory.containers.values() if c.host == host]
            vmids = {c.vmid for c in on_host if c.vmid is not None}
            claimed: set[int] = set()
            for c in on_host:
                if c.name in self.histories:
                    claimed |= run_host_gpus(list(self.histories[c.name].snapshots)[-2:])
            shown = owned_lines(f for j in self.latest.values() for f in j.findings)
            return host_own(events, vmids, claimed, shown)

    def host_judgements(self) -> list[Judgement]:
        """One judgement per host whose own events have findings, by host name."""
        out = []
        with self.lock:
            for host in sorted(self.hosts):
                view = self._judged(self.hosts[host])
                if view.findings:
                    name = HOST_PREFIX + host
                    snap = Snapshot(name, view.taken_at or 0.0, kernel_events=tuple(view.events))
                    out.append(Judgement(name, snap, "host", view.findings, host=host))
        return out

    def findings(self) -> list[Finding]:
        """Every target's newest findings."""
        with self.lock:
            return [f for j in self.latest.values() for f in j.findings]
