"""Detector thresholds: defaults here, overridable per container in hosts.yaml (``thresholds:``).

Field names carry their units. config.py validates the ``thresholds:`` mapping
against these fields (unknown keys get a nearest-name suggestion).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Limits:
    """Every threshold a detector uses. Defaults are argued in docs/detectors.md."""

    startup_grace_s: float = 120.0
    """Seconds after launch before "not allocating" may fire (seed 002: 0 MiB at 8 s is normal)."""
    startup_timeout_s: float = 60.0
    """Seconds launch verification waits for the run to prove itself alive."""
    stall_timeout_s: float = 600.0
    """Seconds with a live process but no new log line and no step progress."""
    ghost_util_pct: float = 95.0
    ghost_mem_mib: float = 64.0
    ghost_samples: int = 2
    """Consecutive samples at >= ghost_util_pct with <= ghost_mem_mib before ghost-utilization fires."""
    idle_mem_mib: float = 64.0
    """A GPU at or below this is "not allocating"."""
    busy_mem_mib: float = 1024.0
    """Launch preflight refuses GPUs holding more than this (or any compute process)."""
    min_tokens_per_s: float | None = None
    """Absolute floor for tokens/s; ``None`` disables it."""
    throughput_drop_ratio: float = 0.5
    throughput_samples: int = 3
    """tokens/s below ratio x the run's rolling baseline for this many samples."""
    imbalance_util_pct: float = 5.0
    imbalance_samples: int = 3
    min_free_disk_gib: float = 5.0
    """Free space on the run's file system below this is a ``disk-full`` warning."""
    critical_free_disk_gib: float = 1.0
    """Below this (or nothing left at all) ``disk-full`` is critical: a checkpoint save will fail."""
    ignored_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    """Application-level Xids (per NVIDIA's k8s device plugin) that are not hardware faults."""
    stall_busy_util_pct: float = 90.0
    """A stalled run whose GPUs average at or above this is spinning (stuck kernel, NCCL hang)."""
    throughput_baseline_samples: int = 10
    """How many earlier tokens/s readings form the rolling baseline (their median)."""

    def merged(self, overrides: dict[str, Any]) -> Limits:
        """A copy with ``overrides`` applied (keys already validated by config.py)."""
        return replace(self, **overrides)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
