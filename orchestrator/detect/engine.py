"""Run every detector over a target's history and order the findings worst first.

The one entry point :func:`run_detectors` serves ``watch``, ``check``, launch
verification and ``postmortem``. The detectors are pure; the only I/O here is
loading the bundled playbooks once (cached) when the caller passes none.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from orchestrator.detect import disk, gpu, host, log, run
from orchestrator.detect.limits import Limits
from orchestrator.model import Finding, HostProbe, Snapshot
from orchestrator.playbooks import Playbook, for_exit_code, load_playbooks

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
        *run.container_stopped(history, limits),
        *run.silent_death(history, limits),
        *run.exit_status(history, limits),
        *run.stall(history, limits, roles, now),
        *run.throughput_drop(history, limits),
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
    findings = [_explain_crash(f, findings, pbs) for f in findings]
    return order(findings)


def _explain_crash(f: Finding, all_: list[Finding], pbs: Sequence[Playbook]) -> Finding:
    """Give ``crashed`` the most likely playbook: OOM kill, then the best log signature, then the exit code."""
    from dataclasses import replace

    if f.kind != "crashed" or f.playbook is not None:
        return f
    if any(x.kind == "oom-killer" for x in all_) and "SIGKILL" in f.summary:
        return replace(f, playbook="oom-killer")
    sigs = [x for x in all_ if x.kind == "log-signature" and x.playbook]
    if sigs:
        return replace(f, playbook=sigs[0].playbook)
    code = next((e.split()[1] for e in f.evidence if e.startswith("exit_status: ")), None)
    if code is not None and code.lstrip("-").isdigit():
        pb = for_exit_code(int(code), pbs)
        if pb is not None:
            return replace(f, playbook=pb.id)
    return f


def order(findings: Sequence[Finding]) -> list[Finding]:
    """Worst first: severity, then :data:`KIND_ORDER`; stable, so ranked log signatures keep their order."""
    rank = {k: i for i, k in enumerate(KIND_ORDER)}
    return sorted(findings, key=lambda f: (-int(f.severity), rank.get(f.kind, len(rank))))
