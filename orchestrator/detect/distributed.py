"""Which node of a multi-node job failed first, and which failures only followed it (pure).

When one rank of a torchrun job dies, every other rank fails too, a moment or a collective
timeout later, each with an error of its own: a gloo or NCCL timeout, "Connection closed by
peer", "Connection reset by peer", the rendezvous closed, SIGTERM from its torchrun agent.
torchrun's own "first observed failure" is per node, so every node's log looks like the
first. The rule here: a node's failure is a **consequence** when its evidence is only such
errors (:data:`CONSEQUENCE_PLAYBOOKS`), a **cause** when it has evidence of its own (a death
by signal, an exception another playbook names, its container stopped, its network link
down in its host's kernel log), and **unknown** otherwise (it died, nothing says why). The
first failure is the earliest cause, else the earliest unknown, else the earliest
consequence; ties go to the lowest rank.

:func:`classify_lines` reads a node's log lines; :func:`first_failure` orders the failures.
The monitor (orch check, watch) and the postmortem both use them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.playbooks.matching import CONSEQUENCE_PLAYBOOKS, Match
from orchestrator.wire.model import KernelEvent

# CONSEQUENCE_PLAYBOOKS lives beside the matcher, which ranks by it; imported from there
NOT_A_CAUSE = frozenset({"silent-death", "tee-bypass", "ghost-utilization"})
"""Playbooks that describe how orch saw a run, not why a rank of a job failed."""

CAUSE, UNKNOWN, CONSEQUENCE = "cause", "unknown", "consequence"
_ORDER = {CAUSE: 0, UNKNOWN: 1, CONSEQUENCE: 2}


@dataclass(frozen=True, slots=True)
class Classification:
    """What a node's lines say: ``role`` (cause, unknown, consequence), the playbook and line
    that say it, and the consequence lines seen (shown as such)."""

    role: str
    playbook: str | None = None
    line: str | None = None
    lineno: int | None = None
    consequences: tuple[str, ...] = ()


def classify_lines(matches: Sequence[Match]) -> Classification:
    """A node's role from the playbook matches of its log lines (``match_log``'s, best first).

    >>> from orchestrator.playbooks.matching import CONSEQUENCE_PLAYBOOKS, Match
    >>> from orchestrator.wire.model import Severity
    >>> def m(pid, line): return Match(pid, pid, Severity.CRITICAL, 50, line, 1, 1)
    >>> classify_lines([m("peer-connection-lost", "Connection closed by peer [10.0.0.3]:1")]).role
    'consequence'
    >>> c = classify_lines([m("torchrun-sigterm", "Sending process 5 closing signal SIGTERM"),
    ...                     m("sigkill", "exitcode  : -9 (pid: 14)")])
    >>> c.role, c.playbook
    ('cause', 'sigkill')
    >>> classify_lines([]).role
    'unknown'
    """
    own = [x for x in matches if x.id not in CONSEQUENCE_PLAYBOOKS and x.id not in NOT_A_CAUSE]
    cons = [x for x in matches if x.id in CONSEQUENCE_PLAYBOOKS]
    shown = tuple(x.line.strip()[:300] for x in cons)
    if own:
        x = own[0]
        return Classification(CAUSE, x.id, x.line.strip()[:300], x.lineno, shown)
    if cons:
        x = cons[0]
        return Classification(CONSEQUENCE, x.id, x.line.strip()[:300], x.lineno, shown)
    return Classification(UNKNOWN)


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """One node's failure: ``what`` happened (``crashed``, ``died``, ``container stopped``,
    ``lost the job network``...), ``at`` (Unix s, on orch's clock; ``None``: unknown),
    ``role`` and the evidence lines."""

    node: str
    rank: int
    what: str
    role: str
    at: float | None = None
    playbook: str | None = None
    evidence: tuple[str, ...] = ()
    host: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.node} (rank {self.rank})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "rank": self.rank,
            "host": self.host,
            "what": self.what,
            "role": self.role,
            "at": self.at,
            "playbook": self.playbook,
            "evidence": list(self.evidence),
        }


def first_failure(failures: Iterable[NodeFailure]) -> NodeFailure | None:
    """The failure that explains the others: the earliest cause, else the earliest unknown,
    else the earliest consequence (no time sorts last; ties by rank).

    >>> a = NodeFailure("ct200", 0, "crashed", CONSEQUENCE, at=10.0)
    >>> b = NodeFailure("ct201", 1, "crashed", CAUSE, at=11.0)
    >>> first_failure([a, b]).node
    'ct201'
    >>> first_failure([a, NodeFailure("ct202", 2, "crashed", CONSEQUENCE, at=9.0)]).node
    'ct202'
    >>> first_failure([]) is None
    True
    """
    ranked = sorted(
        failures,
        key=lambda f: (_ORDER.get(f.role, 1), f.at if f.at is not None else float("inf"), f.rank),
    )
    return ranked[0] if ranked else None


def link_down_events(
    events: Iterable[KernelEvent], *, vmid: int | None, since: float | None
) -> list[KernelEvent]:
    """Kernel ``link-down`` events of a host that cut container ``vmid`` off the job network:
    its own ports (``veth<vmid>i0``, its firewall ports ``fwbr/fwln/fwpr<vmid>...``) or one of
    the host's own devices (a NIC, bond, bridge: agent/netlog.py ``is_host_device``), at or
    after ``since``; another guest's port (a VM's ``tap``, its firewall bridge) never, nor a
    device that is neither (a Docker veth). A later link-up is not tracked (the job fails).

    >>> ev = [KernelEvent("link-down", "eno1: NIC Link is Down", at=5.0, device="eno1"),
    ...       KernelEvent("link-down", "vmbr0: port 3(veth201i0) entered disabled state", at=6.0,
    ...                   device="veth201i0"),
    ...       KernelEvent("link-down", "vmbr0: port 2(veth200i0) entered disabled state", at=7.0,
    ...                   device="veth200i0")]
    >>> [e.device for e in link_down_events(ev, vmid=201, since=1.0)]
    ['eno1', 'veth201i0']
    >>> [e.device for e in link_down_events(ev, vmid=201, since=5.5)]
    ['veth201i0']
    >>> other = [KernelEvent("link-down", "x", at=8.0, device=d) for d in ("tap300i0", "fwpr300p0", "vethab12")]
    >>> link_down_events(other, vmid=201, since=None)
    []
    """
    from orchestrator.agent.netlog import is_host_device, vmid_of_device

    out = []
    for e in events:
        if e.kind != "link-down" or not e.device:
            continue
        if since is not None and (e.at is None or e.at < since):
            continue
        owner = vmid_of_device(e.device)
        if owner == vmid or (owner is None and is_host_device(e.device)):
            out.append(e)
    return sorted(out, key=lambda e: e.at or 0.0)
