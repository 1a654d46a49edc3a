"""GPU detectors: ghost utilization, not allocating, imbalance, NVML errors.

Each is a pure function of a snapshot history (oldest first) and :class:`Limits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.config.limits import Limits
from orchestrator.detect.base import (
    History,
    alive,
    fmt_gpus,
    fmt_num,
    fmt_time,
    gpu,
    manifest_of,
    reachable,
    role_label,
    run_gpus,
    trailing,
)
from orchestrator.wire.model import (
    CPU_RUN_ENV,
    Finding,
    GpuProcess,
    GpuSample,
    HostProbe,
    Severity,
    Snapshot,
)

_NVML_PLAYBOOK = {"driver-mismatch": "nvml-driver-mismatch", "gpu-lost": "gpu-fallen-off-bus"}
_NVML_CRITICAL = {"driver-mismatch", "gpu-lost", "driver-not-loaded"}


def _is_ghost(g: GpuSample | None, limits: Limits) -> bool:
    return (
        g is not None
        and g.error is None
        and g.utilization_pct is not None
        and g.memory_used_mib is not None
        and g.utilization_pct >= limits.ghost_util_pct
        and g.memory_used_mib <= limits.ghost_mem_mib
    )


def _holder(p: GpuProcess) -> str:
    """``python3 (pid 17 in ct201)``, ``pid 4242 on the host``...

    >>> _holder(GpuProcess(pid=4242, name="python3", vmid=201, container_pid=17, container="ct201"))
    'python3 (pid 17 in ct201)'
    >>> _holder(GpuProcess(pid=9, vmid=203))
    'pid ? in CT 203'
    """
    who = p.name or "a process"
    if p.vmid is None:
        return f"{who} (pid {p.pid})" if p.name else f"pid {p.pid}"
    where = p.container or f"CT {p.vmid}"
    inner = p.container_pid if p.container_pid is not None else "?"
    return f"{who} (pid {inner} in {where})" if p.name else f"pid {inner} in {where}"


def probe_numbering(pids: set[int], vmid: int | None, probe: HostProbe | None) -> str | None:
    """What the host probe says of a container's NVML PIDs: ``"namespace"`` when each is the
    PID inside (``NSpid``) of a GPU process in ``vmid``'s cgroup and not all are host PIDs of
    GPU processes, ``"host"`` the other way round; ``None`` when it cannot tell.

    >>> probe = HostProbe("pve1", 0.0, gpu_processes=(GpuProcess(pid=4242, vmid=200, container_pid=17),))
    >>> probe_numbering({17}, 200, probe), probe_numbering({4242}, 200, probe), probe_numbering({17}, 201, probe)
    ('namespace', 'host', None)
    """
    if not pids or probe is None:
        return None
    host = {p.pid for p in probe.gpu_processes}
    inside = {
        p.container_pid
        for p in probe.gpu_processes
        if vmid is not None and p.vmid == vmid and p.container_pid is not None
    }
    ns, hosts = pids <= inside, pids <= host
    return "namespace" if ns and not hosts else "host" if hosts and not ns else None


def attributed(
    sample: GpuSample,
    vmid: int | None,
    probes: Sequence[HostProbe] = (),
    numbering: str | None = None,
    container: str | None = None,
) -> tuple[GpuProcess, ...] | None:
    """``sample``'s processes as the host knows them: NVML's PIDs read in the numbering the
    host probe's evidence gives, else ``numbering`` (the agent's, ``NvmlStatus.pid_numbering``).
    Host PIDs are looked up by host PID; a container's own PIDs by its PID inside, and without a
    probe entry they are still this container's (``container`` names it).

    >>> ns = GpuSample(index=0, processes=(GpuProcess(pid=17, container_pid=17, name="python3"),))
    >>> [(p.pid, p.vmid, p.container_pid) for p in attributed(ns, 200, (), "namespace")]
    [(17, 200, 17)]
    """
    if sample.processes is None:
        return None
    probe = probes[-1] if probes else None
    pids = {p.pid for p in sample.processes}
    numbering = probe_numbering(pids, vmid, probe) or numbering
    known = {p.pid: p for p in probe.gpu_processes} if probe else {}
    if numbering != "namespace":
        return tuple(known.get(p.pid, p) if p.vmid is None else p for p in sample.processes)
    inside = {
        p.container_pid: p
        for p in (probe.gpu_processes if probe else ())
        if p.vmid == vmid and vmid is not None
    }
    return tuple(
        inside.get(p.pid)
        or replace(p, vmid=vmid, container_pid=p.pid, container=p.container or container)
        for p in sample.processes
    )


def gpu_holders(
    sample: GpuSample,
    vmid: int | None,
    probes: Sequence[HostProbe] = (),
    numbering: str | None = None,
) -> tuple[list[GpuProcess], list[GpuProcess]] | None:
    """(this container's or the host's processes, other containers') holding ``sample``; the
    host probe's mapping (``gpu_processes``) fills in what the container could not tell
    (:func:`attributed`). ``None`` when the process list is unknown.

    >>> g = GpuSample(index=3, processes=(GpuProcess(pid=7, vmid=201), GpuProcess(pid=8)))
    >>> [[p.pid for p in side] for side in gpu_holders(g, 200)]
    [[8], [7]]
    """
    procs = attributed(sample, vmid, probes, numbering)
    if procs is None:
        return None
    own = [p for p in procs if vmid is None or p.vmid is None or p.vmid == vmid]
    return own, [p for p in procs if p not in own]


def ghost_utilization(
    history: History, limits: Limits, probes: Sequence[HostProbe] = ()
) -> list[Finding]:
    """GPUs busy (>= ``ghost_util_pct``) yet nearly empty (<= ``ghost_mem_mib``) for N samples.

    Cross-checked with power (a latched counter often still draws ~100 W) and with
    whether a process holds the GPU: only this container's processes (or the host's) count,
    as the host maps them (NVML's PIDs in the driver's numbering, each process's cgroup: see
    :func:`attributed`); another container's
    process on it is named, and the GPU still counts as held by none of this run.
    Seed 000: GPU 3 at ``0 MiB, 100 %`` with no run left.
    """
    snaps = reachable(history)
    if not snaps:
        return []
    target = snaps[-1].target
    vmid = snaps[-1].vmid
    listed = sum(len(p.gpu_pids) for p in probes[-1:])
    out: list[Finding] = []
    for g in snaps[-1].gpus:
        run = trailing(snaps, lambda s, i=g.index: _is_ghost(gpu(s, i), limits))  # type: ignore[misc]
        if len(run) < limits.ghost_samples:
            continue
        last = gpu(run[-1], g.index)
        assert last is not None
        numbering = snaps[-1].nvml.pid_numbering if snaps[-1].nvml else None
        holders = gpu_holders(last, vmid, probes, numbering)
        own, others = holders if holders is not None else ([], [])
        if own:
            held = f"held by {len(own)} process(es): {', '.join(_holder(p) for p in own[:3])}"
        elif holders is None and not probes:
            held = "process list unknown"
        elif others:
            names = ", ".join(_holder(p) for p in others[:3])
            held = f"held by no process of this container (another container's: {names})"
        elif last.host_index is not None or snaps[-1].source == "host":
            held = "held by no process (the host lists none)"
        else:
            held = "held by no process" if not listed else "host lists GPU processes"
        power = f", drawing {fmt_num(last.power_w, 'W')}" if last.power_w is not None else ""
        evidence = tuple(
            f"{fmt_time(s.taken_at)} GPU {g.index}: {fmt_num(x.memory_used_mib, 'MiB')}, "
            f"{fmt_num(x.utilization_pct, '%')}, power {fmt_num(x.power_w, 'W')}"
            for s in run[-5:]
            if (x := gpu(s, g.index)) is not None
        )
        # Held by nothing of ours, the GPU is wedged for the next run too (seed 000): page someone.
        severity = Severity.WARNING if own else Severity.CRITICAL
        out.append(
            Finding(
                kind="ghost-utilization",
                severity=severity,
                target=target,
                summary=(
                    f"GPU {g.index} reads {fmt_num(last.utilization_pct, '%')} busy with "
                    f"{fmt_num(last.memory_used_mib, 'MiB')} used for {len(run)} samples, "
                    f"{held}{power}: a latched utilization counter (process died mid-kernel), "
                    f"a hung kernel or stale driver state"
                ),
                gpus=(g.index,),
                since=run[0].taken_at,
                evidence=evidence + tuple(f"GPU {g.index}: {_holder(p)}" for p in others[:3]),
                playbook="ghost-utilization",
            )
        )
    return out


def not_allocating(
    history: History, limits: Limits, roles: dict[int, str] | None = None
) -> list[Finding]:
    """Past ``startup_grace_s`` since launch, the run's GPUs still ~0 MiB while its process lives.

    Seed 002: every GPU at ``0 MiB`` 8 s after launch is normal (still importing);
    the same reading after the grace is not.
    """
    snaps = reachable(history)
    manifest = manifest_of(snaps)
    if not snaps or manifest is None or manifest.env.get(CPU_RUN_ENV) == "cpu":
        return []  # a run that says it trains on the CPU allocates nothing, by design
    last = snaps[-1]
    gpus = run_gpus(last, roles)
    if not gpus or last.run is None or last.run.exit_status is not None or not alive(last):
        return []

    def idle(s: Snapshot) -> bool:
        samples = [gpu(s, i) for i in gpus]
        return all(
            x is not None
            and x.memory_used_mib is not None
            and x.memory_used_mib <= limits.idle_mem_mib
            for x in samples
        )

    age_s = last.taken_at - manifest.started_at
    if age_s < limits.startup_grace_s or not idle(last):
        return []
    run = trailing(snaps, lambda s: idle(s) and alive(s))
    since = max(run[0].taken_at, manifest.started_at + limits.startup_grace_s)
    evidence = tuple(
        f"{fmt_time(last.taken_at)} GPU {i}: {fmt_num(x.memory_used_mib, 'MiB')}, "
        f"{fmt_num(x.utilization_pct, '%')}"
        for i in gpus
        if (x := gpu(last, i)) is not None
    )
    return [
        Finding(
            kind="not-allocating",
            severity=Severity.WARNING,
            target=last.target,
            summary=(
                f"{role_label(gpus, roles)} still at <= {fmt_num(limits.idle_mem_mib, 'MiB')} "
                f"{age_s:.0f} s after launch (grace {limits.startup_grace_s:.0f} s) while the "
                f"process lives: stuck before touching CUDA (import, data loading, a lock)"
            ),
            gpus=tuple(gpus),
            since=since,
            evidence=(f"launched {fmt_time(manifest.started_at)}", *evidence),
        )
    ]


def gpu_imbalance(
    history: History, limits: Limits, roles: dict[int, str] | None = None
) -> list[Finding]:
    """Some of the run's GPUs idle while others work, for ``imbalance_samples`` samples.

    Working means above ``imbalance_util_pct`` *and* holding memory, so a ghost GPU
    (100 %, 0 MiB) does not count as work. Example: drafter GPUs 5-7 idle because
    their threads died while the target GPUs 0-4 carry on.
    """
    snaps = reachable(history)
    if len(snaps) < limits.imbalance_samples or not alive(snaps[-1]):
        return []
    gpus = run_gpus(snaps[-1], roles)
    if len(gpus) < 2:
        return []

    def split(s: Snapshot) -> tuple[set[int], set[int]]:
        idle: set[int] = set()
        busy: set[int] = set()
        for i in gpus:
            x = gpu(s, i)
            if x is None or x.utilization_pct is None:
                continue
            if x.utilization_pct <= limits.imbalance_util_pct:
                idle.add(i)
            elif x.memory_used_mib is not None and x.memory_used_mib > limits.idle_mem_mib:
                busy.add(i)
        return idle, busy

    window = snaps[-limits.imbalance_samples :]
    idle_all = set(gpus)
    for s in window:
        idle, busy = split(s)
        if not busy:
            return []
        idle_all &= idle
    if not idle_all:
        return []
    run = trailing(snaps, lambda s: bool(split(s)[1]) and idle_all <= split(s)[0])
    busy_last = sorted(split(window[-1])[1])
    idle_ids = sorted(idle_all)
    evidence = tuple(
        f"{fmt_time(s.taken_at)} "
        + ", ".join(
            f"GPU {i}: {fmt_num(x.utilization_pct, '%')}"
            for i in gpus
            if (x := gpu(s, i)) is not None
        )
        for s in window
    )
    return [
        Finding(
            kind="gpu-imbalance",
            severity=Severity.WARNING,
            target=snaps[-1].target,
            summary=(
                f"{role_label(idle_ids, roles)} idle while {role_label(busy_last, roles)} work, "
                f"for {len(run)} samples: their workers may have died or be waiting"
            ),
            gpus=tuple(idle_ids),
            since=run[0].taken_at,
            evidence=evidence,
        )
    ]


def nvml_errors(history: History, limits: Limits) -> list[Finding]:
    """NVML could not be read (driver/library mismatch, timeout, ...) or a device failed (GPU lost)."""
    del limits
    snaps = reachable(history)
    if not snaps:
        return []
    last = snaps[-1]
    out: list[Finding] = []
    status = last.nvml
    if status is not None and not status.ok:
        kind = status.error_kind or "other"
        run = trailing(
            snaps,
            lambda s: (
                s.nvml is not None and not s.nvml.ok and (s.nvml.error_kind or "other") == kind
            ),
        )
        out.append(
            Finding(
                kind="nvml-error",
                severity=Severity.CRITICAL if kind in _NVML_CRITICAL else Severity.WARNING,
                target=last.target,
                summary=f"NVML failed ({kind}): {status.message or 'no message'}",
                since=run[0].taken_at if run else last.taken_at,
                evidence=tuple(
                    x
                    for x in (
                        status.message,
                        f"source: {status.source}" if status.source else None,
                        f"driver: {status.driver_version}" if status.driver_version else None,
                    )
                    if x
                ),
                playbook=_NVML_PLAYBOOK.get(kind),
            )
        )
    by_error: dict[str, list[int]] = {}
    for g in last.gpus:
        if g.error:
            by_error.setdefault(g.error, []).append(g.index)
    for error, ids in sorted(by_error.items()):

        def failing(s: Snapshot, e: str = error, i: int = ids[0]) -> bool:
            x = gpu(s, i)
            return x is not None and x.error == e

        first = trailing(snaps, failing)
        out.append(
            Finding(
                kind="nvml-error",
                severity=Severity.CRITICAL,
                target=last.target,
                summary=f"GPU {fmt_gpus(ids)}: {error} while the other GPUs answered",
                gpus=tuple(ids),
                since=first[0].taken_at if first else last.taken_at,
                evidence=tuple(f"GPU {i}: error {error}" for i in ids),
                playbook=_NVML_PLAYBOOK.get(error),
            )
        )
    return out
