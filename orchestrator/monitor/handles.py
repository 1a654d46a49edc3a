"""What the observer holds per fleet: which path each target takes, the handles that reach it
(one :class:`~orchestrator.remote.target.Target` per container, one
:class:`~orchestrator.remote.hostlink.HostLink` and :class:`~orchestrator.monitor.hostfeed.HostFeed`
per host, kept so each log and each kernel log continues), the pane on demand, the intervals
of hosts.yaml, and the ledger its judgements go to. :mod:`orchestrator.monitor.rounds` and
:mod:`orchestrator.monitor.streams` work over it; :class:`~orchestrator.monitor.observer.Observer`
is the one object callers use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.monitor.hostfeed import HostFeed
from orchestrator.monitor.ledger import Ledger
from orchestrator.monitor.observe import DEFAULT_JOBS, Connect
from orchestrator.remote.target import Target
from orchestrator.wire.model import Metrics, Snapshot

DEFAULT_INTERVAL_S = 2.0
"""Seconds between snapshots of a stream when no container names ``poll_interval:``."""

Fetch = Callable[[str, "tuple[str, int] | None"], Snapshot]
"""``fetch(name, resume) -> Snapshot``: one target's one-shot snapshot, continuing the log at
``resume`` (run id, byte offset) when given (tests feed recorded snapshots through it)."""


class Handles:
    """The observer's hold on the containers ``names`` of ``inventory`` (see the module).

    ``fetch`` stands in for every one-shot snapshot (and the pane) and ``connect(name)`` for
    every stream: both put every target on the in-container path, unless ``host_link(host,
    names)`` stands in for the host observer (a recorded host). ``timeout_s`` is a round's
    deadline.
    """

    def __init__(
        self,
        inventory: Inventory,
        names: Sequence[str],
        *,
        timeout_s: float = 30.0,
        workers: int = DEFAULT_JOBS,
        fetch: Fetch | None = None,
        connect: Callable[[str], Connect] | None = None,
        host_link: Callable[[str, Sequence[str]], Any] | None = None,
    ) -> None:
        self.inventory = inventory
        self.names = list(names)
        self.timeout_s = timeout_s
        self.workers = workers
        self.fetch = fetch
        self.connect = connect
        self.host_link = host_link
        self.ledger = Ledger(inventory, self.names)
        self.resume: dict[str, tuple[str, int]] = {}
        """Where each run's log continues (the next round reads only what is new)."""
        self.cursors: dict[str, tuple[str | None, float | None]] = {}
        """Per host: the kernel-log cursor and the time of its newest event seen."""
        self.progress: dict[str, tuple[str, Metrics]] = {}
        """Per target: its run and the newest progress its log printed (see :meth:`carry`)."""
        self.streaming: set[str] = set()
        """Targets a stream observes now (rounds leave them out)."""
        self._targets: dict[str, Target] = {}
        self._feeds: dict[str, HostFeed] = {}
        self.links: dict[str, Any] = {}
        """Per host: its :class:`~orchestrator.remote.hostlink.HostLink` (kept between rounds)."""
        self._lock = threading.Lock()

    def groups(self, names: Iterable[str] | None = None) -> dict[str, list[str]]:
        """The targets observed from their host now, by host (none with ``fetch``/``connect``
        and no ``host_link``)."""
        if self.host_link is None and (self.fetch is not None or self.connect is not None):
            return {}
        from orchestrator.remote.hostlink import host_groups

        return host_groups(self.inventory, list(self.names if names is None else names))

    def interval_s(self, names: Iterable[str] | None = None) -> float:
        """Seconds between snapshots of ``names`` (all): the shortest ``poll_interval:`` of
        hosts.yaml among them."""
        chosen = self.names if names is None else list(names)
        got = [self.inventory.container(n).poll_interval_s for n in chosen]
        return min(got, default=DEFAULT_INTERVAL_S)

    def target(self, name: str) -> Target:
        """The one :class:`Target` of ``name`` (kept: its stream resumes the log)."""
        with self._lock:
            t = self._targets.get(name)
            if t is None:
                t = self._targets[name] = Target(self.inventory, name)
            return t

    def forget(self, name: str) -> None:
        """Drop ``name``'s :class:`Target` (its next call reconnects)."""
        with self._lock:
            self._targets.pop(name, None)

    def pane(self, name: str) -> Snapshot | None:
        """An in-container snapshot of ``name`` for its pane lines (on demand)."""
        if self.fetch is not None:
            return self.fetch(name, None)
        return self.target(name).snapshot(timeout=self.timeout_s)

    def link(self, host: str, names: Sequence[str]) -> Any:
        """The one :class:`~orchestrator.remote.hostlink.HostLink` of ``host``, set to continue
        each log and the kernel log where this observer stopped."""
        from orchestrator.remote.hostlink import HostLink

        link = self.links.get(host)
        if link is None or link.names != list(names):
            make = self.host_link or (lambda h, ns: HostLink(self.inventory, h, ns))
            link = self.links[host] = make(host, names)
        link.resume = {n: self.resume[n] for n in names if n in self.resume}
        link.cursor, link.since = self.cursors.get(host, (None, None))
        return link

    def feed(self, host: str, names: Sequence[str], **kw: Any) -> HostFeed:
        """The :class:`HostFeed` of ``host`` for rounds (kept: its events and PIDs carry on)."""
        feed = self._feeds.get(host)
        if feed is None or feed.names != list(names):
            feed = self._feeds[host] = HostFeed(self.inventory, host, names, pane=self.pane, **kw)
        return feed

    def carry(self, snap: Snapshot, earlier: Snapshot | None = None) -> Snapshot:
        """``snap`` with the newest progress its run printed: a read that continues the log
        (:attr:`resume`) after the last progress line sees no line of its own, yet the run's
        step is still that one (an agent's stream carries it the same way). ``earlier``: the
        first sample of a pair, read before ``snap``."""
        for s in (earlier, snap):
            if s is not None and s.reachable and s.run and s.run.run_id and s.metrics is not None:
                self.progress[s.target] = (s.run.run_id, s.metrics)
        run, got = snap.run, self.progress.get(snap.target)
        if snap.metrics is None and snap.reachable and run and got and got[0] == run.run_id:
            return replace(snap, metrics=got[1])
        return snap

    def remember(self, snaps: Iterable[Snapshot]) -> None:
        """Continue each run's log after ``snaps``."""
        for s in snaps:
            if s.reachable and s.run is not None and s.run.run_id:
                self.resume[s.target] = (s.run.run_id, s.run.log_offset)
