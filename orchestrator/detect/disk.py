"""Disk detector: free space on the file system that holds the run (its log, checkpoints).

Pure: reads ``RunState.disk_free_mib`` / ``disk_total_mib`` (the agent's statvfs of
the run directory). A full disk is quiet in the log: tee says "No space left on
device" once, to the pane, and the line scrolls away; the reading does not.
"""

from __future__ import annotations

from orchestrator.config.limits import Limits
from orchestrator.detect.base import History, fmt_time, reachable, trailing
from orchestrator.wire.model import Finding, Severity, Snapshot


def fmt_mib(value: float | None) -> str:
    """A size for messages: MiB below 1 GiB, else GiB (``?`` when unknown).

    >>> fmt_mib(0.0), fmt_mib(0.25), fmt_mib(512.0), fmt_mib(5120.0), fmt_mib(None)
    ('0 MiB', '0.25 MiB', '512 MiB', '5.0 GiB', '?')
    """
    if value is None:
        return "?"
    if value >= 1024:
        return f"{value / 1024:.1f} GiB"
    return f"{value:.0f} MiB" if float(value).is_integer() else f"{value:.2f} MiB"


def _free(snap: Snapshot) -> float | None:
    return snap.run.disk_free_mib if snap.run is not None else None


def _under(free_mib: float, limit_mib: float) -> bool:
    """Nothing left at all, or less than the limit (a limit of 0 still catches a full disk)."""
    return free_mib <= 0 or free_mib < limit_mib


def disk_full(history: History, limits: Limits) -> list[Finding]:
    """``disk-full`` when the run's file system is (nearly) out of space.

    Critical when nothing is left (writes fail with ENOSPC) or less than
    ``limits.critical_free_disk_gib``; warning under ``limits.min_free_disk_gib``.
    Judged on the newest reachable snapshot with a reading; ``since`` is the first
    of the trailing snapshots under the same threshold. Playbook ``disk-full``.
    """
    snaps = [s for s in reachable(history) if _free(s) is not None]
    if not snaps:
        return []
    last = snaps[-1]
    free = _free(last)
    assert free is not None and last.run is not None
    critical_mib = limits.critical_free_disk_gib * 1024
    warning_mib = limits.min_free_disk_gib * 1024
    if _under(free, critical_mib):
        severity, limit_mib = Severity.CRITICAL, critical_mib
    elif _under(free, warning_mib):
        severity, limit_mib = Severity.WARNING, warning_mib
    else:
        return []
    under = trailing(snaps, lambda s: _under(_free(s) or 0.0, limit_mib))
    total = last.run.disk_total_mib
    where = last.run.run_dir
    if free <= 0:
        head = f"disk full: no space left on the run's file system ({fmt_mib(total)})"
        tail = "; writes fail (No space left on device): the log and checkpoints are not saved"
    elif severity is Severity.CRITICAL:
        head = (
            f"disk nearly full: {fmt_mib(free)} free of {fmt_mib(total)} on the run's file system"
        )
        tail = f" (< {limits.critical_free_disk_gib:g} GiB): the next checkpoint save may fail"
    else:
        head = f"low disk space: {fmt_mib(free)} free of {fmt_mib(total)} on the run's file system"
        tail = f" (< min_free_disk_gib {limits.min_free_disk_gib:g} GiB)"
    evidence = tuple(
        f"{fmt_time(s.taken_at)} {where}: {fmt_mib(_free(s))} free of "
        f"{fmt_mib(s.run.disk_total_mib if s.run else None)}"
        for s in under[-3:]
    )
    return [
        Finding(
            kind="disk-full",
            severity=severity,
            target=last.target,
            summary=head + tail,
            since=under[0].taken_at,
            evidence=evidence,
            playbook="disk-full",
        )
    ]
