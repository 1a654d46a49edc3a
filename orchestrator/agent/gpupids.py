"""Which PIDs NVML's process list gives inside a container, and the processes in that light.

Drivers since 535.113.01 (and 535.43.24-535.43.28) give a container the PIDs of its own PID
namespace and leave out the processes it cannot see; older ones give every process's host
PID (``formats.nvml_pid_numbering``, from the driver's source). The evidence wins over the
version: a listed PID that is not in this container's /proc proves host numbering (the
driver's ``pid_vnr`` never returns a PID its caller cannot see).

On the Proxmox host NVML always gives host PIDs; nothing here runs there.
"""

from __future__ import annotations

import os
from dataclasses import replace

from orchestrator.agent.procdetails import ProcDetails
from orchestrator.wire.formats import nvml_pid_numbering
from orchestrator.wire.model import GpuSample, NvmlStatus


def decide_numbering(pids: set[int], missing: set[int], driver_version: str | None) -> str | None:
    """``"host"`` or ``"namespace"`` for a container's NVML list; ``None``: nothing tells.

    >>> decide_numbering({4242}, {4242}, "570.172.08")   # not here: a host PID, whatever the driver
    'host'
    >>> decide_numbering({17}, set(), "570.172.08"), decide_numbering({17}, set(), "535.104.05")
    ('namespace', 'host')
    >>> decide_numbering(set(), set(), None) is None
    True
    """
    if missing:
        return "host"
    return nvml_pid_numbering(driver_version)


def _comm(proc: str, pid: int) -> str | None:
    try:
        with open(f"{proc}/{pid}/comm", "rb") as fh:
            return fh.read(64).decode("utf-8", "replace").strip() or None
    except OSError:
        return None


_DETAILS: dict[str, ProcDetails] = {}
"""One reader of users, CPU % and commands per /proc, kept for the agent's life (CPU % is
over the interval between two collections)."""


def in_container(
    samples: tuple[GpuSample, ...], status: NvmlStatus, proc: str = "/proc"
) -> tuple[tuple[GpuSample, ...], NvmlStatus]:
    """The samples and status of a collection inside a container, with ``pid_numbering`` set;
    under ``namespace`` each process gets ``container_pid`` (its PID here), ``name``, and its
    ``user``, ``cpu_pct`` and ``command`` (:class:`~orchestrator.agent.procdetails.ProcDetails`;
    under ``host`` numbering the PID names no process here: they stay ``None``)."""
    pids = {p.pid for s in samples for p in s.processes or ()}
    missing = {p for p in pids if not os.path.exists(f"{proc}/{p}")}
    numbering = decide_numbering(pids, missing, status.driver_version)
    status = replace(status, pid_numbering=numbering)
    if numbering != "namespace":
        return samples, status
    out = tuple(
        replace(
            s,
            processes=tuple(
                replace(p, container_pid=p.pid, name=_comm(proc, p.pid)) for p in s.processes
            ),
        )
        if s.processes
        else s
        for s in samples
    )
    details = _DETAILS.setdefault(proc, ProcDetails(proc, map_ids=False))
    return details.fill(out), status
