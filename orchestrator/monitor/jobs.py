"""A job as one row: its nodes' judgements gathered, its state, its first failure (pure).

``orch check``, ``watch``, ``export`` and ``status`` judge each node as a target of its own
(:mod:`orchestrator.monitor.judge`); :func:`judge_job` then puts a job's nodes together:

- the job's state is its worst node's (:data:`STATE_ORDER`);
- a node that failed (crashed or died, its container stopped, its job-network link down
  in its host's kernel log) makes the job CRITICAL at once with a ``job-node-failed``
  finding naming it: ``node ct201 (rank 1) crashed; the other nodes will block at the next
  collective``, before the survivors' collective timeout fires. When several nodes have
  failed, the first failure (:func:`orchestrator.detect.distributed.first_failure`) is named
  and the others are called its consequences;
- each node's newest rate with its unit, and the job's figure per unit
  (:mod:`orchestrator.monitor.job_rates`: summed per unit, a per-device rate times the
  node's device count when known, never two units added); ``tokens_per_s`` is its tokens/s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.inventory import ContainerConfig
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
from orchestrator.monitor.job_rates import JobRate, job_rates, node_rate
from orchestrator.monitor.job_rates import tokens_per_s as job_tokens_per_s
from orchestrator.monitor.judge import Judgement
from orchestrator.monitor.state import stopped_on_request
from orchestrator.wire.model import Finding, HostProbe, KernelEvent, Severity, Snapshot

STATE_ORDER = (
    "dead",
    "crashed",
    "stopped",
    "unreachable",
    "stalled",
    "connecting",
    "starting",
    "idle",
    "finished",
    "running",
)
"""Node states, worst first: a job is in its worst node's state."""
JOB_FINDING = "job-node-failed"
BLOCK = "the other nodes will block at the next collective"


def worst_state(states: Sequence[str]) -> str:
    """The worst of ``states`` (an unknown word counts as ``running``).

    >>> worst_state(["running", "crashed", "stalled"]), worst_state([])
    ('crashed', 'connecting')
    """
    if not states:
        return "connecting"
    rank = {s: i for i, s in enumerate(STATE_ORDER)}
    return min(states, key=lambda s: rank.get(s, len(STATE_ORDER)))


@dataclass(frozen=True, slots=True)
class NodeRow:
    """One node under its job: the node, its judgement, its latest tokens/s and step.

    ``throughput``/``throughput_unit`` is the node's newest rate as its log prints it;
    ``devices`` the GPUs it uses (the job's ``gpus``, else those its snapshot sees; ``None``
    when neither says); ``tokens_per_s`` its tokens/s, a per-device rate times ``devices``.
    """

    node: JobNode
    judgement: Judgement
    host: str
    tokens_per_s: float | None = None
    step: int | None = None
    failure: NodeFailure | None = None
    throughput: float | None = None
    throughput_unit: str | None = None
    devices: int | None = None

    def to_dict(self) -> dict[str, Any]:
        snap = self.judgement.snapshot
        return {
            "name": self.node.container,
            "rank": self.node.rank,
            "host": self.host,
            "address": self.node.address,
            "state": self.judgement.state,
            "reachable": snap.reachable,
            "taken_at": snap.taken_at,
            "run_id": snap.run.run_id if snap.run else None,
            "step": self.step,
            "tokens_per_s": self.tokens_per_s,
            "throughput": (
                {"value": self.throughput, "unit": self.throughput_unit, "devices": self.devices}
                if self.throughput is not None
                else None
            ),
            "failure": self.failure.to_dict() if self.failure else None,
            "findings": [finding_dict(f) for f in self.judgement.findings],
        }


@dataclass(frozen=True, slots=True)
class JobJudgement:
    """A job's nodes (rank order), state, findings (``job-node-failed``), first failure, total
    tokens/s and its throughput per unit (:func:`~orchestrator.monitor.job_rates.job_rates`)."""

    name: str
    state: str
    nodes: tuple[NodeRow, ...]
    findings: tuple[Finding, ...] = ()
    first_failure: NodeFailure | None = None
    tokens_per_s: float | None = None
    throughput: tuple[JobRate, ...] = ()

    @property
    def reachable(self) -> bool:
        return any(r.judgement.snapshot.reachable for r in self.nodes)

    @property
    def every_finding(self) -> list[Finding]:
        """The job's own findings, then each node's."""
        return [*self.findings, *(f for r in self.nodes for f in r.judgement.findings)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": "job",
            "state": self.state,
            "reachable": self.reachable,
            "taken_at": max((r.judgement.snapshot.taken_at for r in self.nodes), default=None),
            "tokens_per_s": self.tokens_per_s,
            "throughput": [r.to_dict() for r in self.throughput],
            "first_failure": self.first_failure.to_dict() if self.first_failure else None,
            "findings": [finding_dict(f) for f in self.findings],
            "nodes": [r.to_dict() for r in self.nodes],
        }


def finding_dict(f: Finding) -> dict[str, Any]:
    """A finding as ``orch check --json`` shows it."""
    return {
        "kind": f.kind,
        "severity": str(f.severity),
        "gpus": list(f.gpus),
        "playbook": f.playbook,
        "summary": f.summary,
        "since": f.since,
        "evidence": list(f.evidence),
    }


def _lines(history: Sequence[Snapshot]) -> list[str]:
    """A node's recent log lines (every snapshot's new ones) and its newest pane screen."""
    out: list[str] = []
    for s in history:
        if s.run is not None:
            out.extend(s.run.new_log_lines)
    last = history[-1] if history else None
    if last is not None and last.session is not None:
        out.extend(last.session.pane_tail)
    return out[-400:]


def node_failure(
    node: JobNode,
    container: ContainerConfig,
    judgement: Judgement,
    history: Sequence[Snapshot] = (),
    events: Sequence[KernelEvent] = (),
    playbooks: Sequence[Any] | None = None,
) -> NodeFailure | None:
    """Whether and how ``node`` failed, from its judgement, recent snapshots and its host's
    kernel events (``None``: it has not failed; a stop someone asked for is no failure)."""
    from orchestrator.detect.engine import default_playbooks
    from orchestrator.playbooks.loader import match_log

    snap = judgement.snapshot
    host = container.host
    started = snap.run.manifest.started_at if snap.run and snap.run.manifest else None
    if snap.container_status in ("stopped", "missing"):
        links = link_down_events(events, vmid=container.vmid, since=started)
        at = links[0].at if links else snap.taken_at
        return NodeFailure(
            node.container,
            node.rank,
            f"lost its container ({snap.container_status}, pct status)",
            CAUSE,
            at,
            None,
            tuple([*snap.errors[:1], *(e.line for e in links[:2])]),
            host,
        )
    run = snap.run
    if run is not None and stopped_on_request(run, snap.taken_at):
        return None
    links = link_down_events(events, vmid=container.vmid, since=started)
    if links and snap.reachable:
        e = links[0]
        return NodeFailure(
            node.container,
            node.rank,
            f"lost the job network at {fmt_time(e.at)} (host {host}: {e.device} down)",
            CAUSE,
            e.at,
            None,
            (f"{host} kernel: {e.line}",),
            host,
        )
    dead = judgement.state in ("crashed", "dead") or (
        run is not None and run.exit_status not in (None, 0)
    )
    # a worker's death shows in the log before torchrun's agent exits (a second or two)
    signs = [
        f
        for f in judgement.findings
        if f.kind == "log-signature" and f.severity >= Severity.CRITICAL
    ]
    if not dead and not signs:
        return None
    pbs = tuple(default_playbooks() if playbooks is None else playbooks)
    cls = classify_lines(match_log(_lines(history or [snap]), pbs))
    code = run.exit_status if run is not None else None
    why = f"a worker killed by {signal_name(137)}" if cls.playbook == "sigkill" else cls.playbook
    if judgement.state == "dead":
        what = "died (" + ", ".join(x for x in (why, "no exit status: vanished") if x) + ")"
    else:
        status = f"exit status {code}" if code is not None else None
        detail = ", ".join(x for x in (why, status) if x)
        what = ("crashed" if cls.role != CONSEQUENCE else "failed") + (
            f" ({detail})" if detail else ""
        )
    if dead:
        at = run.exit_status_at if run is not None and run.exit_status_at else snap.taken_at
    else:
        at = min((f.since for f in signs if f.since is not None), default=snap.taken_at)
    evidence = tuple(
        x for x in (cls.line, f"exit_status: {code}" if code is not None else None) if x
    )
    return NodeFailure(node.container, node.rank, what, cls.role, at, cls.playbook, evidence, host)


def judge_job(
    job: JobConfig,
    containers: Mapping[str, ContainerConfig],
    judgements: Mapping[str, Judgement],
    *,
    histories: Mapping[str, Sequence[Snapshot]] | None = None,
    probes: Mapping[str, HostProbe] | None = None,
    playbooks: Sequence[Any] | None = None,
) -> JobJudgement:
    """Put ``job``'s node judgements together (see the module docstring). A node without a
    judgement (not asked) is left out. ``probes`` maps a host to its probe (kernel events
    since the job's launch)."""
    rows: list[NodeRow] = []
    failures: list[NodeFailure] = []
    for node in job.nodes:
        j = judgements.get(node.container)
        if j is None:
            continue
        c = containers[node.container]
        hist = list((histories or {}).get(node.container) or [j.snapshot])
        probe = (probes or {}).get(c.host)
        events = probe.kernel_events if probe is not None else ()
        fail = node_failure(node, c, j, hist, events, playbooks)
        rate, unit, step = _progress(hist, j.state)
        devices = _devices(node, j.snapshot)
        tps = None
        if rate is not None and unit is not None:
            value, u = node_rate(rate, unit, devices)
            tps = value if u == "tokens/s" else None
        rows.append(NodeRow(node, j, c.host, tps, step, fail, rate, unit, devices))
        if fail is not None:
            failures.append(fail)
    state = worst_state([r.judgement.state for r in rows])
    first = first_failure(failures)
    findings: tuple[Finding, ...] = ()
    if first is not None:
        findings = (_job_finding(job, first, failures, rows),)
    rates = job_rates(
        (r.throughput, r.throughput_unit, r.devices)
        for r in rows
        if r.throughput is not None and r.throughput_unit is not None
    )
    return JobJudgement(
        job.name, state, tuple(rows), findings, first, job_tokens_per_s(rates), rates
    )


def _progress(
    history: Sequence[Snapshot], state: str
) -> tuple[float | None, str | None, int | None]:
    """The newest rate and its unit (while running) and step a node's snapshots show; an
    older agent's bare tokens/s is a rate in tokens/s."""
    rate: float | None = None
    unit: str | None = None
    step: int | None = None
    for s in history:
        m = s.metrics
        if m is not None:
            if m.throughput is not None and m.throughput_unit is not None:
                rate, unit = m.throughput, m.throughput_unit
            elif m.tokens_per_s is not None:
                rate, unit = m.tokens_per_s, "tokens/s"
            if m.step is not None:
                step = m.step
    if state not in ("running", "stalled"):
        rate = unit = None
    return rate, unit, step


def _devices(node: JobNode, snap: Snapshot) -> int | None:
    """The GPUs a node uses: the job's ``gpus`` for it, else those its snapshot sees."""
    if node.gpu_indices:
        return len(node.gpu_indices)
    return len(snap.gpus) or None


def _job_finding(
    job: JobConfig, first: NodeFailure, failures: Sequence[NodeFailure], rows: Sequence[NodeRow]
) -> Finding:
    others = [f for f in failures if f is not first]
    alive = [
        r
        for r in rows
        if r.failure is None and r.judgement.state in ("running", "starting", "stalled")
    ]
    summary = f"node {first.label} {first.what}"
    if others:
        shown = ", ".join(
            f"{f.label}" + (f" ({f.playbook})" if f.playbook else f" ({f.what})") for f in others
        )
        summary += f" first; {shown} failed after it"
        if all(f.role != CAUSE for f in others):
            summary += " (consequences)"
    if alive:
        summary += f"; {BLOCK}"
    evidence = [f"{first.label}: {e}" for e in first.evidence]
    evidence += [f"{f.label}, {f.role}: {f.evidence[0] if f.evidence else f.what}" for f in others]
    return Finding(
        kind=JOB_FINDING,
        severity=Severity.CRITICAL,
        target=job.name,
        summary=summary,
        since=first.at,
        evidence=tuple(evidence[:8]),
        playbook=first.playbook,
    )
