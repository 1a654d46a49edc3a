"""``orch check``'s rendering: the Nagios status line and one line per problem, or the
``--json`` document (pure). The pass itself (observe, judge, alert, remember) is
:mod:`orchestrator.monitor.sweep`; its ``status`` is the exit code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.monitor.jobs import finding_dict
from orchestrator.monitor.sweep import STATUS_NAMES, CheckReport
from orchestrator.wire.model import Finding, Severity
from orchestrator.wire.progress_summary import metrics_progress
from orchestrator.wire.text import visible


def lines(report: CheckReport, titles: Mapping[str, str] | None = None) -> list[str]:
    """The human output: a Nagios status line, then one line per problem.

    >>> from orchestrator.wire.model import Finding, Snapshot
    >>> from orchestrator.monitor.judge import Judgement
    >>> from orchestrator.monitor.sweep import CRITICAL
    >>> r = Judgement("ct200", Snapshot("ct200", 0.0), "running", (
    ...     Finding("ghost-utilization", Severity.CRITICAL, "ct200", "GPU 3 busy, 0 MiB", gpus=(3,),
    ...             playbook="ghost-utilization"),))
    >>> print("\\n".join(lines(CheckReport(CRITICAL, (r,)), {"ghost-utilization": "Ghost GPU"})))
    ORCH CRITICAL - 1 target: 1 critical, 0 warning, 0 unreachable
    CRITICAL ct200 ghost-utilization [GPU 3]: GPU 3 busy, 0 MiB (playbook: Ghost GPU)
    """
    titles = titles or {}
    own = [f for jj in report.jobs for f in jj.findings]
    judged = [*report.targets, *report.hosts]
    findings = [f for r in judged for f in r.findings if f.severity >= Severity.WARNING]
    findings += [f for f in own if f.severity >= Severity.WARNING]
    n_crit = sum(f.severity >= Severity.CRITICAL for f in findings)
    n_unreach = sum(not r.snapshot.reachable for r in report.targets)
    n = len(report.targets)
    jobs = f" ({len(report.jobs)} job{'s' if len(report.jobs) != 1 else ''})" if report.jobs else ""
    out = [
        f"ORCH {STATUS_NAMES[report.status]} - {n} target{'s' if n != 1 else ''}{jobs}: "
        f"{n_crit} critical, {len(findings) - n_crit} warning, {n_unreach} unreachable"
    ]
    shown_as = {
        r.node.container: f"{jj.name}/{r.node.container}" for jj in report.jobs for r in jj.nodes
    }
    for jj in report.jobs:
        out.extend(_finding_lines(jj.name, jj.findings, titles))
    for r in judged:
        out.extend(_finding_lines(shown_as.get(r.name, r.name), r.findings, titles))
    out.extend(f"UNKNOWN check: {p}" for p in report.problems)
    return [visible(line) for line in out]  # names, summaries: from the containers


def _finding_lines(name: str, findings: Iterable[Finding], titles: Mapping[str, str]) -> list[str]:
    out = []
    for f in sorted(findings, key=lambda f: (-f.severity, f.kind)):
        if f.severity < Severity.WARNING:
            continue
        gpus = f" [GPU {','.join(map(str, f.gpus))}]" if f.gpus else ""
        pb = f" (playbook: {titles.get(f.playbook, f.playbook)})" if f.playbook else ""
        out.append(f"{f.severity.name} {name} {f.kind}{gpus}: {f.summary}{pb}")
    return out


def to_json(report: CheckReport) -> dict[str, Any]:
    """The ``--json`` document (secrets are redacted by the caller). ``observed_from`` is
    ``host`` (the Proxmox host's observer) or ``container`` (the agent inside); ``hosts``
    lists the hosts' own findings (kernel events no container owns). A job is one target
    (``"kind": "job"``) with its nodes beneath (``nodes``), in place of the nodes' own rows."""
    in_jobs = {r.node.container for jj in report.jobs for r in jj.nodes}
    return {
        "status": STATUS_NAMES[report.status],
        "targets": [jj.to_dict() for jj in report.jobs]
        + [
            {
                "name": r.name,
                "state": r.state,
                "reachable": r.snapshot.reachable,
                "taken_at": r.snapshot.taken_at,
                "observed_from": r.snapshot.source,
                "progress": metrics_progress(r.snapshot.metrics),
                "findings": [finding_dict(f) for f in r.findings],
            }
            for r in report.targets
            if r.name not in in_jobs
        ],
        "hosts": [
            {"name": r.host, "findings": [finding_dict(f) for f in r.findings]}
            for r in report.hosts
        ],
        "problems": list(report.problems),
        "notified": report.notified,
    }


def redact_report(doc: Any, containers: Iterable[Any], extra: set[str] | None = None) -> Any:
    """``doc`` with secret-looking env values (ours and the containers') masked."""
    from orchestrator.monitor import alerts
    from orchestrator.wire.secrets import redact_tree

    secrets = alerts.environment_secrets([getattr(c, "env", {}) for c in containers])
    return redact_tree(doc, secrets | (extra or set()))
