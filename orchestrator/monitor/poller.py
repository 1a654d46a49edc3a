"""``orch export``'s source: the newest judgement of every target, refreshed by one concurrent
round of one-shot snapshots per :meth:`Poller.poll_once` over an in-memory history (the
detection window), so a scrape never waits on SSH.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from orchestrator.config.inventory import Inventory
from orchestrator.model import Snapshot
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import Judgement, TargetHistory, with_unreachable
from orchestrator.monitor.observe import DEFAULT_JOBS, as_snapshot, gather
from orchestrator.monitor.state import target_state
from orchestrator.target import Target

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

    def latest(self) -> list[Judgement]:
        """The newest judgement of every target polled at least once, in the order given."""
        with self._lock:
            return [self._latest[n] for n in self.names if n in self._latest]

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

        def job(name: str) -> Callable[[], Snapshot]:
            return lambda: self._fetch(name)

        got = gather(
            {n: job(n) for n in self.names},
            workers=self.workers,
            timeout_s=self.timeout_s,
        )
        now = time.time()
        for n in self.names:
            snap = as_snapshot(n, got[n], now)
            if snap is not got[n]:
                self._targets.pop(n, None)  # reconnect next round
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
        """Nothing to close: the transports are pooled per host (``close_all`` at exit)."""
