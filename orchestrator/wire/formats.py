"""Text formats both sides read, each parsed in this one place: GPU lists (``0-3,6``), the
output of ``pct status``, run ids, and which PIDs a driver's NVML gives a container.

Standard library only: it ships in the agent bundle (the agent parses ``launch --gpus`` and
``pct status`` too), so the operator and the agent cannot disagree about a format.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

MAX_GPU_INDEX = 1023
"""GPU indices above this are refused, so a range like ``0-999999999`` cannot eat memory."""
_GPU_RANGE = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def parse_gpu_spec(text: str) -> list[int]:
    """GPU indices from ``"0-4"``, ``"5"`` or ``"0-2,6"``, sorted, each once; raises ``ValueError``
    saying why (hosts.yaml, ``orch launch --gpus``, ``orch init``, the agent's ``launch``).

    >>> parse_gpu_spec("0-4"), parse_gpu_spec("0-2, 6"), parse_gpu_spec("6,0-1,1")
    ([0, 1, 2, 3, 4], [0, 1, 2, 6], [0, 1, 6])
    >>> parse_gpu_spec("4-2")
    Traceback (most recent call last):
    ValueError: range '4-2' runs backwards
    >>> parse_gpu_spec("0-5000")
    Traceback (most recent call last):
    ValueError: GPU index 5000 is above 1023
    >>> parse_gpu_spec("0,x")
    Traceback (most recent call last):
    ValueError: 'x' is not a GPU index or range like '0-4'
    """
    out: set[int] = set()
    for part in text.split(","):
        m = _GPU_RANGE.fullmatch(part)
        if not m:
            raise ValueError(f"{part.strip()!r} is not a GPU index or range like '0-4'")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if hi < lo:
            raise ValueError(f"range {part.strip()!r} runs backwards")
        if hi > MAX_GPU_INDEX:
            raise ValueError(f"GPU index {hi} is above {MAX_GPU_INDEX}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def gpu_ranges(ids: Iterable[int]) -> str:
    """GPU indices written compactly, the inverse of :func:`parse_gpu_spec`.

    >>> gpu_ranges([0, 1, 2, 3, 4]), gpu_ranges([5, 7, 8]), gpu_ranges([])
    ('0-4', '5,7-8', '')
    """
    parts: list[str] = []
    for i in sorted(set(ids)):
        if parts and parts[-1].split("-")[-1] == str(i - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ",".join(parts)


def parse_pct_status(text: str) -> str:
    """The state word of ``pct status VMID`` output (``running``, ``stopped``...), ``unknown``
    when there is none.

    >>> parse_pct_status("status: running\\n"), parse_pct_status("  status: stopped")
    ('running', 'stopped')
    >>> parse_pct_status("garbage"), parse_pct_status("status:")
    ('unknown', 'unknown')
    """
    for line in text.splitlines():
        if line.strip().startswith("status:"):
            words = line.split(":", 1)[1].split()
            return words[0] if words else "unknown"
    return "unknown"


def parse_pct_lock(text: str) -> str | None:
    """The lock of ``pct status VMID --verbose`` output (``backup``, ``migrate``, ``snapshot``...:
    pve-container src/PVE/LXC.pm vmstatus ``$d->{lock} = $conf->{lock} if $conf->{lock}``),
    ``None`` when not locked.

    >>> parse_pct_lock("lock: backup\\nstatus: stopped\\n"), parse_pct_lock("status: running")
    ('backup', None)
    """
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "lock" and value.strip():
            return value.split()[0]
    return None


RUN_ID_STAMP = "%Y%m%d-%H%M%S"
"""A run id's time, in UTC: ``YYYYmmdd-HHMMSS`` (also a postmortem bundle's)."""
ARCHIVE_STAMP = "%Y%m%dT%H%M%SZ"
"""An archived file's time, in UTC: ISO 8601 basic, ``YYYYmmddTHHMMSSZ``."""


def utc_stamp(now: float | None = None, fmt: str = RUN_ID_STAMP) -> str:
    """``now`` (Unix s; default the current time) in UTC as ``fmt``.

    >>> utc_stamp(0), utc_stamp(86399, ARCHIVE_STAMP)
    ('19700101-000000', '19700101T235959Z')
    """
    return time.strftime(fmt, time.gmtime(time.time() if now is None else now))


def new_run_id(name: str | None, now: float | None = None) -> str:
    """``YYYYmmdd-HHMMSS[-NAME]`` in UTC, at ``now`` (Unix s; default the current time).

    >>> new_run_id("lr3e4", now=0), new_run_id(None, now=86399)
    ('19700101-000000-lr3e4', '19700101-235959')
    """
    stamp = utc_stamp(now)
    return f"{stamp}-{name}" if name else stamp


# Drivers whose resource manager gives a container NVML's process list in the caller's PID
# namespace: _gpuConvertPid (src/nvidia/src/kernel/gpu/gpu_rmapi.c) -> os_find_ns_pid, whose
# pid_vnr (kernel-open/nvidia/os-interface.c) also drops a process the caller cannot see.
# Read in github:NVIDIA/open-gpu-kernel-modules at every tag 515.43.04-595.45.04: present in
# 535.43.24-535.43.28 and in every tag from 535.113.01 on (545.23.06, 550, ..., 595); absent
# from 535.54.03 to 535.104.12 and in every 515, 520, 525 and 530 driver (ProcID, the host's).
NAMESPACE_PID_DRIVERS: tuple[tuple[tuple[int, ...], tuple[int, ...] | None], ...] = (
    ((535, 43, 24), (535, 54)),
    ((535, 113, 1), None),
)


def driver_version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``"535.113.01"`` -> ``(535, 113, 1)``; ``None`` when it is not dotted numbers.

    >>> driver_version_tuple("535.104.05"), driver_version_tuple("595.45.04 "), driver_version_tuple("n/a")
    ((535, 104, 5), (595, 45, 4), None)
    """
    parts = (text or "").strip().split(".")
    if not parts or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def nvml_pid_numbering(driver_version: str | None) -> str | None:
    """Which PIDs this driver's NVML process list gives inside a container: ``"namespace"``
    (the container's own, others left out) or ``"host"``; ``None``: version unknown.

    >>> [nvml_pid_numbering(v) for v in ("535.104.05", "535.113.01", "545.23.06", "530.41.03")]
    ['host', 'namespace', 'namespace', 'host']
    >>> nvml_pid_numbering("535.43.24"), nvml_pid_numbering("535.54.03"), nvml_pid_numbering(None)
    ('namespace', 'host', None)
    """
    version = driver_version_tuple(driver_version)
    if version is None:
        return None
    for first, before in NAMESPACE_PID_DRIVERS:
        if version >= first and (before is None or version < before):
            return "namespace"
    return "host"
