"""``orch export``'s source: the newest judgement of every target, refreshed by one concurrent
round of one-shot snapshots per :meth:`Poller.poll_once` over an in-memory history (the
detection window), so a scrape never waits on SSH.

Containers observed from their host come one document per host: one call per round, or,
after :meth:`Poller.stream`, ONE stream per host that judges each document as it comes
(the round then asks only the containers observed from inside).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.config.limits import Limits
from orchestrator.monitor.hostpath import (
    HOST_PREFIX,
    HostFeed,
    HostView,
    host_judgement,
    pump_host,
    read_round,
    run_host_pids,
)
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import Judgement, TargetHistory, with_unreachable
from orchestrator.monitor.observe import DEFAULT_JOBS, as_snapshot, gather
from orchestrator.monitor.state import target_state
from orchestrator.remote.target import Target
from orchestrator.wire.model import HostDocument, Snapshot

log = logging.getLogger(__name__)


class Poller:
    """Keeps the newest :class:`Judgement` of each target, refreshed by :meth:`poll_once`.

    ``fetch(name) -> Snapshot`` is the one-shot snapshot (default:
    ``Target(inventory, name).snapshot()``, one Target per name kept between rounds); it is
    injected so that tests and the benchmark can reuse the poller.
    """

    def __init__(
        self,
        inventory: Inventory,
        names: Sequence[str],
        *,
        timeout_s: float = 30.0,
        workers: int = DEFAULT_JOBS,
        fetch: Callable[[str], Snapshot] | None = None,
        jobs: Sequence[str] = (),
    ) -> None:
        self.inventory = inventory
        self.names = list(names)
        self.jobs = [
            inventory.job(j) for j in jobs if all(n in names for n in inventory.job(j).containers)
        ]
        self.timeout_s = timeout_s
        self.workers = workers
        self._fetch = fetch or self._snapshot
        self._lock = threading.Lock()
        self._latest: dict[str, Judgement] = {}
        self._history = {n: TargetHistory(n, inventory.container(n)) for n in self.names}
        self._targets: dict[str, Target] = {}
        self._hosts: dict[str, Judgement] = {}
        self._links: dict[str, Any] = {}
        self._streaming: set[str] = set()
        self._stop = threading.Event()
        self.groups: dict[str, list[str]] = {}
        if fetch is None:
            from orchestrator.remote.hostlink import host_groups

            self.groups = host_groups(inventory, self.names)

    def latest(self) -> list[Judgement]:
        """The newest judgement of every target polled at least once, in the order given."""
        with self._lock:
            return [self._latest[n] for n in self.names if n in self._latest]

    def hosts(self) -> list[Judgement]:
        """The hosts' own findings (kernel events no container owns), one judgement per host."""
        with self._lock:
            return [self._hosts[h] for h in sorted(self._hosts)]

    def stream(self, interval_s: float) -> None:
        """Observe the host-path containers over ONE stream per host from now on (threads)."""
        from orchestrator.remote.hostlink import HostLink

        items: queue.Queue[tuple[str, Any]] = queue.Queue()
        for host, names in self.groups.items():
            link = HostLink(self.inventory, host, names)

            def connect(link: HostLink = link) -> Iterable[HostDocument]:
                return link.stream_once(interval_s)

            feed = HostFeed(self.inventory, host, names, pane=self._snapshot,
                            fallback=self._streaming.difference_update)  # fmt: skip
            threading.Thread(target=pump_host, args=(feed, connect, items, self._stop),
                             name=f"export-host-{host}", daemon=True).start()  # fmt: skip
            self._streaming.update(names)
        threading.Thread(
            target=self._drain, args=(items,), name="export-judge", daemon=True
        ).start()

    def _drain(self, items: queue.Queue[tuple[str, Any]]) -> None:
        while not self._stop.is_set():
            try:
                name, item = items.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, HostView):
                self._host(item.host, item.findings, item.taken_at or time.time(), item.events)
            else:
                self._judge(name, item)

    def _host(
        self, host: str, findings: Sequence[Any], at: float, events: Sequence[Any] = ()
    ) -> None:
        """The host's judgement; its snapshot keeps the host's own kernel events (export's
        per-GPU Xid gauge reads them)."""
        with self._lock:
            if findings:
                name = HOST_PREFIX + host
                snap = Snapshot(name, at, kernel_events=tuple(events))
                self._hosts[host] = Judgement(name, snap, "host", tuple(findings), host=host)
            else:
                self._hosts.pop(host, None)

    def latest_jobs(self) -> list[JobJudgement]:
        """Each job of ``jobs`` judged from its nodes' newest judgements and histories."""
        with self._lock:
            latest = dict(self._latest)
            hist = {n: list(h.snapshots) for n, h in self._history.items()}
        out = []
        for job in self.jobs:
            containers = {n: self.inventory.container(n) for n in job.containers}
            out.append(judge_job(job, containers, latest, histories=hist))
        return out

    def _snapshot(self, name: str) -> Snapshot:
        t = self._targets.get(name)
        if t is None:
            t = self._targets[name] = Target(self.inventory, name)
        return t.snapshot()

    def poll_once(self) -> None:
        """One concurrent round of snapshots, then the judgement; never raises for a target."""
        from orchestrator.remote.hostlink import HostLink, observe_path

        live = {h: ns for h, ns in self.groups.items()
                if observe_path(self.inventory, self.inventory.container(ns[0])).mode == "host"}  # fmt: skip
        on_host = {n for ns in live.values() for n in ns}

        def job(name: str) -> Callable[[], Snapshot]:
            return lambda: self._fetch(name)

        def host_job(host: str) -> Callable[[], Any]:
            link = self._links.get(host) or self._links.setdefault(
                host, HostLink(self.inventory, host, self.groups[host]))  # fmt: skip
            return lambda: link.observe(timeout=self.timeout_s)

        jobs: dict[str, Callable[[], Any]] = {n: job(n) for n in self.names if n not in on_host}
        hosts = [h for h in live if not set(live[h]) <= self._streaming]
        jobs.update({f"{HOST_PREFIX}{h}": host_job(h) for h in hosts})
        got = gather(jobs, workers=self.workers, timeout_s=self.timeout_s)
        now = time.time()
        known = run_host_pids(h.snapshots[-1] for h in self._history.values() if h.snapshots)
        hosted = read_round(self.inventory, {h: self.groups[h] for h in hosts},
                            {h: got.get(HOST_PREFIX + h) for h in hosts}, now, known)  # fmt: skip
        if hosted.fallback:
            got.update(gather({n: job(n) for n in hosted.fallback}, workers=self.workers,
                              timeout_s=self.timeout_s))  # fmt: skip
        for n in self.names:
            if n in hosted.snaps:
                self._judge(n, hosted.snaps[n])
            elif n in got:
                snap = as_snapshot(n, got[n], now)
                if snap is not got[n]:
                    self._targets.pop(n, None)  # reconnect next round
                self._judge(n, snap)
        for h, events in hosted.host_events.items():
            self._host(h, host_judgement(h, events, Limits()), now, events)

    def _judge(self, n: str, snap: Snapshot) -> None:
        hist = self._history[n]
        try:
            j = hist.add(snap)
        except Exception:  # noqa: BLE001 - a detector bug must not stop the exporter
            log.exception("%s: detectors failed", n)
            cfg = hist.config
            findings = with_unreachable(n, snap, [])
            state = target_state(snap, findings, startup_grace_s=cfg.limits.startup_grace_s)
            j = Judgement(n, snap, state, tuple(findings), host=cfg.host)
        with self._lock:
            self._latest[n] = j

    def close(self) -> None:
        """Stop the host streams; the transports are pooled per host (``close_all`` at exit)."""
        self._stop.set()
