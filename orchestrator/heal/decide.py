"""THE restart decision (pure): what the monitor saw of a unit, the diagnosis, the policy and
the restart journal in; ``none``, ``wait``, ``restart`` with procedure P, or ``give-up`` (page
once) out. ``orch supervise`` and ``orch check --heal`` both decide with :func:`decide` only.

A unit is what restarts as one: a container today; a multi-node job (a set of containers whose
run dies when any node's does, and relaunches on all of them) when jobs exist, which is why the
observation is a sequence of :class:`NodeView`. No clock, no I/O: ``now`` is given.

The rules, in order (docs/self-healing.md):

1. No node died (running, starting, idle, finished) or a node is unreachable (its run's state
   is unknown, not dead): ``none``.
2. This death was already concluded (a ``give-up``, an outcome that started another run, an
   operator's stop recorded): ``none``. A ``restart`` claim whose claimer still holds the unit
   lock: ``none`` (in progress); one whose claimer died counts as an attempt and the decision
   goes on.
3. Stopped by an operator (``orch stop``, ``stop_requested`` before the end) and not by orch
   itself restarting it: ``none``, never restarted (journaled once).
4. The container itself is stopped, the death is not in ``restart.on``, its cause is known not
   to be retryable (the playbook's ``restart.retryable``), or unknown while
   ``restart.retry_unknown`` is false, or the budget (``max`` restarts in ``window``) is spent:
   ``give-up``, which pages once with the verdict and the remedy.
5. Before the backoff has passed since the death was first seen (persisted: a supervisor
   restarted mid-wait keeps the same due time): ``wait``.
6. Anything still holds the dead run (its pane, a process of it, GPU memory or a compute
   process on its GPUs, a ghost reading): ``wait``, and ``give-up`` once that lasts past
   ``settle_timeout`` after the due time. A stall is exempt: its run is alive by definition,
   and the restart procedure stops it first, then settles.
7. Otherwise ``restart`` with the playbook's procedure (default ``relaunch``: the same command,
   ``--resume auto``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.config.limits import Limits
from orchestrator.config.restart import RestartPolicy, format_duration
from orchestrator.lifecycle.preflight import holders
from orchestrator.monitor.journal import OUTCOMES, JournalEntry, restarts_since
from orchestrator.playbooks.loader import DEFAULT_RESTART_PROCEDURE, RestartRule
from orchestrator.wire.model import Finding, Snapshot

TRIGGER_OF_STATE = {"crashed": "crashed", "dead": "silent-death", "stalled": "stall"}
"""The monitor's state words that are deaths a policy may act on (``restart.on``)."""
UNKNOWN_STATES = frozenset({"unreachable", "connecting"})
ORCH_STOP_PREFIX = "orch restart"
"""``stop_requested`` by this prefix is orch restarting a stalled run, not an operator's stop."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One container of a unit as the monitor last judged it (:class:`~orchestrator.monitor.judge.Judgement`).

    ``gpus``: the run's GPUs (its manifest's), else the container's; ``limits``: its thresholds.
    """

    name: str
    state: str
    snapshot: Snapshot
    findings: tuple[Finding, ...] = ()
    gpus: tuple[int, ...] = ()
    limits: Limits = field(default_factory=Limits)

    @property
    def run_id(self) -> str | None:
        return self.snapshot.run.run_id if self.snapshot.run is not None else None


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What the postmortem concluded (the verdict's kind, playbook, summary, remedy), or ``None``
    fields when it could not be had; decide falls back to the findings' playbooks."""

    kind: str | None = None
    playbook: str | None = None
    summary: str = ""
    remedy: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about a unit now.

    ``action``: ``none``, ``wait``, ``restart`` or ``give-up``. ``note``: a stable word for the
    rule that decided (``backoff``, ``held``, ``budget``, ``not-retryable``...); an entry is
    journaled when ``record`` and none with the same action and note exists for this run yet.
    """

    action: str
    unit: str
    reason: str
    note: str
    run_id: str | None = None
    trigger: str | None = None
    cause: str | None = None
    procedure: str | None = None
    attempt: int | None = None
    due_at: float | None = None
    evidence: tuple[str, ...] = ()
    remedy: tuple[str, ...] = ()
    record: bool = False

    def entry(self, at: float, by: str) -> JournalEntry:
        """This decision as a journal entry."""
        return JournalEntry(
            unit=self.unit,
            at=at,
            action=self.action,
            reason=self.reason,
            run_id=self.run_id,
            note=self.note,
            trigger=self.trigger,
            cause=self.cause,
            procedure=self.procedure,
            attempt=self.attempt,
            due_at=self.due_at,
            evidence=self.evidence,
            remedy=self.remedy,
            by=by,
        )


def _trigger(node: NodeView) -> str | None:
    """The death this node shows (``crashed``, ``silent-death``, ``stall``, ``stopped``,
    ``container-stopped``), or ``None``."""
    kinds = {f.kind for f in node.findings}
    if "container-stopped" in kinds:
        return "container-stopped"
    if node.state == "stopped":
        return "stopped"
    return TRIGGER_OF_STATE.get(node.state)


def cause_of(diagnosis: Diagnosis | None, findings: Sequence[Finding], trigger: str) -> str | None:
    """The playbook that names the failure: the verdict's, else the best log signature's, else
    the death finding's own (``silent-death``, a crash's exit-code playbook); ``None``: unknown.

    >>> from orchestrator.wire.model import Severity
    >>> sig = Finding("log-signature", Severity.CRITICAL, "ct", "x", playbook="nccl-timeout")
    >>> cause_of(Diagnosis("stall"), [sig], "stall"), cause_of(None, [], "crashed")
    ('nccl-timeout', None)
    """
    if diagnosis is not None and diagnosis.playbook:
        return diagnosis.playbook
    sigs = [f.playbook for f in findings if f.kind == "log-signature" and f.playbook]
    if sigs:
        return sigs[0]
    kind = {"crashed": "crashed", "silent-death": "silent-death", "stall": "stall"}.get(trigger)
    own = [f.playbook for f in findings if f.kind == kind and f.playbook]
    return own[0] if own else None


def _evidence(node: NodeView, diagnosis: Diagnosis | None, trigger: str) -> tuple[str, ...]:
    out: list[str] = []
    if diagnosis is not None and diagnosis.summary:
        out.append(f"verdict: {diagnosis.kind}: {diagnosis.summary}")
        out += list(diagnosis.evidence[:3])
    for f in node.findings:
        if f.kind in ("crashed", "silent-death", "stall", "log-signature", "container-stopped"):
            out.append(f"{f.kind}: {f.summary}")
            out += list(f.evidence[:3])
    if not out:
        out.append(f"{node.name}: state {node.state} ({trigger})")
    return tuple(dict.fromkeys(out))[:10]


def _held(nodes: Sequence[NodeView]) -> list[str]:
    out = []
    for n in nodes:
        out += [f"{n.name}: {h}" for h in holders(n.snapshot, n.gpus, n.limits)]
        out += [f"{n.name}: {f.summary}" for f in n.findings if f.kind == "ghost-utilization"]
    return out


def decide(
    unit: str,
    nodes: Sequence[NodeView],
    diagnosis: Diagnosis | None,
    policy: RestartPolicy,
    journal: Sequence[JournalEntry],
    now: float,
    *,
    rules: Mapping[str, RestartRule],
    claim_alive: bool = False,
) -> Decision:
    """The one restart decision (the module docstring has the rules, in order).

    Args:
        unit: the container's (or job's) name.
        nodes: each node's newest judgement; the first node with a death decides.
        diagnosis: the postmortem's verdict for that death (``None``: not collected; the
            cause recorded in the journal, else the findings, stand in).
        policy: the unit's ``restart:``.
        journal: the unit's journal, oldest first (all its runs: the budget spans them).
        now: Unix seconds on the journal's clock.
        rules: playbook id -> its ``restart:`` rule (the retryable table).
        claim_alive: another process holds the unit's restart lock (a restart in progress).
    """
    if any(n.state in UNKNOWN_STATES for n in nodes):
        down = [n.name for n in nodes if n.state in UNKNOWN_STATES]
        return Decision(
            "none", unit, f"{', '.join(down)}: unreachable, the run's state is unknown", "unknown"
        )
    dead = [(n, t) for n in nodes if (t := _trigger(n)) is not None]
    if not dead:
        return Decision("none", unit, "no dead run", "alive")
    node, trigger = dead[0]
    run_id = node.run_id
    mine = [e for e in journal if e.run_id == run_id]

    def decision(action: str, reason: str, note: str, **kw: object) -> Decision:
        return Decision(action, unit, reason, note, run_id=run_id, trigger=trigger,
                        record=action != "none" or note == "operator-stop", **kw)  # type: ignore[arg-type]  # fmt: skip

    done = next(
        (
            e
            for e in mine
            if e.action in ("give-up", "none")
            or (e.action in OUTCOMES and e.new_run_id not in (None, run_id))
        ),
        None,
    )
    if done is not None:
        return Decision(
            "none",
            unit,
            f"already decided: {done.action} ({done.reason})",
            "concluded",
            run_id=run_id,
        )
    open_claim = bool(mine) and mine[-1].action == "restart"
    if open_claim and claim_alive:
        return Decision(
            "none",
            unit,
            f"restart of {run_id} in progress ({mine[-1].by})",
            "in-progress",
            run_id=run_id,
        )
    ours = open_claim or any(e.action == "restart" for e in mine)
    if trigger == "stopped":
        run = node.snapshot.run
        by = (run.stop_requested_by if run is not None else None) or "orch stop"
        if not (ours and by.startswith(ORCH_STOP_PREFIX)):
            return decision(
                "none", f"stopped by {by}: an operator's stop is never restarted", "operator-stop"
            )
        trigger = next((e.trigger for e in mine if e.trigger), "stall")
    first = mine[0] if mine else None
    known = first.cause if first is not None else cause_of(diagnosis, node.findings, trigger)
    evidence = (
        first.evidence
        if first is not None and first.evidence
        else _evidence(node, diagnosis, trigger)
    )
    rule = rules.get(known) if known else None
    remedy = diagnosis.remedy if diagnosis is not None else ()
    remedy = first.remedy if first is not None and first.remedy else remedy

    def give_up(reason: str, note: str) -> Decision:
        return decision("give-up", reason, note, cause=known, evidence=evidence, remedy=remedy)

    if trigger == "container-stopped":
        return give_up(
            f"{node.name}: the container is stopped (pct status); orch does not "
            f"start containers: start it, then relaunch",
            "container-stopped",
        )
    if trigger not in policy.on:
        return give_up(f"{trigger} is not in restart.on ({', '.join(policy.on)})", "not-in-on")
    if rule is not None and not rule.retryable:
        return give_up(f"{known}: not retryable: {rule.why}", "not-retryable")
    if rule is None and not policy.retry_unknown:
        what = f"no restart rule in playbook {known}" if known else "no playbook names the cause"
        return give_up(
            f"{trigger}, cause unknown ({what}); restart.retry_unknown is false", "unknown-cause"
        )
    procedure = (rule.procedure if rule is not None else None) or DEFAULT_RESTART_PROCEDURE
    used = restarts_since(journal, now - policy.window_s)
    if used >= policy.max_restarts:
        return give_up(
            f"restart budget spent: {used} restart(s) in {format_duration(policy.window_s)} "
            f"(max {policy.max_restarts})",
            "budget",
        )
    attempts = [e for e in mine if e.action in ("restart", *OUTCOMES)]
    base = attempts[-1].at if attempts else (first.at if first is not None else now)
    due = base + policy.backoff_for(used)
    what = f"{trigger} ({known or 'cause unknown'})"
    kw = dict(cause=known, procedure=procedure, attempt=used + 1, evidence=evidence, remedy=remedy)
    if now < due:
        return decision(
            "wait",
            f"{what}: restart {used + 1} of {policy.max_restarts} with {procedure} "
            f"due after the backoff of {format_duration(due - base)}",
            "backoff",
            due_at=due,
            **kw,
        )
    if trigger != "stall":
        held = _held(nodes)
        if held:
            if now - due >= policy.settle_timeout_s:
                return give_up(
                    f"still held {format_duration(policy.settle_timeout_s)} after the "
                    f"restart was due, not relaunched: " + "; ".join(held[:3]),
                    "held-too-long",
                )
            return decision(
                "wait",
                f"{what}: waiting for the dead run to let go: " + "; ".join(held[:3]),
                "held",
                due_at=due,
                **kw,
            )
    return decision(
        "restart",
        f"{what}: restart {used + 1} of {policy.max_restarts} with {procedure}",
        "restart",
        **kw,
    )


def should_record(d: Decision, journal: Sequence[JournalEntry]) -> bool:
    """Whether ``d`` is new: a recorded decision is journaled once per run, action, note and
    attempt (a ``wait`` repeated every pass is written once; a ``restart`` is always new)."""
    if d.action == "restart":
        return True
    return d.record and not any(
        e.run_id == d.run_id
        and e.action == d.action
        and e.note == d.note
        and e.attempt == d.attempt
        for e in journal
    )


def close_orphan_claim(
    unit: str,
    journal: Sequence[JournalEntry],
    current_run: str | None,
    *,
    claim_alive: bool,
    now: float,
    by: str,
) -> JournalEntry | None:
    """The outcome entry for a restart claim whose claimer died after starting another run:
    the unit's current run is no longer the claimed one (``restarted``, observed), else
    ``None`` (no open claim, still in progress, or the dead run is still current: :func:`decide`
    counts it and goes on).

    >>> j = [JournalEntry("ct", 1.0, "restart", "r", run_id="a", attempt=1, by="p1")]
    >>> close_orphan_claim("ct", j, "b", claim_alive=False, now=9.0, by="p2").action
    'restarted'
    >>> close_orphan_claim("ct", j, "b", claim_alive=True, now=9.0, by="p2") is None
    True
    """
    if not journal or journal[-1].action != "restart" or claim_alive:
        return None
    claim = journal[-1]
    if current_run is None or current_run == claim.run_id:
        return None
    return JournalEntry(
        unit=unit,
        at=now,
        action="restarted",
        run_id=claim.run_id,
        new_run_id=current_run,
        attempt=claim.attempt,
        procedure=claim.procedure,
        cause=claim.cause,
        trigger=claim.trigger,
        reason=f"run {current_run} is current: the restarting process ({claim.by}) ended before "
        "it recorded the outcome",
        note="observed",
        by=by,
    )


def interrupted(unit: str, claim: JournalEntry, now: float, by: str) -> JournalEntry:
    """The outcome of a claim whose claimer died before starting anything: it counts as an
    attempt (the budget never grows back), and the next one waits its own backoff."""
    return JournalEntry(
        unit=unit,
        at=now,
        action="interrupted",
        run_id=claim.run_id,
        attempt=claim.attempt,
        procedure=claim.procedure,
        cause=claim.cause,
        trigger=claim.trigger,
        note="interrupted",
        reason=f"the restart claimed by {claim.by} never finished (that process is gone)",
        by=by,
    )
