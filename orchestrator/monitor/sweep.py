"""``orch check``'s pass over the fleet: observe, judge, alert, remember (the monitor's half;
:mod:`orchestrator.views.check` renders the lines and the exit code).

One pass: one round of the :class:`~orchestrator.monitor.observer.Observer` (every target at
once; a target that does not answer within the timeout is *unreachable*, never dead; one
without recent history sampled twice), then, under the history lock, the observer's ledger
judges each target's stored history plus the new snapshot, the hosts' own events by the one
rule, the alerts, and the new history written back.

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
from orchestrator.monitor import alerts
from orchestrator.monitor.history import History
from orchestrator.monitor.hostpath import HostView
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import DETECT_WINDOW, Judgement
from orchestrator.monitor.observe import DEFAULT_JOBS, select_jobs, select_targets
from orchestrator.monitor.observer import Fetch, Observer
from orchestrator.monitor.rounds import Round
from orchestrator.wire.model import Finding, HostProbe, Severity, Snapshot

log = logging.getLogger(__name__)

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
DEFAULT_RENOTIFY_H = 4.0
JOB_LOOKBACK_S = 24 * 3600.0
"""A host that runs a job's node is probed for kernel events this far back (a link that went
down hours ago still explains a node of a running job); its nodes' own detectors still see
only the events since the previous check."""
STALE_S = 3600.0
"""A target with no snapshot in the history since this many seconds is sampled twice
(:data:`~orchestrator.monitor.observer.PAIR_GAP_S` apart) by the check."""
DEFAULT_CRITICAL_KINDS: tuple[str, ...] = ()
"""Kinds the check pages for even when a detector rates them a warning (none by default:
severity is the detectors' call; ``--critical KIND`` is an opt-in paging policy)."""


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The whole check. ``problems`` are things about the check itself (alert delivery...);
    ``hosts`` are the hosts' own findings (events no container owns), one judgement each."""

    status: int
    targets: tuple[Judgement, ...]
    problems: tuple[str, ...] = ()
    notified: int = 0
    hosts: tuple[Judgement, ...] = ()
    jobs: tuple[JobJudgement, ...] = ()
    """Each job checked, as one row with its nodes (they are in ``targets`` too)."""


def nagios_status(results: Sequence[Judgement], extra: Iterable[Finding] = ()) -> int:
    """0/1/2/3 from the targets' findings; 3 when there are none or none answered.

    >>> from orchestrator.wire.model import Finding, Severity
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


def stored(snaps: Iterable[Snapshot], secrets: set[str]) -> list[Snapshot]:
    """``snaps`` as orch.db keeps them: every known secret value redacted from their text
    (log lines, the pane, errors), as in every other artefact orch writes.

    >>> from orchestrator.wire.model import RunState
    >>> s = Snapshot("ct", 1.0, run=RunState("r", "/r", new_log_lines=("login hf_s3cret ok",)))
    >>> stored([s], {"hf_s3cret"})[0].run.new_log_lines
    ('login *** ok',)
    """
    from orchestrator.wire.secrets import redact_tree

    if not secrets:
        return list(snaps)
    return [Snapshot.from_dict(redact_tree(s.to_dict(), secrets)) for s in snaps]


def run_check(
    inventory: Inventory,
    opts: CheckOptions,
    *,
    fetch: Fetch | None = None,
    host_link: Callable[[str, Sequence[str]], Any] | None = None,
) -> CheckReport:
    """Observe (one round of the :class:`~orchestrator.monitor.observer.Observer`), judge over
    the stored history, alert, remember. Raises ``HistoryError`` when the database is unusable.
    ``fetch`` stands in for every target's snapshot and ``host_link`` for each host's observer
    (tests feed a recorded history through them; recorded snapshots are never sampled twice).
    """
    names = select_targets(inventory, opts.names)
    containers = {n: inventory.container(n) for n in names}
    picked = [inventory.jobs[j] for j in select_jobs(inventory, opts.names)]
    job_cfgs = [j for j in picked if all(n in containers for n in j.containers)]
    job_hosts = {containers[n].host for j in job_cfgs for n in j.containers}
    obs = Observer(
        inventory,
        names,
        timeout_s=opts.timeout_s,
        workers=opts.workers,
        fetch=fetch,
        host_link=host_link,
    )
    history = History.open(opts.db_path, inventory=inventory)
    with history:
        started = time.time()
        # continue each run's log and each host's kernel log where the previous check stopped
        obs.resume.update(history.last_runs(names))
        since = _host_meta(
            history, obs, {c.host for c in containers.values() if not c.is_local}, started
        )
        fresh = history.newest(names)
        stale = {n for n in names if fresh.get(n, 0.0) < started - STALE_S}
        pair = set() if fetch or host_link else stale  # recorded snapshots are never paired
        past: dict[str, list[Snapshot]] = {}

        def meanwhile() -> None:  # the stored history decoded while the targets answer
            past.update({n: history.snapshots(n, limit=DETECT_WINDOW - 1) for n in names})
            default_playbooks()  # parsed once per process; the detectors need them

        probe_since = {
            h: min(t, started - JOB_LOOKBACK_S) if h in job_hosts else t for h, t in since.items()
        }
        got = obs.round(
            pair=pair,
            probe_since=probe_since if opts.probe_hosts else None,
            probe_also=job_hosts if opts.probe_hosts else (),
            past=past,
            meanwhile=meanwhile,
        )
        for n, first in got.earlier.items():  # the earlier of a pair: history the detectors see
            past[n] = [*past[n], first][-(DETECT_WINDOW - 1) :]
        # a node's own detectors and the hosts' findings see the kernel events since the
        # previous check (a job host's probe reaches a day back for the job's judgement only)
        recent = {h: _since(p, since.get(h, started - 3600.0)) for h, p in got.probes.items()}
        with history.locked(timeout_s=max(opts.timeout_s, 10.0)):
            results = []
            for n in names:
                obs.ledger.seed(n, past[n])
                host = containers[n].host
                probes = [recent[host]] if host in recent and n in got.inside else []
                j = obs.ledger.judge(n, got.snaps[n], probes)
                results.append(
                    replace(j, findings=tuple(escalate(j.findings, opts.critical_kinds)))
                )
            for view in got.hosts.values():
                obs.ledger.saw_host(view)
            for h, p in recent.items():
                obs.ledger.saw_host(HostView(h, list(p.kernel_events), taken_at=p.taken_at))
            # the hosts' own events belong to a check of the whole fleet, not of named targets
            host_results = [] if opts.names else obs.ledger.host_judgements()
            secrets = alerts.environment_secrets([c.env for c in containers.values()])
            with history.batch():  # the snapshots and the cursors they were read to: one commit
                history.record(
                    stored(
                        [*got.earlier.values(), *got.snaps.values()], secrets | opts.extra_secrets
                    )
                )
                _save_cursors(history, got)
            by_name = {r.name: r for r in results}
            job_results = [
                judge_job(
                    job,
                    containers,
                    by_name,
                    probes=got.probes,
                    histories={n: [*past[n], got.snaps[n]] for n in job.containers},
                )
                for job in job_cfgs
            ]
            job_findings = [f for jj in job_results for f in jj.findings]
            status = nagios_status([*results, *host_results], job_findings)
            found = [f for j in [*results, *host_results] for f in j.findings] + job_findings
            checked = [*names, *(j.name for j in job_cfgs), *(j.name for j in host_results)]
            held = [r.name for r in results if not r.snapshot.reachable]
            notified, problems = _notify(
                history,
                opts,
                found,
                checked,
                held,
                status,
                secrets | opts.extra_secrets,
                got.taken_at,
            )
    return CheckReport(
        status,
        tuple(results),
        tuple(problems),
        notified,
        hosts=tuple(host_results),
        jobs=tuple(job_results),
    )


def _host_meta(
    history: History, obs: Observer, hosts: Iterable[str], started: float
) -> dict[str, float]:
    """Each host's kernel cursor into ``obs``; the time each host's kernel log is read from
    (the previous check's, else an hour back)."""
    since: dict[str, float] = {}
    for h in hosts:
        raw = history.get_meta(f"probe-since:{h}")
        since[h] = float(raw) if raw else started - 3600.0
        obs.cursors[h] = (history.get_meta(f"kernel-cursor:{h}"), since[h])
    return since


def _save_cursors(history: History, got: Round) -> None:
    """Where the next check continues each host's kernel log."""
    for h, p in got.probes.items():
        history.set_meta(f"probe-since:{h}", repr(p.taken_at))
    for h, (cursor, at) in got.cursors.items():
        if cursor:
            history.set_meta(f"kernel-cursor:{h}", cursor)
        if at is not None:
            history.set_meta(f"probe-since:{h}", repr(at))


def _notify(
    history: History,
    opts: CheckOptions,
    found: Sequence[Finding],
    checked: Sequence[str],
    held: Sequence[str],
    status: int,
    secrets: set[str],
    now: float,
) -> tuple[int, list[str]]:
    """Plan, deliver and settle the alerts (deduplicated through the history); the number of
    notifications delivered and the delivery problems."""
    notifier = alerts.Notifier(webhook_url=opts.webhook_url, command=opts.notify_cmd)
    if not notifier.configured:
        return 0, []
    previous = history.alerts(checked)
    notes, planned = alerts.plan(
        previous, found, checked=checked, held=held, now=now, renotify_s=opts.renotify_h * 3600.0
    )
    delivered, problems = True, []
    if notes:
        body = alerts.payload(
            notes, status=STATUS_NAMES[status], titles=playbook_titles(), secrets=secrets
        )
        for d in notifier.deliver(body):
            if not d.ok:
                delivered = False
                problems.append(f"{d.sink} alert not delivered: {d.detail}")
    history.save_alerts(checked, alerts.settle(previous, planned, notes, delivered).values())
    return (len(notes) if delivered else 0), problems


def _since(probe: HostProbe, since: float) -> HostProbe:
    """``probe`` with only the kernel events since ``since`` (what a node's own detectors see;
    a job host's probe reaches further back for the job's sake)."""
    kept = tuple(e for e in probe.kernel_events if e.at is None or e.at >= since)
    return probe if len(kept) == len(probe.kernel_events) else replace(probe, kernel_events=kept)


def playbook_titles() -> dict[str, str]:
    """Playbook id -> title; empty when the playbooks cannot be loaded (the ids still show).
    The set the detectors loaded (once per process), not a second load."""
    try:
        return {p.id: p.title for p in default_playbooks()}
    except Exception as exc:  # noqa: BLE001 - a view must not die on a playbook problem
        log.warning("playbooks not loaded: %s", exc)
        return {}
