"""Judging a target: its history in one detection window, the detectors for its container, the
``unreachable`` finding and the state word (pure; the one pipeline of watch, check and export).

``watch`` feeds each streamed snapshot, ``check`` its stored history plus the new one-shot
snapshot, ``export`` each poll's: the same history gives the same :class:`Judgement`
everywhere. Time comes from the snapshots (the newest one's ``taken_at``), never a clock.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.config.inventory import ContainerConfig
from orchestrator.detect.engine import run_detectors
from orchestrator.monitor.state import target_state
from orchestrator.playbooks.loader import Playbook
from orchestrator.wire.model import Finding, HostProbe, Severity, Snapshot

DETECT_WINDOW = 16
"""Snapshots per target the detectors see (the newest included): enough for every sample count
in Limits (the throughput baseline is 10 + 3) and a stall (which also uses the log's mtime); a
longer window costs a 64-target check seconds of parsing."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the monitor concluded about one target from its newest snapshot and history.

    ``findings`` are worst first, ``unreachable`` included when the snapshot is the
    transport's marker; ``state`` is :func:`~orchestrator.monitor.state.target_state`'s word.
    """

    name: str
    snapshot: Snapshot
    state: str
    findings: tuple[Finding, ...] = ()
    host: str | None = None


def window(history: Sequence[Snapshot]) -> list[Snapshot]:
    """The newest :data:`DETECT_WINDOW` snapshots of ``history`` (oldest first)."""
    return list(history[-DETECT_WINDOW:])


def clock(ts: float) -> str:
    """Local wall-clock ``HH:MM:SS`` for Unix seconds ``ts``."""
    return time.strftime("%H:%M:%S", time.localtime(ts))


def with_unreachable(name: str, snap: Snapshot, findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` plus an ``unreachable`` finding when ``snap`` is the transport's marker and
    none says so yet (a protocol error alone, for one).

    >>> s = Snapshot.unreachable("ct200", 0.0, "connection refused")
    >>> [f.kind for f in with_unreachable("ct200", s, [])]
    ['unreachable']
    """
    if snap.reachable or any(f.kind == "unreachable" for f in findings):
        return list(findings)
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


def judge(
    name: str,
    config: ContainerConfig,
    history: Sequence[Snapshot],
    *,
    probes: Sequence[HostProbe] = (),
    playbooks: Sequence[Playbook] | None = None,
) -> Judgement:
    """Run the detectors over the newest :data:`DETECT_WINDOW` of ``history`` (oldest first, the
    newest last) with the container's limits and GPU roles; keep ``name``'s findings, add the
    unreachable one, and name the state. Raises what a detector raises (views catch it).
    """
    recent = window(history)
    snap = recent[-1]
    found = run_detectors(
        recent,
        limits=config.limits,
        roles=config.roles_by_gpu,
        probes=probes,
        playbooks=playbooks,
    )
    mine = [f for f in found if f.target in (name, snap.target)]
    findings = with_unreachable(name, snap, mine)
    state = target_state(snap, findings, startup_grace_s=config.limits.startup_grace_s)
    return Judgement(name, snap, state, tuple(findings), host=config.host)


class TargetHistory:
    """One target's snapshots in memory, bounded by the detection window (``watch``, ``export``)."""

    def __init__(self, name: str, config: ContainerConfig) -> None:
        self.name = name
        self.config = config
        self.snapshots: collections.deque[Snapshot] = collections.deque(maxlen=DETECT_WINDOW)

    def add(self, snap: Snapshot, probes: Iterable[HostProbe] = ()) -> Judgement:
        """Append ``snap`` and judge the window."""
        self.snapshots.append(snap)
        return judge(self.name, self.config, list(self.snapshots), probes=tuple(probes))
