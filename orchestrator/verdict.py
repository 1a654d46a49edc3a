"""The pure half of ``orch postmortem``: evidence in, history, findings and a verdict out.

No I/O: :mod:`orchestrator.postmortem` collects the :class:`Evidence` (agent, host,
kernel log) and writes the bundle; everything here is a function of that evidence.

The flight recorder is turned back into a snapshot history
(:func:`reconstruct_history`) and fed with the final state to
:func:`orchestrator.detect.engine.run_detectors`; the log tail and the pane go
through :func:`orchestrator.playbooks.match_log`; :func:`decide` picks the
verdict with this precedence: container stopped > OOM killer (exit 137 and a
kernel OOM line for the run's pid or process) > stopped on purpose (``orch stop``
left ``stop_requested`` before signalling, and the run ended after it) > a known
log signature > crashed (signal or exit code) > silent death > ghost utilization >
finished. A run that is alive is judged on its worst problem (ghost utilization
is the GPU verdict); alive with no problem is ``healthy`` (nothing to explain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.detect.base import fmt_time, signal_name
from orchestrator.detect.host import OOM_WINDOW_S as OOM_WINDOW_S  # re-exported
from orchestrator.detect.host import oom_kills_of_run
from orchestrator.detect.host import run_pids_and_names as history_pids_and_names
from orchestrator.detect.limits import Limits
from orchestrator.model import (
    Finding,
    GpuSample,
    HostProbe,
    KernelEvent,
    Metrics,
    NvmlStatus,
    ProcessInfo,
    RunManifest,
    RunState,
    SchemaError,
    SessionState,
    Severity,
    Snapshot,
)
from orchestrator.playbooks import Match, Playbook, match_log

HEALTHY = "healthy"
"""Verdict kind of a run that is alive with no problem (not a finding kind: nothing died)."""
STOPPED = "stopped"
"""Verdict kind of a run that ended after ``orch stop`` asked it to (not a finding kind: the
detectors call it ``finished``, severity info, so nobody is paged for an operator's stop)."""
STOP_SLACK_S = 1.0
"""An exit this much before the stop request still counts as the stop's (mtime granularity)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What died, when, the most likely cause with its evidence, and the remedy.

    ``kind`` is a finding kind (``crashed``, ``oom-killer``, ``log-signature``...),
    ``stopped`` or ``healthy``; ``reached`` is False only for ``healthy``. ``died_at``
    is Unix s.
    """

    kind: str
    summary: str
    playbook: str | None = None
    severity: Severity = Severity.INFO
    died_at: float | None = None
    cause: str = ""
    evidence: tuple[str, ...] = ()
    remedy: tuple[str, ...] = ()
    reached: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "playbook": self.playbook,
            "summary": self.summary,
            "severity": str(self.severity),
            "died_at": self.died_at,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "remedy": list(self.remedy),
            "reached": self.reached,
        }


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything collected about one run; texts already redacted. Times are Unix s.

    ``stop_requested_*`` come from the run's ``stop_requested`` file, written by the
    agent's ``stop`` before its first signal (``None``: nobody asked).
    """

    target: str
    collected_at: float
    run_id: str | None = None
    run_dir: str | None = None
    manifest: RunManifest | None = None
    container_status: str | None = None
    pct_status_text: str = ""
    exit_status: int | None = None
    exit_status_at: float | None = None
    run_state: str | None = None
    log_tail: tuple[str, ...] = ()
    log_exists: bool = False
    log_mtime: float | None = None
    log_size_bytes: int | None = None
    pane: tuple[str, ...] = ()
    gpu_history: tuple[dict[str, Any], ...] = ()
    metrics: tuple[dict[str, Any], ...] = ()
    kernel_log: tuple[str, ...] = ()
    kernel_log_source: str | None = None
    probe: HostProbe | None = None
    final: Snapshot | None = None
    run_pids: tuple[int, ...] = ()
    agent: dict[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    stop_requested_at: float | None = None
    stop_requested_by: str | None = None
    stop_signal: str | None = None
    tee_error: str | None = None
    """What tee said on its stderr (the run's ``tee.err``), e.g. "tee: .../train.log: No space
    left on device": the log stopped growing there (the pane kept the output)."""


@dataclass(frozen=True, slots=True)
class Postmortem:
    """The evidence, the reconstructed history, the findings, the log matches and the verdict."""

    evidence: Evidence
    history: tuple[Snapshot, ...]
    findings: tuple[Finding, ...]
    matches: tuple[Match, ...]
    verdict: Verdict
    bundle: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        ev = self.evidence
        return {
            "target": ev.target,
            "run_id": ev.run_id,
            "verdict": self.verdict.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "matches": [m.to_dict() for m in self.matches],
            "exit_status": ev.exit_status,
            "container_status": ev.container_status,
            "kernel_events": [e.to_dict() for e in (ev.probe.kernel_events if ev.probe else ())],
            "errors": list(ev.errors),
            "tee_error": ev.tee_error,
            "bundle": self.bundle,
        }


# --- reconstruct (pure) ----------------------------------------------------------------------


def _metric_at(records: Sequence[dict[str, Any]], at: float) -> Metrics | None:
    """The newest ``metrics.jsonl`` record at or before ``at`` as :class:`Metrics`.

    >>> _metric_at([{"time": 1.0, "step": 5, "tok_s": 100}, {"time": 3.0, "step": 6}], 2.0)
    Metrics(step=5, loss=None, tokens_per_s=100.0, acc_len=None, tau=None, seen_at=1.0)
    >>> _metric_at([{"time": 3.0, "step": 6}], 2.0) is None
    True
    """
    best = None
    for r in records:
        t = r.get("time")
        if isinstance(t, (int, float)) and t <= at and (best is None or t >= best["time"]):
            best = r

    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    if best is None:
        return None
    step = best.get("step")
    return Metrics(
        step=step if isinstance(step, int) else None,
        loss=num(best.get("loss")),
        tokens_per_s=num(best.get("tok_s")),
        acc_len=num(best.get("acc_len")),
        tau=num(best.get("tau")),
        seen_at=float(best["time"]),
    )


def _sample(
    ev: Evidence, record: dict[str, Any], session: str, manifest: RunManifest | None
) -> Snapshot | None:
    """One flight-recorder line as a snapshot (``None`` when unreadable)."""
    try:
        at = float(record["t"])
        gpus = tuple(GpuSample.from_dict(g) for g in record.get("gpus") or ())
        procs = tuple(ProcessInfo.from_dict(p) for p in record.get("procs") or ())
        nvml = NvmlStatus.from_dict(record["nvml"]) if record.get("nvml") else None
    except (KeyError, TypeError, ValueError, SchemaError):
        return None
    live = any(not p.zombie and p.state != "Z" for p in procs)
    exited = ev.exit_status_at is not None and at >= ev.exit_status_at
    run = RunState(
        run_id=ev.run_id or "?",
        run_dir=ev.run_dir or "",
        manifest=manifest,
        log_exists=ev.log_exists,
        exit_status=ev.exit_status if exited else None,
        exit_status_at=ev.exit_status_at if exited else None,
        stop_requested_at=ev.stop_requested_at if exited else None,
        stop_requested_by=ev.stop_requested_by if exited else None,
    )
    # A sample with a live process had its session; after the death the session is unknown.
    sess = SessionState(name=session, exists=True, pane_dead=False) if live else None
    return Snapshot(
        target=ev.target,
        taken_at=at,
        session=sess,
        run=run,
        processes=procs,
        gpus=gpus,
        nvml=nvml,
        metrics=_metric_at(ev.metrics, at),
        container_status="running",
    )


def final_snapshot(ev: Evidence) -> Snapshot:
    """The state now: the agent's snapshot when it saw this run, else one built from the evidence.

    The run's ``new_log_lines`` are the whole log tail and the pane is the captured
    screen, so the log detectors see what the postmortem shows; alone, it is a first
    snapshot (whose lines are never progress). :func:`reconstruct_history` moves the
    tail to the recorder sample of when it was written. The metrics are the agent's
    reading of that tail with ``seen_at`` no later than the log's mtime (a re-read tail
    is not a line seen now), else the newest ``metrics.jsonl`` record.
    """
    snap = ev.final
    state = ev.agent.get("state") or {}
    tmux = state.get("tmux") or {}
    session = str(ev.agent.get("session") or (ev.manifest.session if ev.manifest else "train"))
    same = snap is not None and snap.run is not None and snap.run.run_id == ev.run_id
    if ev.container_status not in (None, "running"):
        return Snapshot(
            target=ev.target,
            taken_at=ev.collected_at,
            container_status=ev.container_status,
            errors=ev.errors,
        )
    if ev.run_id is None:
        base = snap or Snapshot(target=ev.target, taken_at=ev.collected_at)
        return dataclasses.replace(base, container_status=ev.container_status)
    run = RunState(
        run_id=ev.run_id,
        run_dir=ev.run_dir or "",
        manifest=ev.manifest,
        log_path=(ev.run_dir or "") + "/train.log",
        log_exists=ev.log_exists,
        log_size_bytes=ev.log_size_bytes,
        log_mtime=ev.log_mtime,
        log_offset=ev.log_size_bytes or 0,  # the tail was read to the log's end
        new_log_lines=ev.log_tail,
        exit_status=ev.exit_status,
        exit_status_at=ev.exit_status_at,
        heartbeat_age_s=(ev.agent.get("heartbeat") or {}).get("age_s"),
        stop_requested_at=ev.stop_requested_at,
        stop_requested_by=ev.stop_requested_by,
    )
    sess = SessionState(
        name=session,
        exists=bool(tmux.get("exists")),
        server_running=bool(ev.agent.get("tmux_server_running", True)),
        pane_dead=tmux.get("pane_dead"),
        pane_dead_status=tmux.get("pane_dead_status"),
        pane_dead_signal=tmux.get("pane_dead_signal"),
        pane_pid=tmux.get("pane_pid"),
        pane_tail=ev.pane[-50:],
    )
    procs: tuple[ProcessInfo, ...] = snap.processes if same and snap is not None else ()
    known = {p.pid for p in procs}
    extra = [
        ProcessInfo(pid=int(p), ppid=0, name="?", state="R")
        for p in state.get("command_pids") or ()
        if isinstance(p, int) and p not in known
    ]
    return Snapshot(
        target=ev.target,
        taken_at=ev.collected_at,
        session=sess,
        run=run,
        processes=(*procs, *extra),
        gpus=snap.gpus if snap is not None else (),
        nvml=snap.nvml if snap is not None else None,
        metrics=_reread(snap.metrics if same and snap is not None else None, ev.log_mtime)
        or _metric_at(ev.metrics, ev.collected_at),
        container_status=ev.container_status,
        errors=snap.errors if snap is not None else (),
    )


def _reread(m: Metrics | None, log_mtime: float | None) -> Metrics | None:
    """Metrics parsed from a re-read tail: seen no later than the log was last written.

    >>> _reread(Metrics(step=7, seen_at=100.0), 40.0).seen_at
    40.0
    """
    if m is None or log_mtime is None or m.seen_at is None or m.seen_at <= log_mtime:
        return m
    return dataclasses.replace(m, seen_at=log_mtime)


def _place_tail(
    samples: list[Snapshot], final: Snapshot, log_mtime: float | None
) -> list[Snapshot]:
    """The history with the log tail on the first sample at or after ``log_mtime`` (when
    those lines were new), not on the final state: the postmortem's own read of the tail
    is no progress, or a hung live run would never show its stall. A log written after
    the last sample keeps its tail on the final state (it did grow since)."""
    lines = final.run.new_log_lines if final.run is not None else ()
    if not samples or not lines:
        return [*samples, final]
    at = next(
        (i for i, s in enumerate(samples) if log_mtime is None or s.taken_at >= log_mtime), None
    )
    run = samples[at].run if at is not None else None
    if at is None or run is None:
        return [*samples, final]
    assert final.run is not None
    out = list(samples)
    read = dataclasses.replace(  # the read reached the log's end, as the final state's did
        run,
        new_log_lines=lines,
        log_offset=final.run.log_offset,
        log_size_bytes=final.run.log_size_bytes,
    )
    out[at] = dataclasses.replace(samples[at], run=read)
    return [*out, dataclasses.replace(final, run=dataclasses.replace(final.run, new_log_lines=()))]


def reconstruct_history(ev: Evidence) -> list[Snapshot]:
    """Flight-recorder samples (oldest first) then the final state: the detectors' history.

    The log tail rides on the sample of when it was written (:func:`_place_tail`).
    """
    session = str(ev.agent.get("session") or (ev.manifest.session if ev.manifest else "train"))
    out = [
        s
        for r in ev.gpu_history
        if (s := _sample(ev, r, session, ev.manifest)) is not None and s.taken_at <= ev.collected_at
    ]
    out.sort(key=lambda s: s.taken_at)
    return _place_tail(out, final_snapshot(ev), ev.log_mtime)


# --- judge (pure) ----------------------------------------------------------------------------


def run_pids_and_names(ev: Evidence, history: Sequence[Snapshot]) -> tuple[set[int], set[str]]:
    """Every PID (and process name) the run was seen with: recorder, final state, pgid, wrapper."""
    pids, names = history_pids_and_names(history)
    return pids | set(ev.run_pids), names


def died_at(ev: Evidence, history: Sequence[Snapshot]) -> float | None:
    """When the run died: its exit status' mtime, else the first recorder sample without a live
    process after the last one with one (``None`` while alive or unknown)."""
    if ev.exit_status_at is not None:
        return ev.exit_status_at
    last_live = None
    for s in history:
        if any(not p.zombie and p.state != "Z" for p in s.processes):
            last_live = s.taken_at
    if last_live is None:
        return ev.log_mtime
    after = [s.taken_at for s in history if s.taken_at > last_live and s.run is not None]
    return after[0] if after else None


def our_oom_kills(ev: Evidence, history: Sequence[Snapshot]) -> list[KernelEvent]:
    """OOM-killer kernel events that killed this run: its PID, or its process name near the death.

    Inside LXC the container sees its own PIDs while the host kernel logs host PIDs,
    so a name within :data:`OOM_WINDOW_S` of the death counts as well
    (:func:`orchestrator.detect.host.oom_kills_of_run`, shared with the live detectors).
    """
    if ev.probe is None:
        return []
    pids, names = run_pids_and_names(ev, history)
    return oom_kills_of_run(
        ev.probe.kernel_events,
        pids=pids,
        names=names,
        started_at=ev.manifest.started_at if ev.manifest else None,
        died_at=died_at(ev, history),
    )


def judge(
    ev: Evidence,
    *,
    limits: Limits | None = None,
    roles: dict[int, str] | None = None,
    playbooks: Sequence[Playbook] | None = None,
) -> Postmortem:
    """Reconstruct the history, run the detectors and the log matcher, decide the verdict."""
    from orchestrator.detect.engine import default_playbooks, run_detectors

    pbs = tuple(default_playbooks() if playbooks is None else playbooks)
    history = reconstruct_history(ev)
    probes = [ev.probe] if ev.probe is not None else []
    findings = run_detectors(
        history, limits=limits or Limits(), roles=roles, probes=probes, playbooks=pbs
    )
    matches = match_log([*ev.log_tail, *ev.pane, *([ev.tee_error] if ev.tee_error else ())], pbs)
    verdict = decide(ev, history, findings, matches, pbs)
    return Postmortem(ev, tuple(history), tuple(findings), tuple(matches), verdict)


_GENERIC_IDS = frozenset({"oom-killer", "silent-death", "ghost-utilization", "tee-bypass"})
"""Playbooks that name an outcome, not a cause found in the log: never a log-signature verdict."""
_ALIVE_ORDER = ("oom-killer", "xid", "nvml-error", "stall", "log-signature", "ghost-utilization")
_KILL_REMEDY = (
    "No OOM-killer line in the host kernel log names this run: something sent SIGKILL "
    "(kill -9, orch stop past its grace, a scheduler, a watchdog).",
    "Check who: the host's auth/journal logs around the time of death, other operators' sessions.",
    "Relaunch when understood: orch launch TARGET.",
)


def _playbook(pbs: Sequence[Playbook], pid: str | None) -> Playbook | None:
    return next((p for p in pbs if p.id == pid), None) if pid else None


def _remedy(pbs: Sequence[Playbook], pid: str | None) -> tuple[str, ...]:
    pb = _playbook(pbs, pid)
    return pb.remedy if pb is not None else ()


def _what(ev: Evidence) -> str:
    """``run ID (command)``, the command without its leading ``env K=V`` words, cut at 80.

    >>> m = RunManifest("r1", "env PYTHONPATH=/x/.orch/trainer-1 python3 -m trainer", "/w", "t", 0.0)
    >>> _what(Evidence("ct200", 0.0, run_id="r1", manifest=m))
    'run r1 (python3 -m trainer)'
    """
    words = ev.manifest.command.split() if ev.manifest else []
    if words[:1] == ["env"]:
        words = words[1:]
        while words and "=" in words[0] and not words[0].startswith("-"):
            words = words[1:]
    cmd = " ".join(words)
    short = (cmd[:80] + "...") if len(cmd) > 80 else cmd
    return f"run {ev.run_id or '?'}" + (f" ({short})" if short else "")


def stop_was_requested(ev: Evidence) -> bool:
    """``orch stop`` asked this run to end and it ended after the request (not before it).

    >>> stop_was_requested(Evidence("ct200", 10.0))
    False
    >>> stop_was_requested(Evidence("ct200", 10.0, stop_requested_at=5.0, exit_status_at=6.0))
    True
    >>> stop_was_requested(Evidence("ct200", 10.0, stop_requested_at=5.0, exit_status_at=2.0))
    False
    """
    at = ev.stop_requested_at
    if at is None:
        return False
    return ev.exit_status_at is None or ev.exit_status_at >= at - STOP_SLACK_S


def _stopped_verdict(
    ev: Evidence, code: int | None, death: float | None, tail: tuple[str, ...]
) -> Verdict:
    at = ev.stop_requested_at
    by = ev.stop_requested_by or "orch stop"
    first = ev.stop_signal or "SIGINT"
    name = signal_name(code) if code else None
    status = "no exit status" if code is None else f"exit {code}" + (f" = {name}" if name else "")
    return Verdict(
        kind=STOPPED,
        severity=Severity.INFO,
        died_at=death,
        summary=(
            f"{_what(ev)} was stopped by {by} at {fmt_time(at)} ({first}), {status}; "
            f"a checkpoint was written if the trainer does so on {first}"
        ),
        cause=f"requested: {by} sent {first} at {fmt_time(at)}",
        evidence=(
            f"stop_requested: {fmt_time(at)} by {by}, first signal {first}",
            f"exit_status: {code if code is not None else 'missing'}"
            + (f" ({name})" if name else ""),
            *tail,
        ),
        remedy=(
            "Nothing to fix: an operator asked for this stop.",
            "Relaunch when ready: orch launch TARGET (the trainer resumes from its newest "
            "checkpoint if it writes them).",
        ),
    )


def decide(
    ev: Evidence,
    history: Sequence[Snapshot],
    findings: Sequence[Finding],
    matches: Sequence[Match],
    pbs: Sequence[Playbook],
) -> Verdict:
    """The verdict, with the precedence in this module's docstring."""
    first: dict[str, Finding] = {}
    for f in findings:
        first.setdefault(f.kind, f)
    death = died_at(ev, history)
    when = f" at {fmt_time(death)}" if death else ""
    what = _what(ev)
    final = history[-1] if history else None
    sess = final.session if final is not None else None
    code = ev.exit_status
    if code is None and sess is not None and sess.pane_dead and sess.pane_dead_signal:
        code = 128 + sess.pane_dead_signal
    tail = tuple(ev.log_tail[-5:]) or tuple(ev.pane[-5:])

    def from_finding(f: Finding, summary: str | None = None, **kw: Any) -> Verdict:
        pb = kw.pop("playbook", f.playbook)
        return Verdict(
            kind=f.kind,
            summary=summary or f.summary,
            playbook=pb,
            severity=f.severity,
            died_at=kw.pop("died", death),
            cause=kw.pop("cause", f.summary),
            evidence=kw.pop("evidence", f.evidence),
            remedy=kw.pop("remedy", _remedy(pbs, pb)),
        )

    if "container-stopped" in first:
        f = first["container-stopped"]
        vmid = ev.pct_status_text.strip() or "pct status: stopped"
        return from_finding(
            f,
            f"{what}: the container is stopped (pct status), and every process in it with it",
            evidence=(vmid, *f.evidence[1:], *ev.errors[:2]),
            remedy=(
                "Find out why it stopped: the host's journal (journalctl -u pve-container@VMID) "
                "and kernel log around the time.",
                "Start it (pct start VMID), then run orch postmortem TARGET again to read the "
                "run's own files (exit status, log, flight recorder).",
            ),
        )
    dead = code not in (None, 0) or ev.run_state == "vanished" or "silent-death" in first
    asked = stop_was_requested(ev)
    if dead:
        ooms = our_oom_kills(ev, history)
        if ooms and code in (None, 137):
            e = ooms[0]
            return Verdict(
                kind="oom-killer",
                playbook="oom-killer",
                severity=Severity.CRITICAL,
                died_at=e.at or death,
                summary=(
                    f"{what} was killed by the kernel OOM killer{when}: "
                    f"{e.process or 'process'} (pid {e.pid}), exit status {code or 'missing'}"
                ),
                cause="the host (or the container's memory cgroup) ran out of RAM",
                evidence=(
                    *(k.line for k in ooms[:3]),
                    f"exit_status: {code}" + (" (SIGKILL)" if code == 137 else ""),
                    *tail,
                ),
                remedy=_remedy(pbs, "oom-killer"),
            )
        if asked:
            return _stopped_verdict(ev, code, death, tail)
        sig = next(
            (m for m in matches if m.id not in _GENERIC_IDS and m.severity >= Severity.WARNING),
            None,
        )
        if sig is not None:
            how = f"exit status {code}" if code is not None else "no exit status"
            return Verdict(
                kind="log-signature",
                playbook=sig.id,
                severity=max(sig.severity, Severity.CRITICAL),
                died_at=death,
                summary=f"{what} died{when} ({how}): {sig.title}",
                cause=sig.title,
                evidence=(
                    f"log line {sig.lineno}: {sig.line.strip()[:300]}",
                    *([f"exit_status: {code}"] if code is not None else []),
                ),
                remedy=sig.remedy,
            )
        if "crashed" in first:
            f = first["crashed"]
            pb = f.playbook
            remedy = _remedy(pbs, pb)
            summary = f.summary
            if code == 137 and (pb == "oom-killer" or pb is None):
                pb, remedy = None, _KILL_REMEDY
                summary = (
                    f"{what} was killed by SIGKILL (exit status 137){when}; no OOM-killer line "
                    "in the host kernel log names it: killed from outside"
                )
            cause = (
                f"killed by {signal_name(code)}"
                if code and signal_name(code)
                else (f"the command exited with status {code}")
            )
            return from_finding(f, summary, playbook=pb, remedy=remedy, cause=cause)
        if "silent-death" in first:
            return from_finding(first["silent-death"])
    if asked and (code == 0 or "finished" in first):
        return _stopped_verdict(ev, code, death, tail)
    if code == 0 or "finished" in first:
        if "ghost-utilization" in first:
            return from_finding(first["ghost-utilization"], died=None)
        fin = first.get("finished")
        return Verdict(
            kind="finished",
            summary=fin.summary if fin else f"{what} finished (exit status 0){when}",
            severity=fin.severity if fin else Severity.INFO,  # WARNING: exit 0, no end line
            died_at=death,
            cause="the command exited with status 0",
            evidence=tuple(
                dict.fromkeys(("exit_status: 0", *(fin.evidence if fin else ()), *tail))
            ),
        )
    problems = [f for f in findings if f.severity >= Severity.WARNING and f.kind != "unreachable"]
    problems.sort(key=lambda f: _ALIVE_ORDER.index(f.kind) if f.kind in _ALIVE_ORDER else 99)
    if problems:
        return from_finding(problems[0], died=None)
    return Verdict(
        kind=HEALTHY,
        summary=f"{what} is alive with no problem found; nothing to explain"
        if ev.run_id
        else f"{ev.target}: no run to examine",
        reached=False,
    )
