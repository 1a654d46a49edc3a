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
from orchestrator.monitor import alerts
from orchestrator.monitor.history import History
from orchestrator.monitor.hostpath import (
    HOST_PREFIX,
    HostRound,
    host_judgement,
    needs_pane,
    owned_lines,
    read_round,
    run_host_pids,
    with_pane,
)
from orchestrator.monitor.jobs import JobJudgement, judge_job
from orchestrator.monitor.judge import DETECT_WINDOW, Judgement, judge
from orchestrator.monitor.observe import (
    DEFAULT_JOBS,
    as_snapshot,
    gather,
    select_jobs,
    select_targets,
)
from orchestrator.remote.target import Host, Target
from orchestrator.wire.model import Finding, HostProbe, Severity, Snapshot

log = logging.getLogger(__name__)

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
DEFAULT_RENOTIFY_H = 4.0
JOB_LOOKBACK_S = 24 * 3600.0
"""A host that runs a job's node is probed for kernel events this far back (a link that went
down hours ago still explains a node of a running job); its nodes' own detectors still see
only the events since the previous check."""
PAIR_GAP_S = 1.0
"""A target with no snapshot in the history since :data:`STALE_S` is sampled twice this many
seconds apart, so detectors that want consecutive samples (``ghost_samples``: 2) decide on the
first check as on the second (they count samples, not seconds)."""
STALE_S = 3600.0
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


Fetch = Callable[[str, "tuple[str, int] | None"], Snapshot]
"""``fetch(name, resume) -> Snapshot``: one target's one-shot snapshot, continuing the log at
``resume`` (run id, byte offset) when given."""


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
    inventory: Inventory, opts: CheckOptions, *, fetch: Fetch | None = None
) -> CheckReport:
    """Snapshot, judge, alert, remember. Raises ``HistoryError`` when the database is unusable.

    Containers observed from their host (:func:`~orchestrator.remote.hostlink.host_groups`) take one
    ``host-observe`` call per host; the others one in-container snapshot each plus one probe
    per host. ``fetch`` stands in for every target's snapshot (tests feed a recorded history
    through it).
    """
    from orchestrator.remote.hostlink import HostLink, host_groups

    names = select_targets(inventory, opts.names)
    containers = {n: inventory.container(n) for n in names}
    groups = host_groups(inventory, names)
    on_host = {n for ns in groups.values() for n in ns}
    picked = [inventory.jobs[j] for j in select_jobs(inventory, opts.names)]
    job_cfgs = [j for j in picked if all(n in containers for n in j.containers)]
    job_hosts = {containers[n].host for j in job_cfgs for n in j.containers}
    job_names = [j.name for j in job_cfgs]

    history = History.open(opts.db_path, inventory=inventory)
    with history:
        # continue each run's log where the previous check stopped (each line is seen once);
        # read in SQLite so the targets are asked at once, the stored history decoded meanwhile
        resume = history.last_runs(names)
        meta = {h: (history.get_meta(f"kernel-cursor:{h}"), history.get_meta(f"probe-since:{h}"))
                for h in {c.host for c in containers.values() if not c.is_local}}  # fmt: skip
        past: dict[str, list[Snapshot]] = {}
        started = time.time()

        def one_shot(name: str, prev: tuple[str, int] | None) -> Snapshot:
            t = Target(inventory, name)
            if prev is None:
                return t.snapshot(timeout=opts.timeout_s)
            run_id, offset = prev
            return t.snapshot(offset, run_id=run_id, timeout=opts.timeout_s)

        fresh = history.newest(names)
        first: dict[str, Snapshot] = {}  # the earlier of a pair (no recent history)

        def snap_job(name: str) -> Callable[[], Snapshot]:
            prev = resume.get(name)
            get = fetch or one_shot
            if fetch is not None or fresh.get(name, 0.0) >= started - STALE_S:
                return lambda: get(name, prev)  # recorded snapshots (tests) are never paired

            def pair() -> Snapshot:
                one = first[name] = get(name, prev)
                time.sleep(PAIR_GAP_S)
                run = one.run if one.reachable else None
                return get(name, (run.run_id, run.log_offset) if run and run.run_id else prev)

            return pair

        def meanwhile() -> None:
            for n in names:
                past[n] = history.snapshots(n, limit=DETECT_WINDOW - 1)
            default_playbooks()  # parsed once per process; the detectors need them

        def probe_job(host: str) -> Callable[[], HostProbe]:
            raw = meta[host][1]
            since = float(raw) if raw else started - 3600.0
            if host in job_hosts:
                since = min(since, started - JOB_LOOKBACK_S)
            return lambda: Host(inventory, host).probe(since)

        def host_job(host: str) -> Callable[[], Any]:
            link = HostLink(inventory, host, groups[host])
            link.resume = {n: resume[n] for n in groups[host] if n in resume}
            cursor, raw = meta[host]
            link.cursor, link.since = cursor, float(raw) if raw else started - 3600.0
            return lambda: link.observe(timeout=opts.timeout_s)

        def inside_jobs(targets: Sequence[str]) -> dict[str, Callable[[], Any]]:
            jobs: dict[str, Callable[[], Any]] = {f"t:{n}": snap_job(n) for n in targets}
            if opts.probe_hosts:
                hosts = sorted({containers[n].host for n in targets if not containers[n].is_local})
                jobs.update({f"h:{h}": probe_job(h) for h in hosts})
            return jobs

        jobs = inside_jobs([n for n in names if n not in on_host])
        if opts.probe_hosts:  # a job's hosts: their kernel log a day back, even when observed
            # from the host (whose document has only what is new since the last check)
            jobs.update({f"h:{h}": probe_job(h) for h in sorted(job_hosts) if f"h:{h}" not in jobs})
        if fetch is None:
            jobs.update({f"H:{h}": host_job(h) for h in groups})
        else:  # tests feed recorded snapshots: every target through ``fetch``
            jobs.update({f"t:{n}": snap_job(n) for n in on_host})
            groups = {}
        got = gather(jobs, workers=opts.workers, timeout_s=opts.timeout_s, meanwhile=meanwhile)
        now = time.time()
        known = run_host_pids(s for n in on_host for s in past.get(n, ())[-2:])
        hosted = read_round(inventory, groups, {h: got.get(f"H:{h}") for h in groups}, now, known)
        if hosted.fallback:  # a host that cannot run the observer: its containers from inside
            got.update(gather(inside_jobs(hosted.fallback), workers=opts.workers,
                              timeout_s=opts.timeout_s))  # fmt: skip
        snaps = {n: hosted.snaps[n] if n in hosted.snaps else as_snapshot(n, got[f"t:{n}"], now)
                 for n in names}  # fmt: skip
        snaps.update(_panes(inventory, snaps, opts))
        paired = [n for n in names if n in first and isinstance(got.get(f"t:{n}"), Snapshot)]
        for n in paired:  # the earlier of a pair: history the detectors see
            past[n] = [*past[n], first[n]][-(DETECT_WINDOW - 1) :]
        probes: dict[str, HostProbe] = {}
        problems: list[str] = []
        for h in meta:
            value = got.get(f"h:{h}")
            if isinstance(value, HostProbe):
                probes[h] = value
            elif value is not None:
                log.info("%s: host probe failed: %s", h, value)
        # what the containers' own detectors and the host's findings see: the kernel events since
        # the previous check (a job host's probe reaches a day back for the job's judgement only)
        recent = {h: _since(p, meta[h][1], started) for h, p in probes.items()}

        with history.locked(timeout_s=max(opts.timeout_s, 10.0)):
            results = []
            all_findings: list[Finding] = []
            for n in names:
                cfg = containers[n]
                host_probes = (  # a host-observed container has its events in its snapshot
                    [recent[cfg.host]] if cfg.host in recent and n not in on_host else []
                )
                j = judge(n, cfg, [*past[n], snaps[n]], probes=host_probes)
                j = replace(j, findings=tuple(escalate(j.findings, opts.critical_kinds)))
                all_findings.extend(j.findings)
                results.append(j)
            # the hosts' own events belong to a check of the whole fleet, not of named targets
            host_results = [] if opts.names else _host_results(hosted, recent, all_findings, now)
            all_findings.extend(f for j in host_results for f in j.findings)
            secrets = alerts.environment_secrets([c.env for c in containers.values()])
            earlier = [first[n] for n in paired]
            history.record(stored([*earlier, *snaps.values()], secrets | opts.extra_secrets))
            for h, p in probes.items():
                history.set_meta(f"probe-since:{h}", repr(p.taken_at))
            for h, (cursor, at) in hosted.cursors.items():
                if cursor:
                    history.set_meta(f"kernel-cursor:{h}", cursor)
                if at is not None:
                    history.set_meta(f"probe-since:{h}", repr(at))

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

            status = nagios_status([*results, *host_results], job_findings)
            notified = 0
            notifier = alerts.Notifier(webhook_url=opts.webhook_url, command=opts.notify_cmd)
            checked = [*names, *job_names, *(j.name for j in host_results)]
            if notifier.configured:
                previous = history.alerts(checked)
                notes, planned = alerts.plan(
                    previous,
                    all_findings,
                    checked=checked,
                    held=[r.name for r in results if not r.snapshot.reachable],
                    now=now,
                    renotify_s=opts.renotify_h * 3600.0,
                )
                delivered = True
                if notes:
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
                    checked, alerts.settle(previous, planned, notes, delivered).values()
                )
    return CheckReport(status, tuple(results), tuple(problems), notified,
                       hosts=tuple(host_results), jobs=tuple(job_results))  # fmt: skip


def _panes(
    inventory: Inventory, snaps: dict[str, Snapshot], opts: CheckOptions
) -> dict[str, Snapshot]:
    """The pane lines, through ``pct exec``, of the containers the host cannot judge without
    them (:func:`~orchestrator.monitor.hostpath.needs_pane`)."""
    wanted = [n for n, s in snaps.items() if needs_pane(s)]
    if not wanted:
        return {}

    def job(name: str) -> Callable[[], Snapshot]:
        return lambda: Target(inventory, name).snapshot(timeout=opts.timeout_s)

    got = gather({n: job(n) for n in wanted}, workers=opts.workers, timeout_s=opts.timeout_s)
    return {n: with_pane(snaps[n], v if isinstance(v, Snapshot) else None) for n, v in got.items()}


def _host_results(
    hosted: HostRound, probes: dict[str, HostProbe], findings: Sequence[Finding], now: float
) -> list[Judgement]:
    """One judgement per host with events no container owns (or no container's finding shows)."""
    from orchestrator.config.limits import Limits

    shown = owned_lines(findings)
    events = {h: list(evs) for h, evs in hosted.host_events.items()}
    for h, p in probes.items():
        events.setdefault(h, []).extend(e for e in p.kernel_events if e.vmid is None)
    out = []
    for h, evs in sorted(events.items()):
        found = host_judgement(h, [e for e in evs if e.line not in shown], Limits())
        if found:
            snap = Snapshot(HOST_PREFIX + h, now)
            out.append(Judgement(HOST_PREFIX + h, snap, "host", tuple(found), host=h))
    return out


def _since(probe: HostProbe, raw: str | None, started: float) -> HostProbe:
    """``probe`` with only the kernel events since the previous check (what a node's own
    detectors see; a job host's probe reaches further back for the job's sake)."""
    since = float(raw) if raw else started - 3600.0
    kept = tuple(e for e in probe.kernel_events if e.at is None or e.at >= since)
    return probe if len(kept) == len(probe.kernel_events) else replace(probe, kernel_events=kept)


def playbook_titles() -> dict[str, str]:
    """Playbook id -> title; empty when the playbooks cannot be loaded (the ids still show)."""
    try:
        from orchestrator.playbooks.loader import load_playbooks

        return {p.id: p.title for p in load_playbooks()}
    except Exception as exc:  # noqa: BLE001 - a view must not die on a playbook problem
        log.warning("playbooks not loaded: %s", exc)
        return {}
