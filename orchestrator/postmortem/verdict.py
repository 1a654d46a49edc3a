"""The pure half of ``orch postmortem``: evidence in, history, findings and a verdict out.

No I/O: :mod:`orchestrator.postmortem.collect` collects the :class:`Evidence` (agent, host,
kernel log) and writes the bundle; everything here is a function of that evidence.

The flight recorder is turned back into a snapshot history
(:func:`reconstruct_history`) and fed with the final state to
:func:`orchestrator.detect.engine.run_detectors`; the log tail and the pane go
through :func:`orchestrator.playbooks.loader.match_log`; :func:`decide` picks the
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
from dataclasses import dataclass
from typing import Any

from orchestrator.config.limits import Limits
from orchestrator.detect.base import ended_on_request, fmt_time, signal_name
from orchestrator.detect.host import OOM_WINDOW_S as OOM_WINDOW_S  # re-exported
from orchestrator.detect.host import oom_kills_of_run
from orchestrator.detect.host import run_pids_and_names as history_pids_and_names
from orchestrator.monitor.journal import JournalEntry
from orchestrator.playbooks.loader import Match, Playbook, match_log
from orchestrator.playbooks.matching import CERTAIN, PROBABLE
from orchestrator.postmortem.episodes import Episode, gpu_episodes
from orchestrator.postmortem.evidence import Evidence, reconstruct_history
from orchestrator.wire.model import (
    Finding,
    HostProbe,
    KernelEvent,
    Severity,
    Snapshot,
)

HEALTHY = "healthy"
"""Verdict kind of a run that is alive with no problem (not a finding kind: nothing died)."""
STOPPED = "stopped"
"""Verdict kind of a run that ended after ``orch stop`` asked it to (not a finding kind: the
detectors call it ``finished``, severity info, so nobody is paged for an operator's stop)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What died, when, the most likely cause with its evidence, and the remedy.

    ``kind`` is a finding kind (``crashed``, ``oom-killer``, ``log-signature``...),
    ``stopped`` or ``healthy``; ``reached`` is False only for ``healthy``. ``died_at``
    is Unix s. ``confidence`` is ``certain`` or ``probable`` (the usual cause of what the
    evidence shows, as for a SIGKILL no kernel log explains); ``confirm`` is the next
    check that would confirm the cause ("" when the evidence already does).
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
    confidence: str = CERTAIN
    confirm: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "playbook": self.playbook,
            "summary": self.summary,
            "severity": str(self.severity),
            "confidence": self.confidence,
            "confirm": self.confirm,
            "died_at": self.died_at,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "remedy": list(self.remedy),
            "reached": self.reached,
        }


@dataclass(frozen=True, slots=True)
class Postmortem:
    """The evidence, the reconstructed history, the findings, the log matches and the verdict."""

    evidence: Evidence
    history: tuple[Snapshot, ...]
    findings: tuple[Finding, ...]
    matches: tuple[Match, ...]
    verdict: Verdict
    bundle: str | None = None
    restarts: tuple[JournalEntry, ...] = ()
    """What ``orch supervise`` / ``check --heal`` decided about this run (the restart journal:
    the decisions about its death, and the restart that started it)."""
    episodes: tuple[Episode, ...] = ()
    """Every stretch of the GPU history a GPU detector's condition held, cleared ones too
    (:func:`orchestrator.postmortem.episodes.gpu_episodes`)."""

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        ev = self.evidence
        return {
            "restarts": [e.to_dict() for e in self.restarts],
            "target": ev.target,
            "run_id": ev.run_id,
            "verdict": self.verdict.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "episodes": [e.to_dict() for e in self.episodes],
            "matches": [m.to_dict() for m in self.matches],
            "exit_status": ev.exit_status,
            "container_status": ev.container_status,
            "kernel_events": [e.to_dict() for e in (ev.probe.kernel_events if ev.probe else ())],
            "kernel_log_boots": ["previous", "current"] if ev.previous_boot else ["current"],
            "kernel_log_note": ev.kernel_log_note,
            "errors": list(ev.errors),
            "tee_error": ev.tee_error,
            "bundle": self.bundle,
        }


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
    from orchestrator.detect.host import kernel_events

    pids, names = run_pids_and_names(ev, history)
    return oom_kills_of_run(
        kernel_events([ev.probe], history),
        pids=pids,
        names=names,
        started_at=ev.manifest.started_at if ev.manifest else None,
        died_at=died_at(ev, history),
        vmid=ev.vmid,
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
    if ev.vmid is not None:  # the container's own: host events of others are not this run's
        history = [dataclasses.replace(s, vmid=ev.vmid) for s in history]
    probes = [claim_gpu_events(ev, roles)] if ev.probe is not None else []
    findings = run_detectors(
        history, limits=limits or Limits(), roles=roles, probes=probes, playbooks=pbs
    )
    matches = match_log([*ev.log_tail, *ev.pane, *([ev.tee_error] if ev.tee_error else ())], pbs)
    verdict = decide(ev, history, findings, matches, pbs)
    episodes = gpu_episodes(history, limits or Limits())
    return Postmortem(
        ev, tuple(history), tuple(findings), tuple(matches), verdict, episodes=episodes
    )


def claim_gpu_events(ev: Evidence, roles: dict[int, str] | None = None) -> HostProbe:
    """The probe with the host-wide GPU events of the run's lifetime given to this run, when
    they name a GPU it may use (its manifest's, else the container's roles, else any): the
    postmortem asks what ended THIS run, and a GPU that fell off the bus under it is the
    likeliest answer even when no process of it was left holding the GPU to tell the host."""
    assert ev.probe is not None
    if ev.vmid is None:
        return ev.probe
    manifest = ev.manifest
    gpus = set(manifest.gpus if manifest and manifest.gpus else ()) or set(roles or {})
    started = manifest.started_at if manifest else None

    def claim(e: KernelEvent) -> KernelEvent:
        if e.vmid is not None or e.kind not in ("xid", "fallen-off-bus"):
            return e
        if (gpus and e.gpu not in gpus) or (started and e.at is not None and e.at < started - 1):
            return e
        return dataclasses.replace(e, vmid=ev.vmid)

    return dataclasses.replace(
        ev.probe, kernel_events=tuple(claim(e) for e in ev.probe.kernel_events)
    )


_GENERIC_IDS = frozenset(
    {"oom-killer", "sigkill", "silent-death", "ghost-utilization", "tee-bypass"}
)
"""Playbooks that name an outcome, not a cause found in the log: never a log-signature verdict."""
_ALIVE_ORDER = ("oom-killer", "xid", "nvml-error", "stall", "log-signature", "ghost-utilization")
_KILL_REMEDY = (
    "No OOM-killer line in the host kernel log names this run: something sent SIGKILL "
    "(kill -9, orch stop past its grace, a scheduler, a watchdog).",
    "Check who: the host's auth/journal logs around the time of death, other operators' sessions.",
    "Relaunch when understood: orch launch TARGET.",
)


def _sigkill_unexplained(ev: Evidence, what: str, when: str) -> tuple[str, str]:
    """Summary and next check of a SIGKILL no OOM-killer line explains (its cause is probable).

    Read, the host kernel log makes "killed from outside" probable (a rotated log or a
    cgroup kill that names no PID can still hide an OOM kill); unread, the OOM killer stays
    the usual cause and the kernel log is what would tell.
    """
    probe = ev.probe
    if (
        ev.kernel_log_source
        or ev.kernel_log
        or (probe and (probe.kernel_log_source or probe.kernel_events))
    ):
        return (
            f"{what} was killed by SIGKILL (exit status 137){when}; no OOM-killer line "
            "in the host kernel log names it: killed from outside"
        ), (
            f"who sent SIGKILL{when}: the host's journal and auth log (journalctl "
            "--since/--until around it), a scheduler's accounting, other operators' sessions"
        )
    return (
        f"{what} was killed by SIGKILL (exit status 137){when}; the host kernel log could "
        "not be read, so the usual cause, the kernel OOM killer, is not confirmed"
    ), (
        "the host kernel log around the time of death (journalctl -k or dmesg -T "
        "on the Proxmox host): an 'Out of memory: Killed process' line naming the run"
    )


def _playbook(pbs: Sequence[Playbook], pid: str | None) -> Playbook | None:
    return next((p for p in pbs if p.id == pid), None) if pid else None


def _remedy(pbs: Sequence[Playbook], pid: str | None) -> tuple[str, ...]:
    pb = _playbook(pbs, pid)
    return pb.remedy if pb is not None else ()


def _what(ev: Evidence) -> str:
    """``run ID (command)``, the command without its leading ``env K=V`` words, cut at 80.

    >>> from orchestrator.wire.model import RunManifest
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
    return ended_on_request(ev.stop_requested_at, ev.exit_status_at)


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
                confidence=sig.confidence,
                confirm=sig.confirm,
            )
        if "crashed" in first:
            f = first["crashed"]
            pb = f.playbook
            remedy = _remedy(pbs, pb)
            summary = f.summary
            confirm = ""
            if code == 137 and pb in (None, "oom-killer", "sigkill"):
                pb, remedy = None, _KILL_REMEDY
                summary, confirm = _sigkill_unexplained(ev, what, when)
            cause = (
                f"killed by {signal_name(code)}"
                if code and signal_name(code)
                else (f"the command exited with status {code}")
            )
            v = from_finding(f, summary, playbook=pb, remedy=remedy, cause=cause)
            return dataclasses.replace(v, confidence=PROBABLE, confirm=confirm) if confirm else v
        lost = first.get("xid")
        if lost is not None and lost.playbook == "gpu-fallen-off-bus" and code is None:
            # its GPU fell off the bus: the usual end of a run, and of the host's boot
            boot = (
                " (kernel log of the previous boot: the host rebooted since)"
                if (ev.previous_boot and "previous boot" in lost.summary)
                else ""
            )
            return from_finding(
                lost,
                f"{what} vanished{when}: its GPU fell off the bus "
                f"({lost.summary.split(' (')[0]}){boot}",
            )
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
