"""``orch check``'s pass over the fleet: observe, judge, alert, remember (the monitor's half;
:mod:`orchestrator.views.check` renders the lines and the exit code).

One pass: a concurrent one-shot snapshot of every target plus one probe per
Proxmox host (:func:`~orchestrator.monitor.observe.gather`; a target that does not answer
within the timeout is *unreachable*, never dead), then, under the history lock,
:func:`~orchestrator.monitor.judge.judge` over each target's stored history plus the new
snapshot, the alerts, and the new history written back.

Status codes, as Nagios plugins use them: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN
(no target answered, or the check itself could not run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.config.inventory import Inventory
from orchestrator.detect.engine import default_playbooks
from orchestrator.model import Finding, HostProbe, Severity, Snapshot
from orchestrator.monitor import alerts
from orchestrator.monitor.history import History
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import DETECT_WINDOW, Judgement, judge
from orchestrator.monitor.observe import (
    DEFAULT_JOBS,
    as_snapshot,
    gather,
    select_jobs,
    select_targets,
)
from orchestrator.target import Host, Target

log = logging.getLogger(__name__)

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
DEFAULT_RENOTIFY_H = 4.0
JOB_LOOKBACK_S = 24 * 3600.0
"""A host that runs a job's node is probed for kernel events this far back (a link that went
down hours ago still explains a node of a running job); its nodes' own detectors still see
only the events since the previous check."""
DEFAULT_CRITICAL_KINDS: tuple[str, ...] = ()
"""Kinds the check pages for even when a detector rates them a warning (none by default:
severity is the detectors' call; ``--critical KIND`` is an opt-in paging policy)."""


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The whole check. ``problems`` are things about the check itself (alert delivery...)."""

    status: int
    targets: tuple[Judgement, ...]
    problems: tuple[str, ...] = ()
    notified: int = 0
    jobs: tuple[JobJudgement, ...] = ()
    """Each job checked, as one row with its nodes (they are in ``targets`` too)."""


def nagios_status(results: Sequence[Judgement], extra: Iterable[Finding] = ()) -> int:
    """0/1/2/3 from the targets' findings; 3 when there are none or none answered.

    >>> from orchestrator.model import Finding, Severity
    >>> up = Snapshot("a", 1.0)
    >>> down = Snapshot.unreachable("b", 1.0, "refused")
    >>> nagios_status([Judgement("a", up, "idle")])
    0
    >>> nagios_status([Judgement("b", down, "unreachable")])
    3
    >>> crit = Finding("crashed", Severity.CRITICAL, "a", "exit 137")
    >>> nagios_status([Judgement("a", up, "crashed", (crit,)), Judgement("b", down, "unreachable")])
    2
    """
    if not results or all(not r.snapshot.reachable for r in results):
        return UNKNOWN
    found = [f for r in results for f in r.findings] + list(extra)  # extra: the jobs' own
    worst = max((f.severity for f in found if f.severity >= Severity.WARNING), default=None)
    if worst is None:
        return OK
    return CRITICAL if worst >= Severity.CRITICAL else WARNING


def escalate(findings: Iterable[Finding], kinds: Iterable[str]) -> list[Finding]:
    """Findings of ``kinds`` raised to CRITICAL (the check's paging policy); others unchanged.

    >>> f = Finding("ghost-utilization", Severity.WARNING, "ct200", "GPU 3", gpus=(3,))
    >>> [str(x.severity) for x in escalate([f], ["ghost-utilization"])]
    ['critical']
    """
    wanted = set(kinds)
    return [
        replace(f, severity=Severity.CRITICAL)
        if f.kind in wanted and f.severity >= Severity.WARNING
        else f
        for f in findings
    ]


@dataclass
class CheckOptions:
    """Flags of ``orch check`` (see cli.py for their help)."""

    names: Sequence[str] = ()
    db_path: Path | None = None
    timeout_s: float = 30.0
    workers: int = DEFAULT_JOBS
    renotify_h: float = DEFAULT_RENOTIFY_H
    webhook_url: str | None = None
    notify_cmd: Sequence[str] | None = None
    probe_hosts: bool = True
    critical_kinds: Sequence[str] = DEFAULT_CRITICAL_KINDS
    extra_secrets: set[str] = field(default_factory=set)


Fetch = Callable[[str, "tuple[str, int] | None"], Snapshot]
"""``fetch(name, resume) -> Snapshot``: one target's one-shot snapshot, continuing the log at
``resume`` (run id, byte offset) when given."""


def run_check(
    inventory: Inventory, opts: CheckOptions, *, fetch: Fetch | None = None
) -> CheckReport:
    """Snapshot, judge, alert, remember. Raises ``HistoryError`` when the database is unusable.

    ``fetch`` stands in for ``Target(inventory, name).snapshot(...)`` (tests feed a recorded
    history through it).
    """
    names = select_targets(inventory, opts.names)
    containers = {n: inventory.container(n) for n in names}
    hosts = sorted({c.host for c in containers.values() if not c.is_local})
    picked = [inventory.jobs[j] for j in select_jobs(inventory, opts.names)]
    job_cfgs = [j for j in picked if all(n in containers for n in j.containers)]
    job_hosts = {containers[n].host for j in job_cfgs for n in j.containers}
    job_names = [j.name for j in job_cfgs]

    history = History.open(opts.db_path)
    with history:
        since_raw = {h: history.get_meta(f"probe-since:{h}") for h in hosts}
        # continue each run's log where the previous check stopped (each line is seen once);
        # read in SQLite so the targets are asked at once, the stored history decoded meanwhile
        resume = history.last_runs(names)
        past: dict[str, list[Snapshot]] = {}
        started = time.time()

        def one_shot(name: str, prev: tuple[str, int] | None) -> Snapshot:
            t = Target(inventory, name)
            if prev is None:
                return t.snapshot(timeout=opts.timeout_s)
            run_id, offset = prev
            return t.snapshot(offset, run_id=run_id, timeout=opts.timeout_s)

        def snap_job(name: str) -> Callable[[], Snapshot]:
            prev = resume.get(name)
            return lambda: (fetch or one_shot)(name, prev)

        def meanwhile() -> None:
            for n in names:
                past[n] = history.snapshots(n, limit=DETECT_WINDOW - 1)
            default_playbooks()  # parsed once per process; the detectors need them

        def probe_job(host: str) -> Callable[[], HostProbe]:
            raw = since_raw[host]
            since = float(raw) if raw else started - 3600.0
            if host in job_hosts:
                since = min(since, started - JOB_LOOKBACK_S)
            return lambda: Host(inventory, host).probe(since)

        jobs: dict[str, Callable[[], Any]] = {f"t:{n}": snap_job(n) for n in names}
        if opts.probe_hosts:
            jobs.update({f"h:{h}": probe_job(h) for h in hosts})
        got = gather(jobs, workers=opts.workers, timeout_s=opts.timeout_s, meanwhile=meanwhile)
        now = time.time()
        snaps = {n: as_snapshot(n, got[f"t:{n}"], now) for n in names}
        probes: dict[str, HostProbe] = {}
        problems: list[str] = []
        for h in hosts:
            value = got.get(f"h:{h}")
            if isinstance(value, HostProbe):
                probes[h] = value
            elif value is not None:
                log.info("%s: host probe failed: %s", h, value)

        with history.locked(timeout_s=max(opts.timeout_s, 10.0)):
            results = []
            all_findings: list[Finding] = []
            for n in names:
                cfg = containers[n]
                host_probes = (
                    [_since(probes[cfg.host], since_raw.get(cfg.host), started)]
                    if cfg.host in probes
                    else []
                )
                j = judge(n, cfg, [*past[n], snaps[n]], probes=host_probes)
                j = replace(j, findings=tuple(escalate(j.findings, opts.critical_kinds)))
                all_findings.extend(j.findings)
                results.append(j)
            history.record(snaps.values())
            for h, p in probes.items():
                history.set_meta(f"probe-since:{h}", repr(p.taken_at))
            by_name = {r.name: r for r in results}
            job_results = [
                judge_job(
                    job,
                    containers,
                    by_name,
                    histories={n: [*past[n], snaps[n]] for n in job.containers},
                    probes=probes,
                )  # fmt: skip
                for job in job_cfgs
            ]
            job_findings = [f for jj in job_results for f in jj.findings]
            all_findings.extend(job_findings)

            status = nagios_status(results, job_findings)
            notified = 0
            notifier = alerts.Notifier(webhook_url=opts.webhook_url, command=opts.notify_cmd)
            if notifier.configured:
                previous = history.alerts([*names, *job_names])
                notes, planned = alerts.plan(
                    previous,
                    all_findings,
                    checked=[*names, *job_names],
                    held=[r.name for r in results if not r.snapshot.reachable],
                    now=now,
                    renotify_s=opts.renotify_h * 3600.0,
                )
                delivered = True
                if notes:
                    secrets = alerts.environment_secrets([c.env for c in containers.values()])
                    body = alerts.payload(
                        notes,
                        status=STATUS_NAMES[status],
                        titles=playbook_titles(),
                        secrets=secrets | opts.extra_secrets,
                    )
                    for d in notifier.deliver(body):
                        if not d.ok:
                            delivered = False
                            problems.append(f"{d.sink} alert not delivered: {d.detail}")
                    notified = len(notes) if delivered else 0
                history.save_alerts(
                    [*names, *job_names],
                    alerts.settle(previous, planned, notes, delivered).values(),
                )
    return CheckReport(status, tuple(results), tuple(problems), notified, tuple(job_results))


def _since(probe: HostProbe, raw: str | None, started: float) -> HostProbe:
    """``probe`` with only the kernel events since the previous check (what a node's own
    detectors see; a job host's probe reaches further back for the job's sake)."""
    since = float(raw) if raw else started - 3600.0
    kept = tuple(e for e in probe.kernel_events if e.at is None or e.at >= since)
    return probe if len(kept) == len(probe.kernel_events) else replace(probe, kernel_events=kept)


def playbook_titles() -> dict[str, str]:
    """Playbook id -> title; empty when the playbooks cannot be loaded (the ids still show)."""
    try:
        from orchestrator.playbooks import load_playbooks

        return {p.id: p.title for p in load_playbooks()}
    except Exception as exc:  # noqa: BLE001 - a view must not die on a playbook problem
        log.warning("playbooks not loaded: %s", exc)
        return {}
