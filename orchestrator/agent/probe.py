"""The host probe: runs on the Proxmox HOST (not in a container), for containers observed
from inside (``observe: container``) and for the postmortem.

It gathers what only the host knows:

- the status of each container asked about: one ``pct list`` (``pct status VMID`` for any
  it does not show, or when only one is asked about);
- kernel-log events since a given time (:mod:`orchestrator.agent.kernel`: Xid, SXid, fallen
  off the bus, the OOM killer with its ``task_memcg``), of this boot and, with
  ``previous_boot``, of the one before (after a host reboot, where an Xid 79 usually ends);
- the host-side GPU compute processes mapped to their container through
  ``/proc/<pid>/cgroup`` (``lxc/<vmid>``) and their PID inside (``NSpid``): inside LXC,
  NVML reports host PIDs (drivers up to 535.104.05) or the container's own
  (``detect.gpu.attributed`` joins either; :func:`~orchestrator.agent.host.attribute_processes`).

Every command runs under a timeout; a failure is an entry in ``errors``.
``ORCH_PROC_ROOT`` (or ``proc_root``) points the cgroup lookup at another /proc.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from orchestrator.agent.gpu import GpuCollector
from orchestrator.agent.host import (
    attribute_processes,
    owner_of_event,
    parse_pct_list,
    pct_failure,
    run_tool,
)
from orchestrator.agent.hostprocs import ProcessReader
from orchestrator.agent.kernel import KernelRead, parse_kernel_log, read_kernel
from orchestrator.wire.formats import parse_pct_status as parse_pct_status
from orchestrator.wire.model import HostProbe, KernelEvent

__all__ = ["parse_pct_list", "parse_pct_status", "probe"]


def kernel_events(
    since: float | None, timeout_s: float, *, previous_boot: bool = False
) -> tuple[list[KernelEvent], str | None, list[str]]:
    """(events, source, errors) of this boot since ``since`` (and of the one before, first,
    with ``previous_boot``): journalctl if present, else dmesg (this boot only)."""
    errors: list[str] = []
    events: list[KernelEvent] = []
    source = None
    reads: list[tuple[int, KernelRead]] = []
    if previous_boot:
        reads.append((-1, read_kernel(since, boot=-1, timeout_s=timeout_s)))
    reads.append((0, read_kernel(since, timeout_s=timeout_s)))
    for boot, read in reads:
        errors.extend(read.errors)
        source = source or read.source
        events.extend(parse_kernel_log(read.lines, since, boot=boot))
    return events, source, errors


def probe(
    vmids: Sequence[int],
    since: float | None,
    *,
    host: str = "",
    timeout_s: float = 10.0,
    gpu_deadline_s: float = 2.0,
    gpu_source: str | None = None,
    proc_root: str | None = None,
    previous_boot: bool = False,
) -> HostProbe:
    """Everything above as one :class:`HostProbe`. Never raises; failures go to ``errors``."""
    proc_root = proc_root or os.environ.get("ORCH_PROC_ROOT") or "/proc"
    errors: list[str] = []
    status: dict[int, str] = {}
    listed: dict[int, str] = {}
    if len(vmids) > 1:  # one `pct list` for all (pct is ~0.3 s of CPU a call on a real host)
        rc, out = run_tool(["pct", "list"], timeout_s)
        listed = parse_pct_list(out) if rc == 0 else {}
    for vmid in vmids:
        if vmid in listed:
            status[vmid] = listed[vmid]
            continue
        rc, out = run_tool(["pct", "status", str(vmid)], timeout_s)
        if rc == 0:
            status[vmid] = parse_pct_status(out)
        else:
            status[vmid] = pct_failure(out)
            errors.append(f"pct status {vmid}: {out.strip()[:200] or f'exit {rc}'}")
    events, source, kerr = kernel_events(since, timeout_s, previous_boot=previous_boot)
    errors.extend(kerr)
    collector = GpuCollector(deadline_s=gpu_deadline_s, source=gpu_source)
    gpus, nvml = collector.collect()
    collector.close()
    if not nvml.ok:
        errors.append(f"host GPUs ({nvml.source}): {nvml.error_kind}: {nvml.message}")
    gpus = attribute_processes(gpus, ProcessReader(proc_root), {}, proc_root)
    gpu_pids = {str(p.pid): p.vmid for g in gpus for p in g.processes or ()}
    pid_vmid = {int(k): v for k, v in gpu_pids.items()}
    return HostProbe(
        host=host or os.uname().nodename,
        taken_at=time.time(),
        container_status=status,
        kernel_events=tuple(owner_of_event(e, gpus, pid_vmid, {}) for e in events),
        gpu_pids=gpu_pids,
        kernel_log_source=source,
        errors=tuple(errors),
        gpu_processes=tuple({p.pid: p for g in gpus for p in g.processes or ()}.values()),
    )
