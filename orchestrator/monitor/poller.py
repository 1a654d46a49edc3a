"""``orch export``'s source: the newest judgement of every target, refreshed by one round of the
observer per :meth:`Poller.poll_once` over an in-memory history (the detection window), so a
scrape never waits on SSH. After :meth:`Poller.stream`, the containers observed from their
host come over ONE stream per host, judged as each document comes (the rounds then ask only
the containers observed from inside).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.observe import DEFAULT_JOBS
from orchestrator.monitor.observer import Observer
from orchestrator.wire.model import Snapshot


class Poller:
    """Keeps the newest :class:`Judgement` of each target, refreshed by :meth:`poll_once`.

    ``fetch(name) -> Snapshot`` stands in for the one-shot snapshot and ``host_link`` for each
    host's observer (tests, the benchmark).
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
        host_link: Callable[[str, Sequence[str]], Any] | None = None,
    ) -> None:
        self.inventory = inventory
        self.names = list(names)
        self.jobs = [
            inventory.job(j) for j in jobs if all(n in names for n in inventory.job(j).containers)
        ]
        one = (lambda n, _resume: fetch(n)) if fetch is not None else None
        self.observer = Observer(
            inventory,
            self.names,
            timeout_s=timeout_s,
            workers=workers,
            fetch=one,
            host_link=host_link,
        )
        self._stop = threading.Event()

    def latest(self) -> list[Judgement]:
        """The newest judgement of every target polled at least once, in the order given."""
        with self.observer.ledger.lock:
            latest = self.observer.ledger.latest
            return [latest[n] for n in self.names if n in latest]

    def hosts(self) -> list[Judgement]:
        """The hosts' own findings (kernel events no container owns), one judgement per host."""
        return self.observer.ledger.host_judgements()

    def stream(self, interval_s: float) -> None:
        """Observe the host-path containers over ONE stream per host from now on (threads)."""
        self.observer.start(None, self._stop, interval_s=interval_s, inside=False)

    def latest_jobs(self) -> list[JobJudgement]:
        """Each job of ``jobs`` judged from its nodes' newest judgements and histories."""
        ledger = self.observer.ledger
        with ledger.lock:
            latest = dict(ledger.latest)
            hist = {n: list(h.snapshots) for n, h in ledger.histories.items()}
        out = []
        for job in self.jobs:
            containers = {n: self.inventory.container(n) for n in job.containers}
            out.append(judge_job(job, containers, latest, histories=hist))
        return out

    def poll_once(self) -> None:
        """One round of the observer, then the judgement; never raises for a target."""
        ledger = self.observer.ledger
        with ledger.lock:
            past = {n: list(h.snapshots) for n, h in ledger.histories.items()}
        got = self.observer.round(past=past)
        for n in self.names:
            if n in got.snaps:
                ledger.judge(n, got.snaps[n])
        for view in got.hosts.values():
            ledger.saw_host(view)

    def close(self) -> None:
        """Stop the host streams; the transports are pooled per host (``close_all`` at exit)."""
        self._stop.set()
