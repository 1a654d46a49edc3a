"""``orch watch``'s model: what is shown about each target, fed one snapshot at a time (main
thread only). The judgement (history window, findings, state word) is the monitor's
(:func:`orchestrator.monitor.judge.judge`); this keeps what only the screen needs: the
newest readings, "unreachable since", the tokens/s sparkline and the log tail.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.inventory import ContainerConfig
from orchestrator.config.jobs import JobConfig
from orchestrator.monitor.hostpath import HostView
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.journal import JournalEntry
from orchestrator.monitor.judge import DETECT_WINDOW, Judgement, judge, with_unreachable
from orchestrator.monitor.state import target_state
from orchestrator.wire.model import Finding, GpuSample, Snapshot

log = logging.getLogger(__name__)

Judge = Callable[[str, ContainerConfig, Sequence[Snapshot]], Judgement]
"""``judge(name, config, history) -> Judgement``: the monitor's, or a stand-in in tests."""


@dataclass
class TargetView:
    """Everything shown about one target. Mutated by :class:`WatchModel` only.

    ``config`` defaults to a bare container of that name (default limits, no GPU roles).
    """

    name: str
    roles: dict[int, str] = field(default_factory=dict)
    config: ContainerConfig | None = None
    history: collections.deque[Snapshot] = field(
        default_factory=lambda: collections.deque(maxlen=DETECT_WINDOW)
    )
    current: Snapshot | None = None
    last_good: Snapshot | None = None
    unreachable_since: float | None = None
    findings: tuple[Finding, ...] = ()
    state: str = "connecting"
    rates: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=60))
    """The run's newest throughput readings, all in ``rate_unit`` (a new unit starts afresh)."""
    rate_unit: str | None = None
    log_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))
    run_id: str | None = None
    journal: tuple[JournalEntry, ...] = ()
    """The newest restart-journal entries of this target (``orch supervise``'s decisions)."""
    gpu_changes: tuple[GpuSample, ...] = ()
    """The GPUs of the last snapshot taken in whose ``--plain`` numbers (:func:`gpu_key`)
    differ from the ones before (all of them at first; none for an unreachable marker)."""
    gpu_keys: dict[int, tuple[Any, ...]] = field(default_factory=dict)

    def signature(self) -> tuple[Any, ...]:
        """What counts as a change for ``--plain``: state, run, findings, a new restart-journal
        entry (not every step)."""
        return (
            self.state,
            self.run_id,
            self.unreachable_since,
            tuple(sorted((f.kind, int(f.severity), f.gpus) for f in self.findings)),
            self.journal[-1].id if self.journal else None,
        )

    @property
    def shown(self) -> Snapshot | None:
        """The snapshot to draw readings from: the newest one that has data."""
        return self.last_good

    @property
    def container(self) -> ContainerConfig:
        return self.config or ContainerConfig(name=self.name, host="local")


def gpu_key(g: GpuSample) -> tuple[Any, ...]:
    """What counts as a change of a GPU's ``--plain`` line: its numbers as printed
    (utilisation, memory in MiB, temperature and power, whole units) and its error.

    >>> gpu_key(GpuSample(0, utilization_pct=97.6, memory_used_mib=118234.4)) == gpu_key(
    ...     GpuSample(0, utilization_pct=98.1, memory_used_mib=118233.9))
    True
    """

    def whole(x: float | None) -> int | None:
        return None if x is None else round(x)

    return (whole(g.utilization_pct), whole(g.memory_used_mib), whole(g.memory_total_mib),
            whole(g.temperature_c), whole(g.power_w), whole(g.power_limit_w), g.error)  # fmt: skip


class WatchModel:
    """The state of every watched target, fed one snapshot at a time (main thread); ``jobs``
    are shown as one row each, their nodes beneath (:meth:`job_rows`)."""

    def __init__(
        self, views: Iterable[TargetView], judge: Judge = judge, jobs: Sequence[JobConfig] = ()
    ) -> None:
        self.views: dict[str, TargetView] = {v.name: v for v in views}
        self.judge = judge
        self.jobs = [j for j in jobs if all(n in self.views for n in j.containers)]
        self.messages: collections.deque[str] = collections.deque(maxlen=3)
        self.hosts: dict[str, HostView] = {}

    def apply_host(self, view: HostView) -> bool:
        """Take in a host's own findings; ``True`` when they changed."""

        def sig(v: HostView | None) -> tuple[Any, ...]:
            return (
                tuple(sorted((f.kind, int(f.severity), f.summary) for f in v.findings)) if v else ()
            )

        before = sig(self.hosts.get(view.host))
        self.hosts[view.host] = dataclasses.replace(view, findings=tuple(view.findings))
        return sig(self.hosts[view.host]) != before

    def apply_journal(self, name: str, entries: Sequence[JournalEntry]) -> bool:
        """Take in ``name``'s newest restart-journal entries; ``True`` when one is new."""
        v = self.views[name]
        before = v.signature()
        v.journal = tuple(entries)
        return v.signature() != before

    def job_rows(self) -> list[JobJudgement]:
        """Each job's judgement from its nodes' (the monitor's :func:`judge_job`; no host
        probes here: a node's death and its log, not its host's kernel log)."""
        out = []
        for job in self.jobs:
            nodes = [self.views[n] for n in job.containers]
            judged = {
                v.name: Judgement(v.name, v.current, v.state, v.findings, host=v.container.host)
                for v in nodes
                if v.current is not None
            }
            try:
                out.append(
                    judge_job(
                        job,
                        {v.name: v.container for v in nodes},
                        judged,
                        histories={v.name: list(v.history) for v in nodes},
                    )
                )
            except Exception as exc:  # lenient in views: show, carry on
                log.debug("job %s not judged", job.name, exc_info=True)
                self.messages.append(f"{job.name}: not judged: {exc}")
        return out

    def apply(self, name: str, snap: Snapshot, judged: Judgement | None = None) -> bool:
        """Take in ``snap`` for target ``name`` (``judged``: the observer's judgement of it,
        else the model's ``judge``); ``True`` when its :meth:`~TargetView.signature` changed.
        The GPUs whose numbers changed are in ``gpu_changes`` either way (``--plain`` prints
        :func:`~orchestrator.views.watch.plain_gpu_lines` for them)."""
        v = self.views[name]
        before = v.signature()
        v.current = snap
        v.history.append(snap)
        v.gpu_changes = ()
        if snap.reachable:
            v.unreachable_since = None
            v.last_good = snap
            v.gpu_changes = tuple(g for g in snap.gpus if gpu_key(g) != v.gpu_keys.get(g.index))
            v.gpu_keys.update((g.index, gpu_key(g)) for g in v.gpu_changes)
            if snap.run is not None:
                if snap.run.run_id != v.run_id:
                    v.rates.clear()
                    v.log_tail.clear()
                v.run_id = snap.run.run_id
                v.log_tail.extend(snap.run.new_log_lines)
            m = snap.metrics
            if m is not None and m.throughput is not None and m.throughput_unit is not None:
                if m.throughput_unit != v.rate_unit:
                    v.rates.clear()
                v.rate_unit = m.throughput_unit
                v.rates.append(m.throughput)
            elif m is not None and m.tokens_per_s is not None:  # an older agent
                v.rate_unit = "tokens/s"
                v.rates.append(m.tokens_per_s)
        elif v.unreachable_since is None:
            v.unreachable_since = snap.taken_at
        try:
            j = judged or self.judge(name, v.container, list(v.history))
            v.findings, v.state = j.findings, j.state
        except Exception as exc:  # lenient in views: show, carry on
            log.debug("detectors failed for %s", name, exc_info=True)
            self.messages.append(f"{name}: detectors failed: {exc}")
            v.findings = tuple(with_unreachable(name, snap, []))
            grace = v.container.limits.startup_grace_s
            v.state = target_state(snap, v.findings, startup_grace_s=grace)
        return v.signature() != before
