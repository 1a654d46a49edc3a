"""The pure half of ``orch postmortem JOB``: every node's evidence on one timeline, the first
failure and the consequences (no I/O; :mod:`orchestrator.postmortem.jobs` collects).

Each node's evidence is a single run's (:class:`~orchestrator.postmortem.evidence.Evidence`,
judged by :func:`orchestrator.postmortem.verdict.judge` as for one container). Its times are
its host's clock; the measured offset of each host (:class:`ClockOffset`) brings them onto
orch's clock before anything is compared. A node's failure is, by precedence: its
container stopped; its host's kernel log says its job-network link went down (the host's
NIC, or the container's bridge port) after the launch; it died (exit status, or vanished),
classified by its own log and pane (:mod:`orchestrator.detect.distributed`): a **cause**
when its evidence is its own (a signal, an exception a playbook names), a **consequence**
when it is only what ranks report after another one went away (gloo/NCCL timeouts, a
peer's connection closed or reset, the rendezvous closed, SIGTERM from torchrun's agent).
The first failure is the earliest cause (then unknown, then consequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config.jobs import JobConfig, JobNode
from orchestrator.detect.base import fmt_time, signal_name
from orchestrator.detect.distributed import (
    CAUSE,
    CONSEQUENCE,
    NodeFailure,
    classify_lines,
    first_failure,
    link_down_events,
)
from orchestrator.postmortem.evidence import Evidence
from orchestrator.postmortem.verdict import Postmortem
from orchestrator.wire.model import KernelEvent, Severity
from orchestrator.wire.progress import read_log

REMEDY = {
    "container-stopped": (
        "Find out why the container stopped: the host's journal (journalctl -u pve-container@VMID) "
        "and its kernel log around the time.",
        "Start it (pct start VMID), then relaunch the whole job (orch launch JOB): torchrun does "
        "not take a node back into a running c10d job without elastic restarts.",
    ),
    "link-down": (
        "The node's host lost the job network (its NIC or the container's bridge port went "
        "down): check the cable, switch port and NIC (ip link, ethtool, the host's kernel log).",
        "Relaunch the job once the link is up; lower jobs.NAME.collective_timeout so the next "
        "loss fails the job in minutes instead of half an hour.",
    ),
}


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """A host's clock minus orch's (seconds), measured over SSH: the remote time against the
    midpoint of the request (``uncertainty_s`` is half the round trip)."""

    host: str
    offset_s: float = 0.0
    uncertainty_s: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "offset_s": round(self.offset_s, 6),
            "uncertainty_s": round(self.uncertainty_s, 6),
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node of the job: its evidence, single-run postmortem, host and failure."""

    node: JobNode
    host: str
    postmortem: Postmortem
    offset: ClockOffset
    failure: NodeFailure | None = None
    vmid: int | None = None

    @property
    def evidence(self) -> Evidence:
        return self.postmortem.evidence

    def to_dict(self) -> dict[str, Any]:
        ev = self.evidence
        return {
            "node": self.node.container,
            "rank": self.node.rank,
            "host": self.host,
            "address": self.node.address,
            "run_id": ev.run_id,
            "container_status": ev.container_status,
            "exit_status": ev.exit_status,
            "died_at": self.to_orch(ev.exit_status_at),
            "clock_offset_s": round(self.offset.offset_s, 6),
            "role": self.failure.role if self.failure else None,
            "failure": self.failure.to_dict() if self.failure else None,
            "verdict": self.postmortem.verdict.to_dict(),
            "errors": list(ev.errors),
        }

    def to_orch(self, at: float | None) -> float | None:
        """A time of this node's host clock on orch's clock."""
        return None if at is None else at - self.offset.offset_s


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One point of the job's timeline, on orch's clock: ``kind`` is ``launch``, ``death``,
    ``kernel``, ``stop``, ``first-step``, ``last-step`` or ``error``."""

    at: float
    node: str
    rank: int
    kind: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "time": fmt_time(self.at),
            "node": self.node,
            "rank": self.rank,
            "kind": self.kind,
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class JobVerdict:
    """The job's verdict: ``kind`` (the first failure's: ``container-stopped``, ``link-down``,
    ``log-signature``, ``crashed``, ``silent-death``; ``stopped``, ``finished`` or ``healthy``
    when no node failed), its playbook, a summary, the first failure and the consequences."""

    kind: str
    summary: str
    playbook: str | None = None
    first: NodeFailure | None = None
    consequences: tuple[NodeFailure, ...] = ()
    remedy: tuple[str, ...] = ()
    reached: bool = True

    def to_dict(self) -> dict[str, Any]:
        f = self.first
        return {
            "kind": self.kind,
            "playbook": self.playbook,
            "summary": self.summary,
            "first_failure": (
                {
                    "node": f.node,
                    "rank": f.rank,
                    "at": f.at,
                    "time": fmt_time(f.at),
                    "host": f.host,
                    "what": f.what,
                    "role": f.role,
                    "evidence": list(f.evidence),
                }
                if f is not None
                else None
            ),
            "consequences": [c.to_dict() for c in self.consequences],
            "remedy": list(self.remedy),
            "reached": self.reached,
        }


@dataclass(frozen=True, slots=True)
class JobPostmortem:
    """Everything ``orch postmortem JOB`` concluded."""

    job: str
    run_id: str
    nodes: tuple[NodeReport, ...]
    verdict: JobVerdict
    timeline: tuple[TimelineEvent, ...] = ()
    collected_at: float = 0.0
    bundle: str | None = None
    offsets: tuple[ClockOffset, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "job": self.job,
            "run_id": self.run_id,
            "verdict": self.verdict.to_dict(),
            "nodes": [n.to_dict() for n in self.nodes],
            "clock_offsets": [o.to_dict() for o in self.offsets],
            "timeline": [e.to_dict() for e in self.timeline],
            "bundle": self.bundle,
        }


def node_failure(report: NodeReport, playbooks: Sequence[Any]) -> NodeFailure | None:
    """How ``report``'s node failed, on orch's clock (``None``: it did not)."""
    from orchestrator.playbooks.loader import match_log

    ev, node, host = report.evidence, report.node, report.host
    vmid = report.vmid
    started = report.to_orch(ev.manifest.started_at if ev.manifest else None)
    events = [_shift(e, report) for e in (ev.probe.kernel_events if ev.probe else ())]
    links = link_down_events(events, vmid=vmid, since=started)
    if ev.container_status in ("stopped", "missing"):
        at = links[0].at if links else None
        return NodeFailure(
            node.container,
            node.rank,
            f"lost its container (pct status: {ev.container_status})",
            CAUSE,
            at,
            None,
            tuple(
                [
                    ev.pct_status_text.strip() or "pct status: stopped",
                    *(f"{host} kernel: {e.line}" for e in links[:2]),
                ]
            ),
            host,
            {"kind": "container-stopped"},
        )
    if links:
        e = links[0]
        return NodeFailure(
            node.container,
            node.rank,
            f"lost the job network ({host}: {e.device} down)",
            CAUSE,
            e.at,
            None,
            (f"{host} kernel: {e.line}",),
            host,
            {"kind": "link-down"},
        )
    code = ev.exit_status
    asked = report.postmortem.verdict.kind == "stopped"
    dead = (code not in (None, 0) or ev.run_state == "vanished") and not asked
    # a worker's death is in the log while torchrun's agent may still be up (it can hang on a
    # store it cannot reach): a critical log signature of a live run counts too
    signs = [
        f
        for f in report.postmortem.findings
        if f.kind == "log-signature" and f.severity >= Severity.CRITICAL
    ]
    if not dead and (asked or not signs):
        return None
    lines = [*ev.log_tail, *ev.pane]
    cls = classify_lines(match_log(lines, playbooks))
    why = f"a worker killed by {signal_name(137)}" if cls.playbook == "sigkill" else cls.playbook
    status = (
        f"exit status {code}"
        if code is not None
        else ("no exit status: vanished" if dead else None)
    )
    verb = "failed" if cls.role == CONSEQUENCE else ("died" if dead and code is None else "crashed")
    what = f"{verb} (" + ", ".join(x for x in (why, status) if x) + ")"
    kind = (
        "log-signature"
        if cls.playbook and cls.role == CAUSE
        else ("silent-death" if dead and code is None else "crashed")
    )
    evidence = tuple(
        x for x in (cls.line, f"exit_status: {code}" if code is not None else None) if x
    )
    if dead:
        at = report.to_orch(ev.exit_status_at) or report.to_orch(ev.log_mtime)
    else:
        at = report.to_orch(
            min((f.since for f in signs if f.since is not None), default=ev.log_mtime)
        )
    return NodeFailure(
        node.container, node.rank, what, cls.role, at, cls.playbook, evidence, host, {"kind": kind}
    )


def _shift(e: KernelEvent, report: NodeReport) -> KernelEvent:
    from dataclasses import replace

    return replace(e, at=report.to_orch(e.at))


def timeline(nodes: Sequence[NodeReport]) -> list[TimelineEvent]:
    """Every node's events on orch's clock, oldest first."""
    out = [e for n in nodes for e in _node_events(n)]
    return sorted(out, key=lambda e: (e.at, e.rank))


def _node_events(n: NodeReport) -> list[TimelineEvent]:
    ev = n.evidence
    out: list[TimelineEvent] = []

    def add(at: float | None, kind: str, text: str) -> None:
        t = n.to_orch(at)
        if t is not None:
            out.append(TimelineEvent(t, n.node.container, n.node.rank, kind, text))

    if ev.manifest is not None:
        add(ev.manifest.started_at, "launch", f"run {ev.run_id} started")
    steps = [r for r in ev.metrics if isinstance(r.get("time"), (int, float))]
    if steps:
        add(float(steps[0]["time"]), "first-step", f"step {steps[0].get('step')}")
        add(float(steps[-1]["time"]), "last-step", f"step {steps[-1].get('step')} (last logged)")
    elif ev.log_tail and ev.log_mtime is not None:  # the user's own script: no metrics.jsonl
        framework, r = read_log(ev.log_tail)
        if r.step is not None:
            add(
                ev.log_mtime,
                "last-step",
                f"step {r.step} (last in the log, {framework or 'generic'})",
            )
    if ev.stop_requested_at is not None:
        add(
            ev.stop_requested_at, "stop", f"stop requested by {ev.stop_requested_by or 'orch stop'}"
        )
    for e in ev.probe.kernel_events if ev.probe else ():
        if e.kind in ("link-down", "xid", "oom-killer", "fallen-off-bus"):
            add(e.at, "kernel", f"{n.host} kernel: {e.line}")
    f = n.failure
    if ev.exit_status_at is not None:
        add(
            ev.exit_status_at,
            "death",
            f"exit status {ev.exit_status}" + (f": {f.what}" if f else ""),
        )
        if f is not None and f.evidence:
            add(ev.exit_status_at, "error", f.evidence[0])
    elif f is not None and f.at is not None and f.extra.get("kind") == "container-stopped":
        out.append(TimelineEvent(f.at, n.node.container, n.node.rank, "death", f.what))
    return out


def decide(
    job: JobConfig, nodes: Sequence[NodeReport], playbooks: Sequence[Any] = ()
) -> JobVerdict:
    """The job's verdict from its nodes (their ``failure`` already set)."""
    failures = [n.failure for n in nodes if n.failure is not None]
    first = first_failure(failures)
    if first is None:
        kinds = {n.postmortem.verdict.kind for n in nodes}
        if kinds == {"stopped"} or ("stopped" in kinds and kinds <= {"stopped", "finished"}):
            return JobVerdict("stopped", f"job {job.name} was stopped on request on every node")
        if kinds == {"finished"}:
            return JobVerdict("finished", f"job {job.name} finished on every node (exit status 0)")
        return JobVerdict(
            "healthy",
            f"job {job.name}: every node is alive with no failure; nothing to explain",
            reached=False,
        )
    others = tuple(f for f in failures if f is not first)
    summary = f"node {first.label} {first.what} first, at {fmt_time(first.at)}"
    if others:
        parts = [f"{f.label} {f.what}" + (f" at {fmt_time(f.at)}" if f.at else "") for f in others]
        summary += "; then " + "; ".join(parts)
        if all(f.role != CAUSE for f in others):
            summary += ": consequences of the first"
    kind = str(first.extra.get("kind") or "crashed")
    remedy = REMEDY.get(kind) or next(
        (tuple(p.remedy) for p in playbooks if p.id == first.playbook), ()
    )
    if not remedy:
        remedy = next(
            (n.postmortem.verdict.remedy for n in nodes if n.node.container == first.node), ()
        )
    return JobVerdict(kind, summary, first.playbook, first, others, remedy)
