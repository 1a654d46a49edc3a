"""The observer's streams: one daemon thread per host stream
(:func:`~orchestrator.monitor.hostfeed.pump_host`) and per in-container stream
(:func:`~orchestrator.monitor.observe.pump`), and one that judges what they bring through the
observer's ledger and puts ``(name, Judgement)`` and ``(host:<name>, HostView)`` on the
caller's queue. A stream's interval is ``interval_s`` when given, else the shortest
``poll_interval:`` of hosts.yaml among the containers it observes.

Also the restart journal's follower (``orch watch`` shows ``orch supervise``'s decisions).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.monitor.history import read_journal
from orchestrator.monitor.hostfeed import HostFeed, pump_host
from orchestrator.monitor.hostpath import HostView
from orchestrator.monitor.observe import Connect, pump
from orchestrator.wire.model import HostDocument, Snapshot

if TYPE_CHECKING:
    from orchestrator.config.inventory import Inventory
    from orchestrator.monitor.handles import Handles

JOURNAL = "\x00journal"
"""The queue's name for a restart-journal update: the item is ``(target, entries)``."""
JOURNAL_POLL_S = 2.0


def start(
    obs: Handles,
    out: queue.Queue[tuple[str, Any]] | None,
    stop: threading.Event,
    *,
    interval_s: float | None = None,
    inside: bool = True,
    names: Collection[str] | None = None,
) -> None:
    """Stream ``names`` (default all) until ``stop`` is set. ``inside=False``: only the host
    path is streamed (the others, and a host's containers once it falls back, are left to
    rounds: :attr:`Observer.streaming` says which are streamed)."""
    chosen = [n for n in obs.names if names is None or n in names]
    raw: queue.Queue[tuple[str, Any]] = queue.Queue()

    def in_container(group: Sequence[str]) -> None:
        if not inside:
            obs.streaming.difference_update(group)
            return
        for n in group:
            obs.streaming.add(n)
            threading.Thread(
                target=pump,
                args=(n, _connect(obs, n, interval_s), raw, stop),
                name=f"observe-{n}",
                daemon=True,
            ).start()

    groups = obs.groups(chosen)
    for host, group in groups.items():
        feed = HostFeed(obs.inventory, host, group, pane=obs.pane, fallback=in_container)
        every = interval_s if interval_s is not None else obs.interval_s(group)
        link = obs.link(host, group)

        def connect(link: Any = link, every: float = every) -> Iterable[HostDocument]:
            return link.stream_once(every)  # type: ignore[no-any-return]

        obs.streaming.update(group)
        threading.Thread(
            target=pump_host,
            args=(feed, connect, raw, stop),
            name=f"observe-host-{host}",
            daemon=True,
        ).start()
    in_container([n for n in chosen if not any(n in g for g in groups.values())])
    threading.Thread(
        target=_judging, args=(obs, raw, out, stop), name="observe-judge", daemon=True
    ).start()


def _connect(obs: Handles, name: str, interval_s: float | None) -> Connect:
    if obs.connect is not None:
        return obs.connect(name)
    target = obs.target(name)

    def connect() -> Iterable[Snapshot]:
        return target.stream_once(interval_s)  # None: the container's poll_interval:

    return connect


def _judging(
    obs: Handles,
    raw: queue.Queue[tuple[str, Any]],
    out: queue.Queue[tuple[str, Any]] | None,
    stop: threading.Event,
) -> None:
    while not stop.is_set():
        try:
            name, item = raw.get(timeout=0.5)
        except queue.Empty:
            continue
        judged = (
            obs.ledger.saw_host(item)
            if isinstance(item, HostView)
            else obs.ledger.judge(name, item)
        )
        if out is not None:
            out.put((name, judged))


def follow_journal(
    names: Sequence[str],
    db: Any,
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    inventory: Inventory | None = None,
) -> None:
    """Put ``(JOURNAL, (name, entries))`` whenever a target's restart journal changed, every
    :data:`JOURNAL_POLL_S` until ``stop`` is set (a daemon thread)."""

    def loop() -> None:
        seen: dict[str, int | None] = {}
        while not stop.is_set():
            for name, entries in read_journal(names, db, limit=5, inventory=inventory).items():
                last = entries[-1].id if entries else None
                if seen.get(name, -1) != last:
                    seen[name] = last
                    out.put((JOURNAL, (name, entries)))
            stop.wait(JOURNAL_POLL_S)

    threading.Thread(target=loop, name="watch-journal", daemon=True).start()
