"""Run every detector over a target's history and order the findings worst first.

The one entry point :func:`run_detectors` serves ``watch``, ``check``, launch
verification and ``postmortem``. The detectors are pure; the only I/O here is
loading the bundled playbooks once (cached) when the caller passes none.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.config.limits import Limits
from orchestrator.detect import data, disk, gpu, host, log, run, throughput
from orchestrator.detect.base import fmt_time, manifest_of
from orchestrator.playbooks.loader import Playbook, for_exit_code, load_playbooks
from orchestrator.wire.model import Finding, HostProbe, Snapshot

KIND_ORDER = (
    "container-stopped",
    "silent-death",
    "crashed",
    "oom-killer",
    "xid",
    "nvml-error",
    "disk-full",
    "log-signature",
    "stall",
    "ghost-utilization",
    "not-allocating",
    "gpu-imbalance",
    "throughput-drop",
    "log-missing",
    "agent-protocol-error",
    "bad-metrics",
    "unreachable",
    "finished",
)
"""Every finding kind, in the order used to break severity ties (most telling first)."""


@functools.lru_cache(maxsize=1)
def default_playbooks() -> tuple[Playbook, ...]:
    """The bundled playbooks, loaded once per process (ConfigError if one is malformed)."""
    return tuple(load_playbooks())


def run_detectors(
    history: Sequence[Snapshot],
    *,
    limits: Limits,
    roles: dict[int, str] | None = None,
    probes: Sequence[HostProbe] = (),
    now: float | None = None,
    playbooks: Sequence[Playbook] | None = None,
    all_xids: bool = False,
) -> list[Finding]:
    """Findings for one target, worst first.

    Args:
        history: the target's snapshots, oldest first (unreachable markers included).
        limits: thresholds (defaults or the container's ``thresholds:``).
        roles: GPU index -> role name (``target``, ``drafter``) for messages and run GPUs.
        probes: host probes (kernel log events, ``pct status``), oldest first.
        now: evaluate time-based detectors (stall) at this Unix time; default: newest snapshot.
        playbooks: signature playbooks for log matching; default: the bundled set.
        all_xids: also report the application-level Xids ``limits.ignored_xids``.
    """
    pbs = default_playbooks() if playbooks is None else tuple(playbooks)
    findings: list[Finding] = [
        *run.unreachable(history, limits),
        *run.agent_protocol_error(history, limits),
        *data.bad_metrics(history, limits),
        *run.container_stopped(history, limits),
        *run.silent_death(history, limits),
        *run.exit_status(history, limits),
        *run.stall(history, limits, roles, now),
        *throughput.throughput_drop(history, limits),
        *run.log_missing(history, limits),
        *gpu.ghost_utilization(history, limits, probes),
        *gpu.not_allocating(history, limits, roles),
        *gpu.gpu_imbalance(history, limits, roles),
        *gpu.nvml_errors(history, limits),
        *host.xid(history, limits, probes, all_xids=all_xids),
        *host.oom_killer(history, limits, probes),
        *disk.disk_full(history, limits),
        *log.log_signatures(history, limits, pbs),
    ]
    findings = [_explain_crash(f, findings, pbs, history, probes) for f in findings]
    return order(findings)


NO_OOM_LINE = "killed by SIGKILL (no OOM-killer line names it: killed from outside?)"
"""Said of an exit 137 that no host OOM-killer line matches (as the postmortem's verdict)."""


def _with_hint(summary: str, hint: str) -> str:
    """``summary; hint``: what the host kernel log says of a SIGKILL."""
    return f"{summary}; {hint}"


def _explain_crash(
    f: Finding,
    all_: list[Finding],
    pbs: Sequence[Playbook],
    history: Sequence[Snapshot],
    probes: Sequence[HostProbe],
) -> Finding:
    """Give ``crashed`` the most likely playbook: OOM kill, then the best log signature, then the exit code.

    Exit 137 (SIGKILL) gets ``oom-killer`` only when a host OOM-killer line plausibly names
    the run (:func:`host.oom_kills_of_run`: its PID, or its process name near the death);
    otherwise no playbook, and the summary says so, as ``orch postmortem`` does.
    """
    if f.kind != "crashed" or f.playbook is not None:
        return f
    code = f.exit_status
    sigkill = code == 137
    if sigkill:
        pids, names = host.run_pids_and_names(history)
        manifest = manifest_of(history)
        ooms = host.oom_kills_of_run(
            host.kernel_events(probes, history),
            pids=pids,
            names=names,
            started_at=manifest.started_at if manifest is not None else None,
            died_at=f.since,
            vmid=next((s.vmid for s in reversed(history) if s.vmid is not None), None),
        )
        if ooms:
            e = ooms[0]
            who = f"{e.process or 'process'} pid {e.pid}" if e.pid else e.process or "a process"
            at = f" at {fmt_time(e.at)}" if e.at is not None else ""
            return replace(
                f,
                playbook="oom-killer",
                summary=_with_hint(f.summary, f"the kernel OOM killer killed {who}{at}"),
                evidence=(*f.evidence, *(k.line for k in ooms[:3])),
            )
        f = replace(f, summary=_with_hint(f.summary, NO_OOM_LINE))
    sigs = [x.playbook for x in all_ if x.kind == "log-signature" and x.playbook]
    if sigkill:  # a log line is no kernel OOM line: only the host's kernel log says OOM
        sigs = [pb for pb in sigs if pb != "oom-killer"]
    if sigs:
        return replace(f, playbook=sigs[0])
    if code is not None and not sigkill:
        pb = for_exit_code(code, pbs)
        if pb is not None:
            return replace(f, playbook=pb.id)
    return f


def order(findings: Sequence[Finding]) -> list[Finding]:
    """Worst first: severity, then :data:`KIND_ORDER`; stable, so ranked log signatures keep their order."""
    rank = {k: i for i, k in enumerate(KIND_ORDER)}
    return sorted(findings, key=lambda f: (-int(f.severity), rank.get(f.kind, len(rank))))
