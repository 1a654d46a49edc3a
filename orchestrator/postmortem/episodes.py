"""Episodes: every stretch of the GPU history in which a GPU detector's condition held (pure).

The detectors judge the newest samples (:func:`orchestrator.detect.base.trailing`), so a
ghost GPU that latched at 100 % for a minute and then cleared before the crash leaves no
finding, although the chart shows it. :func:`gpu_episodes` walks the whole history per GPU
with the same conditions and gives each stretch its start, end and whether it cleared, so
the report lists what the chart shows.

Conditions (the detectors' own, :mod:`orchestrator.detect.gpu`): ``ghost-utilization``,
at least ``ghost_samples`` samples at >= ``ghost_util_pct`` with <= ``ghost_mem_mib`` used;
``nvml-error``, a device that answered with an error (one sample is enough).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.limits import Limits
from orchestrator.detect.base import fmt_time, gpu, reachable
from orchestrator.detect.gpu import _is_ghost
from orchestrator.wire.model import Finding, GpuSample, Snapshot


@dataclass(frozen=True, slots=True)
class Episode:
    """GPU ``gpu`` in condition ``kind`` (a finding kind) from ``start`` to ``end`` (Unix s,
    the first and last sample that showed it) over ``samples`` samples; ``cleared_at`` is the
    first later sample that no longer did (``None``: it held to the last sample)."""

    kind: str
    gpu: int
    start: float
    end: float
    samples: int
    cleared_at: float | None = None
    detail: str = ""

    @property
    def cleared(self) -> bool:
        return self.cleared_at is not None

    def line(self) -> str:
        """One line for people.

        >>> Episode("ghost-utilization", 3, 20.0, 40.0, 11, 42.0).line()
        'ghost-utilization GPU 3: 1970-01-01T00:00:20Z to 1970-01-01T00:00:40Z (11 samples, 20 s), cleared by 1970-01-01T00:00:42Z'
        """
        span = f"{self.end - self.start:.0f} s"
        state = (
            f"cleared by {fmt_time(self.cleared_at)}"
            if self.cleared_at is not None
            else "still on at the last sample"
        )
        detail = f"; {self.detail}" if self.detail else ""
        return (
            f"{self.kind} GPU {self.gpu}: {fmt_time(self.start)} to "
            f"{fmt_time(self.end)} ({self.samples} samples, {span}), {state}{detail}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "gpu": self.gpu,
            "start": self.start,
            "end": self.end,
            "samples": self.samples,
            "cleared_at": self.cleared_at,
            "detail": self.detail,
        }


def _stretches(
    snaps: Sequence[Snapshot], index: int, key: Callable[[GpuSample | None], str | None]
) -> list[tuple[str, list[Snapshot], float | None]]:
    """Maximal runs of ``snaps`` whose GPU ``index`` has the same non-None ``key``: (key, run,
    the first sample after it)."""
    out: list[tuple[str, list[Snapshot], float | None]] = []
    current: str | None = None
    run: list[Snapshot] = []
    for s in snaps:
        k = key(gpu(s, index))
        if k != current and run and current is not None:
            out.append((current, run, s.taken_at))
            run = []
        current = k
        if k is not None:
            run.append(s)
    if run and current is not None:
        out.append((current, run, None))
    return out


def gpu_episodes(history: Sequence[Snapshot], limits: Limits) -> tuple[Episode, ...]:
    """Every ghost-utilization and nvml-error episode of each GPU in ``history`` (oldest
    first), ordered by start. Unreachable samples are skipped (they say nothing of a GPU).

    >>> from orchestrator.wire.model import GpuSample, Snapshot
    >>> def snap(t, util, mem):
    ...     return Snapshot(target="ct", taken_at=t, gpus=(GpuSample(index=3, utilization_pct=util, memory_used_mib=mem),))
    >>> h = [snap(0.0, 0, 0), snap(2.0, 100, 0), snap(4.0, 100, 0), snap(6.0, 0, 0), snap(8.0, 100, 0), snap(10.0, 100, 0)]
    >>> [(e.start, e.end, e.cleared_at) for e in gpu_episodes(h, Limits())]
    [(2.0, 4.0, 6.0), (8.0, 10.0, None)]
    """
    snaps = reachable(history)
    indices = sorted({g.index for s in snaps for g in s.gpus})
    out: list[Episode] = []
    for i in indices:

        def ghost(g: GpuSample | None) -> str | None:
            return "ghost-utilization" if _is_ghost(g, limits) else None

        def failed(g: GpuSample | None) -> str | None:
            return g.error if g is not None and g.error else None

        for _, run, after in _stretches(snaps, i, ghost):
            if len(run) >= limits.ghost_samples:
                peak = max((x.utilization_pct or 0.0) for s in run if (x := gpu(s, i)))
                out.append(
                    Episode(
                        "ghost-utilization",
                        i,
                        run[0].taken_at,
                        run[-1].taken_at,
                        len(run),
                        after,
                        f"up to {peak:.0f} % busy, <= {limits.ghost_mem_mib:.0f} MiB used",
                    )
                )
        for error, run, after in _stretches(snaps, i, failed):
            out.append(
                Episode(
                    "nvml-error",
                    i,
                    run[0].taken_at,
                    run[-1].taken_at,
                    len(run),
                    after,
                    f"error {error}",
                )
            )
    return tuple(sorted(out, key=lambda e: (e.start, e.gpu, e.kind)))


def finding_of(episode: Episode, findings: Sequence[Finding]) -> Finding | None:
    """The finding that reports ``episode`` (same kind, its GPU, from its start), if any: a
    detector reports an episode that lasts to the last sample.

    >>> from orchestrator.wire.model import Severity
    >>> f = Finding("ghost-utilization", Severity.CRITICAL, "ct", "s", gpus=(3,), since=8.0)
    >>> finding_of(Episode("ghost-utilization", 3, 8.0, 10.0, 2), [f]) is f
    True
    >>> finding_of(Episode("ghost-utilization", 3, 2.0, 4.0, 2, 6.0), [f]) is None
    True
    """
    for f in findings:
        same = f.kind == episode.kind and episode.gpu in f.gpus
        if same and (episode.cleared_at is None or f.since == episode.start):
            return f
    return None
