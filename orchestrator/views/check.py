"""``orch check``: the cron / Nagios-style health check.

One pass: a concurrent one-shot snapshot of every target plus one probe per
Proxmox host (a thread pool; a target that does not answer within the timeout is
*unreachable*, never dead), then, under the history lock, the detectors over
each target's stored history plus the new snapshot, the alerts, and the new
history written back.

Exit codes, as Nagios plugins use them: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN
(no target answered, or the check itself could not run).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.model import Finding, HostProbe, Severity, Snapshot
from orchestrator.monitor.state import target_state

log = logging.getLogger(__name__)

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
STATUS_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
DEFAULT_JOBS = 32
DEFAULT_RENOTIFY_H = 4.0
DETECT_WINDOW = 16
"""Stored snapshots per target the detectors see (with the new one): enough for every
sample count in Limits and a stall (which also uses the log's mtime); a longer window
costs a 64-target check seconds of parsing."""
DEFAULT_CRITICAL_KINDS: tuple[str, ...] = ()
"""Kinds the check pages for even when a detector rates them a warning (none by default:
severity is the detectors' call; ``--critical KIND`` is an opt-in paging policy)."""


@dataclass(frozen=True, slots=True)
class TargetResult:
    """What the check concluded about one target."""

    name: str
    snapshot: Snapshot
    state: str
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The whole check. ``problems`` are things about the check itself (alert delivery...)."""

    status: int
    targets: tuple[TargetResult, ...]
    problems: tuple[str, ...] = ()
    notified: int = 0


# --- pure --------------------------------------------------------------------------------


def nagios_status(results: Sequence[TargetResult]) -> int:
    """0/1/2/3 from the targets' findings; 3 when there are none or none answered.

    >>> up = Snapshot("a", 1.0)
    >>> down = Snapshot.unreachable("b", 1.0, "refused")
    >>> nagios_status([TargetResult("a", up, "idle")])
    0
    >>> nagios_status([TargetResult("b", down, "unreachable")])
    3
    >>> crit = Finding("crashed", Severity.CRITICAL, "a", "exit 137")
    >>> nagios_status([TargetResult("a", up, "crashed", (crit,)), TargetResult("b", down, "unreachable")])
    2
    """
    if not results or all(not r.snapshot.reachable for r in results):
        return UNKNOWN
    worst = max(
        (f.severity for r in results for f in r.findings if f.severity >= Severity.WARNING),
        default=None,
    )
    if worst is None:
        return OK
    return CRITICAL if worst >= Severity.CRITICAL else WARNING


def ensure_unreachable_finding(name: str, snap: Snapshot, findings: list[Finding]) -> list[Finding]:
    """Add an ``unreachable`` finding for a snapshot that is the transport's marker, if missing.

    >>> s = Snapshot.unreachable("ct200", 0.0, "connection refused")
    >>> [f.kind for f in ensure_unreachable_finding("ct200", s, [])]
    ['unreachable']
    """
    if snap.reachable or any(f.kind == "unreachable" for f in findings):
        return findings
    reason = "; ".join(snap.errors) or "no answer"
    return [
        *findings,
        Finding(
            kind="unreachable",
            severity=Severity.WARNING,
            target=name,
            summary=f"unreachable since {clock(snap.taken_at)}: {reason}",
            since=snap.taken_at,
            evidence=tuple(snap.errors),
        ),
    ]


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


def clock(ts: float) -> str:
    """Local wall-clock ``HH:MM:SS`` for Unix seconds ``ts``."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def lines(report: CheckReport, titles: Mapping[str, str] | None = None) -> list[str]:
    """The human output: a Nagios status line, then one line per problem.

    >>> r = TargetResult("ct200", Snapshot("ct200", 0.0), "running", (
    ...     Finding("ghost-utilization", Severity.CRITICAL, "ct200", "GPU 3 busy, 0 MiB", gpus=(3,),
    ...             playbook="ghost-utilization"),))
    >>> print("\\n".join(lines(CheckReport(CRITICAL, (r,)), {"ghost-utilization": "Ghost GPU"})))
    ORCH CRITICAL - 1 target: 1 critical, 0 warning, 0 unreachable
    CRITICAL ct200 ghost-utilization [GPU 3]: GPU 3 busy, 0 MiB (playbook: Ghost GPU)
    """
    titles = titles or {}
    findings = [f for r in report.targets for f in r.findings if f.severity >= Severity.WARNING]
    n_crit = sum(f.severity >= Severity.CRITICAL for f in findings)
    n_unreach = sum(not r.snapshot.reachable for r in report.targets)
    n = len(report.targets)
    out = [
        f"ORCH {STATUS_NAMES[report.status]} - {n} target{'s' if n != 1 else ''}: "
        f"{n_crit} critical, {len(findings) - n_crit} warning, {n_unreach} unreachable"
    ]
    for r in report.targets:
        for f in sorted(r.findings, key=lambda f: (-f.severity, f.kind)):
            if f.severity < Severity.WARNING:
                continue
            gpus = f" [GPU {','.join(map(str, f.gpus))}]" if f.gpus else ""
            pb = f" (playbook: {titles.get(f.playbook, f.playbook)})" if f.playbook else ""
            out.append(f"{f.severity.name} {r.name} {f.kind}{gpus}: {f.summary}{pb}")
    out.extend(f"UNKNOWN check: {p}" for p in report.problems)
    return out


def to_json(report: CheckReport) -> dict[str, Any]:
    """The ``--json`` document (secrets are redacted by the caller)."""
    return {
        "status": STATUS_NAMES[report.status],
        "targets": [
            {
                "name": r.name,
                "state": r.state,
                "reachable": r.snapshot.reachable,
                "taken_at": r.snapshot.taken_at,
                "findings": [
                    {
                        "kind": f.kind,
                        "severity": str(f.severity),
                        "gpus": list(f.gpus),
                        "playbook": f.playbook,
                        "summary": f.summary,
                        "since": f.since,
                        "evidence": list(f.evidence),
                    }
                    for f in r.findings
                ],
            }
            for r in report.targets
        ],
        "problems": list(report.problems),
        "notified": report.notified,
    }


# --- I/O ---------------------------------------------------------------------------------


def gather(
    jobs: Mapping[str, Callable[[], Any]],
    *,
    workers: int = DEFAULT_JOBS,
    timeout_s: float = 30.0,
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Call every job concurrently; a job's value, or the exception it raised (or a TimeoutError).

    At most ``workers`` run at once (``workers=1`` is strictly sequential, the
    benchmark's baseline). A job still running after ``timeout_s`` seconds from
    the start gets a ``TimeoutError`` result; its thread is abandoned (each
    transport call has its own deadline, so it ends on its own). ``meanwhile``
    runs in the calling thread once every job is submitted (work that needs no
    answer, done while the answers travel); what it raises propagates.
    """
    results: dict[str, Any] = {}
    if not jobs:
        if meanwhile is not None:
            meanwhile()
        return results
    started = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, min(workers, len(jobs))), thread_name_prefix="orch-check"
    )
    try:
        futures = {pool.submit(fn): name for name, fn in jobs.items()}
        if meanwhile is not None:
            meanwhile()
        left_s = max(0.0, timeout_s - (time.monotonic() - started))
        done, _pending = concurrent.futures.wait(futures, timeout=left_s)
        for fut, name in futures.items():
            if fut in done:
                exc = fut.exception()
                results[name] = exc if exc is not None else fut.result()
            else:
                fut.cancel()
                results[name] = TimeoutError(f"no answer within {timeout_s:g} s")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return results


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


def select_targets(inventory: Any, names: Sequence[str]) -> list[str]:
    """The named containers (each validated), else every container but the built-in ``local``."""
    if names:
        for n in names:
            inventory.container(n)  # raises UsageError naming the known ones
        return list(dict.fromkeys(names))
    return [n for n in inventory.containers if n != "local"]


def run_check(inventory: Any, opts: CheckOptions) -> CheckReport:
    """Snapshot, judge, alert, remember. Raises ``HistoryError`` when the database is unusable."""
    from orchestrator.detect.engine import default_playbooks, run_detectors
    from orchestrator.monitor import alerts
    from orchestrator.monitor.history import History
    from orchestrator.monitor.state import roles_by_gpu
    from orchestrator.target import Host, Target

    names = select_targets(inventory, opts.names)
    containers = {n: inventory.container(n) for n in names}
    hosts = sorted({c.host for c in containers.values() if not c.is_local})

    history = History.open(opts.db_path)
    with history:
        since_raw = {h: history.get_meta(f"probe-since:{h}") for h in hosts}
        # continue each run's log where the previous check stopped (each line is seen once);
        # read in SQLite so the targets are asked at once, the stored history decoded meanwhile
        resume = history.last_runs(names)
        past: dict[str, list[Snapshot]] = {}
        started = time.time()
        targets: dict[str, Any] = {}

        def snap_job(name: str) -> Callable[[], Snapshot]:
            prev = resume.get(name)

            def job() -> Snapshot:
                t = Target(inventory, name)
                targets[name] = t
                if prev is None:
                    return t.snapshot(timeout=opts.timeout_s)
                run_id, offset = prev
                return t.snapshot(offset, run_id=run_id, timeout=opts.timeout_s)

            return job

        def meanwhile() -> None:
            for n in names:
                past[n] = history.snapshots(n, limit=DETECT_WINDOW)
            default_playbooks()  # parsed once per process; the detectors need them

        def probe_job(host: str) -> Callable[[], HostProbe]:
            raw = since_raw[host]
            since = float(raw) if raw else started - 3600.0
            return lambda: Host(inventory, host).probe(since)

        jobs: dict[str, Callable[[], Any]] = {f"t:{n}": snap_job(n) for n in names}
        if opts.probe_hosts:
            jobs.update({f"h:{h}": probe_job(h) for h in hosts})
        got = gather(jobs, workers=opts.workers, timeout_s=opts.timeout_s, meanwhile=meanwhile)
        now = time.time()

        snaps: dict[str, Snapshot] = {}
        for n in names:
            value = got[f"t:{n}"]
            if isinstance(value, Snapshot):
                snaps[n] = value
            else:
                log.info("%s: snapshot failed: %s", n, value)
                snaps[n] = Snapshot.unreachable(n, now, _reason(value))
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
                snap = snaps[n]
                host_probes = [probes[cfg.host]] if cfg.host in probes else []
                findings = list(
                    run_detectors(
                        [*past[n], snap],
                        limits=cfg.limits,
                        roles=roles_by_gpu(cfg.gpus),
                        probes=host_probes,
                        now=now,
                    )
                )
                findings = [f for f in findings if f.target in (n, snap.target)]
                findings = escalate(findings, opts.critical_kinds)
                findings = ensure_unreachable_finding(n, snap, findings)
                all_findings.extend(findings)
                results.append(
                    TargetResult(
                        n,
                        snap,
                        target_state(snap, findings, startup_grace_s=cfg.limits.startup_grace_s),
                        tuple(findings),
                    )
                )
            history.record(snaps.values())
            for h, p in probes.items():
                history.set_meta(f"probe-since:{h}", repr(p.taken_at))

            status = nagios_status(results)
            notified = 0
            notifier = alerts.Notifier(webhook_url=opts.webhook_url, command=opts.notify_cmd)
            if notifier.configured:
                previous = history.alerts(names)
                notes, planned = alerts.plan(
                    previous,
                    all_findings,
                    checked=names,
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
                    names, alerts.settle(previous, planned, notes, delivered).values()
                )
    for t in targets.values():
        close = getattr(t, "close", None)
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 - closing is best effort
                log.debug("closing %s failed", t, exc_info=True)
    return CheckReport(status, tuple(results), tuple(problems), notified)


def playbook_titles() -> dict[str, str]:
    """Playbook id -> title; empty when the playbooks cannot be loaded (the ids still show)."""
    try:
        from orchestrator.playbooks import load_playbooks

        return {p.id: p.title for p in load_playbooks()}
    except Exception as exc:  # noqa: BLE001 - a view must not die on a playbook problem
        log.warning("playbooks not loaded: %s", exc)
        return {}


def _reason(value: object) -> str:
    if isinstance(value, BaseException):
        text = str(value) or type(value).__name__
        return text.splitlines()[0][:300]
    return f"unexpected answer {type(value).__name__}"


def redact_report(doc: Any, containers: Iterable[Any], extra: set[str] | None = None) -> Any:
    """``doc`` with secret-looking env values (ours and the containers') masked."""
    from orchestrator.monitor import alerts

    secrets = alerts.environment_secrets([getattr(c, "env", {}) for c in containers])
    return alerts.redact(doc, secrets | (extra or set()))
