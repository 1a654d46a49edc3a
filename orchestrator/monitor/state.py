"""The one-word state of a target, shared by watch, check and export (pure).

States: ``connecting`` (no answer yet), ``unreachable`` (the transport failed:
we know nothing, which is not a death), ``stopped`` (the container is down, or
the run ended after ``orch stop`` asked it to),
``idle`` (no run), ``starting``, ``running``, ``stalled``, ``finished``,
``crashed`` (exit status != 0), ``dead`` (vanished: no session, no process, no
exit status: a silent death).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.detect.base import ended_on_request
from orchestrator.wire.model import Finding, RunState, Snapshot

# Finding kinds that decide the state outright, strongest first.
_BY_FINDING = (
    ("silent-death", "dead"),
    ("crashed", "crashed"),
    ("container-stopped", "stopped"),
    ("finished", "finished"),
    ("stall", "stalled"),
)


def target_state(
    snap: Snapshot | None,
    findings: Sequence[Finding] = (),
    *,
    startup_grace_s: float = 120.0,
) -> str:
    """The state word for a target's newest snapshot and its active findings.

    Findings win over raw readings (the detectors saw the history); without
    one, the snapshot decides. Time comes from the snapshot only.

    >>> from orchestrator.wire.model import RunState, SessionState
    >>> target_state(None)
    'connecting'
    >>> target_state(Snapshot.unreachable("ct200", 10.0, "connection refused"))
    'unreachable'
    >>> s = Snapshot("ct200", 100.0, run=RunState("r1", "/w/runs/r1", exit_status=137),
    ...              session=SessionState("train", True, pane_dead=True))
    >>> target_state(s)
    'crashed'
    >>> s = Snapshot("ct200", 100.0, run=RunState("r1", "/w/runs/r1"),
    ...              session=SessionState("train", False, server_running=False))
    >>> target_state(s)
    'dead'
    >>> target_state(Snapshot("ct200", 100.0))
    'idle'
    >>> s = Snapshot("ct200", 100.0, run=RunState("r1", "/w/runs/r1", exit_status=130,
    ...              exit_status_at=95.0, stop_requested_at=94.0))
    >>> target_state(s)
    'stopped'
    """
    if snap is None:
        return "connecting"
    if not snap.reachable:
        return "unreachable"
    if snap.run is not None and stopped_on_request(snap.run, snap.taken_at):
        return "stopped"
    kinds = {f.kind for f in findings if f.target == snap.target}
    for kind, state in _BY_FINDING:
        if kind in kinds:
            return state
    if snap.container_status not in (None, "running"):
        return "stopped"
    run = snap.run
    if run is None:
        return "idle"
    if run.exit_status is not None:
        return "finished" if run.exit_status == 0 else "crashed"
    session = snap.session
    if session is not None and session.exists and session.pane_dead:
        status = session.pane_dead_status
        if session.pane_dead_signal or (status is not None and status != 0):
            return "crashed"
        return "finished" if status == 0 else "crashed"
    if session is not None and not session.exists and not snap.processes:
        return "dead"
    started = run.manifest.started_at if run.manifest is not None else None
    if not stepped(snap) and started is not None and snap.taken_at - started < startup_grace_s:
        return "starting"
    return "running"


def stepped(snap: Snapshot) -> bool:
    """Whether this snapshot shows the run past its first step: a step in the log lines it
    read, a heartbeat file (the stall detector's rule), or a ``step=N`` line on the pane.

    One snapshot's metrics alone are not enough: ``orch check`` reads only the log lines
    written since the previous check (none: no metrics), and a deleted log yields none at
    all, while the pane still shows the run stepping.

    >>> from orchestrator.wire.model import SessionState
    >>> r = RunState("r1", "/w/runs/r1")
    >>> stepped(Snapshot("ct", 1.0, run=r, session=SessionState("t", True, pane_tail=("step=4 loss=2",))))
    True
    >>> stepped(Snapshot("ct", 1.0, run=r, session=SessionState("t", True, pane_tail=("loading",))))
    False
    """
    from orchestrator.wire.progress import read_line

    if snap.metrics is not None and snap.metrics.step is not None:
        return True
    if snap.run is not None and snap.run.heartbeat_age_s is not None:
        return True
    tail = snap.session.pane_tail if snap.session is not None else ()
    return any((r := read_line(line)) is not None and r.step is not None for line in tail)


def stopped_on_request(run: RunState, taken_at: float) -> bool:
    """The run exited after ``orch stop`` asked it to (:func:`~orchestrator.detect.base.ended_on_request`;
    an exit of unknown time counts at ``taken_at``), whatever its exit status.

    >>> stopped_on_request(RunState("r", "/r", exit_status=130, stop_requested_at=10.0), 12.0)
    True
    >>> stopped_on_request(RunState("r", "/r", exit_status=137, exit_status_at=5.0,
    ...                             stop_requested_at=10.0), 12.0)
    False
    """
    if run.exit_status is None:
        return False
    at = run.exit_status_at if run.exit_status_at is not None else taken_at
    return ended_on_request(run.stop_requested_at, at)
