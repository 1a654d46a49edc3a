"""One host's documents, in order, as per-container snapshots (a stream's or a round's).

:class:`HostFeed` keeps, per container, the kernel events since its run began (so an Xid stays
a finding while the run lives; each line once, so two documents read from the same kernel
cursor add nothing twice), the host PIDs of the runs (to place an OOM kill of a process gone
since), and fetches the tmux pane through ``pct exec`` only on demand
(:func:`~orchestrator.monitor.hostpath.needs_pane`: a live run without its log), at most every
:data:`PANE_EVERY_S`. :func:`pump_host` feeds a queue from one host's stream with the one
reconnect policy of :mod:`orchestrator.monitor.observe`; a lost stream makes every container
unreachable.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.monitor.hostpath import (
    HOST_PREFIX,
    HostView,
    fan_out,
    needs_pane,
    run_host_pids,
    with_pane,
)
from orchestrator.monitor.observe import BACKOFF_CAP_S, reconnecting
from orchestrator.wire.model import HostDocument, KernelEvent, Snapshot

log = logging.getLogger(__name__)

PANE_EVERY_S = 30.0
"""Least seconds between two on-demand pane captures of one container."""
KEEP_EVENTS = 64
"""Most events kept per container (the newest)."""
MAX_PIDS = 4096
"""Run processes (host PIDs) a feed remembers, to place an OOM kill of one gone since."""

Pane = Callable[[str], "Snapshot | None"]
"""``pane(name)``: an in-container snapshot of ``name`` (its pane lines), or ``None``."""


class HostFeed:
    """Turns one host's documents into per-container snapshots (see the module)."""

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        names: Sequence[str],
        *,
        pane: Pane | None = None,
        fallback: Callable[[list[str]], None] | None = None,
        known_pids: dict[int, str] | None = None,
    ) -> None:
        self.inventory = inventory
        self.host = host
        self.names = list(names)
        self.pane = pane
        self.fallback = fallback
        self._events: dict[str, list[KernelEvent]] = {n: [] for n in self.names}
        self._pane_at: dict[str, float] = {}
        self._pane: dict[str, Snapshot] = {}
        self._pids: dict[int, str] = dict(known_pids or {})

    def apply(self, doc: HostDocument) -> tuple[dict[str, Snapshot], HostView]:
        """The containers' snapshots of ``doc`` (events accumulated, panes when needed) and
        the host's candidate events of ``doc`` (:func:`~orchestrator.monitor.hostpath.host_own`
        decides which are its own)."""
        snaps, host_events = fan_out(doc, self.inventory, self.names, self._pids)
        self._pids.update(run_host_pids(snaps.values()))
        if len(self._pids) > 4 * MAX_PIDS:
            self._pids = dict(list(self._pids.items())[-MAX_PIDS:])
        out = {}
        for name, snap in snaps.items():
            kept = self._events[name]
            run = snap.run
            started = run.manifest.started_at if run is not None and run.manifest else None
            kept.extend(e for e in snap.kernel_events if e not in kept)
            if started is not None:
                kept[:] = [e for e in kept if e.at is None or e.at >= started - 1.0]
            del kept[:-KEEP_EVENTS]
            snap = dataclasses.replace(snap, kernel_events=tuple(kept))
            out[name] = self._paned(name, snap)
        view = HostView(self.host, host_events, errors=doc.errors, taken_at=doc.taken_at)
        return out, view

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
        return {
            n: Snapshot.unreachable(n, marker.taken_at, f"{self.host}: {reason}")
            for n in self.names
        }


def pump_host(
    feed: HostFeed,
    connect: Callable[[], Iterable[HostDocument]],
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    *,
    backoff_cap_s: float = BACKOFF_CAP_S,
) -> None:
    """Put ``(name, Snapshot)`` for every container of the host, and ``(HOST_PREFIX + host,
    HostView)`` (the document's candidate host events) after each document, on ``out`` until
    ``stop`` is set (a thread's body)."""
    items = reconnecting(
        feed.host, connect, backoff_cap_s=backoff_cap_s, sleep=stop.wait, stop=stop
    )
    try:
        for item in items:
            if stop.is_set():
                return
            if not isinstance(item, HostDocument):
                if feed.fell_back():
                    return
                batch, view = feed.gap(item), HostView(feed.host, taken_at=item.taken_at)
            else:
                batch, view = feed.apply(item)
            for name, snap in batch.items():
                out.put((name, snap))
            out.put((HOST_PREFIX + feed.host, view))
    finally:
        items.close()
