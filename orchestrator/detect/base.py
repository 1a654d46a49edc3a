"""Small pure helpers the detector families share: liveness, run GPUs, trailing runs, signals.

Nothing here reads a clock or a file; time is always a snapshot's ``taken_at``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from orchestrator.wire.model import GpuSample, RunManifest, Snapshot

History = Sequence[Snapshot]
"""A target's snapshots, oldest first."""

STOP_SLACK_S = 1.0
"""An exit this much before ``orch stop``'s request still counts as the stop's: the exit
status file's mtime and the request's time come from clocks a second apart at worst."""


def ended_on_request(requested_at: float | None, ended_at: float | None) -> bool:
    """The run ended because ``orch stop`` asked (the one rule of the exit-status detector, the
    state word and the postmortem's verdict): a request exists and the run ended no earlier
    than :data:`STOP_SLACK_S` before it. An end of unknown time after a request counts.

    >>> ended_on_request(10.0, 9.5), ended_on_request(10.0, 8.0), ended_on_request(None, 12.0)
    (True, False, False)
    >>> ended_on_request(10.0, None)
    True
    """
    if requested_at is None:
        return False
    return ended_at is None or ended_at >= requested_at - STOP_SLACK_S


def signal_name(exit_status: int) -> str | None:
    """The signal behind a shell exit status above 128 (``None`` otherwise).

    >>> signal_name(137)
    'SIGKILL'
    >>> signal_name(139)
    'SIGSEGV'
    >>> signal_name(1) is None
    True
    """
    if exit_status <= 128:
        return None
    return signal_number_name(exit_status - 128)


def signal_number_name(number: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for a number Python does not know.

    >>> signal_number_name(15)
    'SIGTERM'
    >>> signal_number_name(99)
    'signal 99'
    """
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def fmt_time(at: float | None) -> str:
    """Unix seconds as a UTC ISO-8601 string (``?`` when unknown).

    >>> fmt_time(0)
    '1970-01-01T00:00:00Z'
    >>> fmt_time(None)
    '?'
    """
    if at is None:
        return "?"
    return datetime.fromtimestamp(at, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_gpus(gpus: Sequence[int]) -> str:
    """GPU indices as compact ranges.

    >>> fmt_gpus([5, 6, 7, 0, 2])
    '0, 2, 5-7'
    >>> fmt_gpus([])
    'none'
    """
    ids = sorted(set(gpus))
    if not ids:
        return "none"
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def manifest_of(history: History) -> RunManifest | None:
    """The newest run manifest any snapshot carried."""
    for snap in reversed(history):
        if snap.run is not None and snap.run.manifest is not None:
            return snap.run.manifest
    return None


def reachable(history: History) -> list[Snapshot]:
    """The snapshots that hold data (transport worked)."""
    return [s for s in history if s.reachable]


def alive(snap: Snapshot) -> bool:
    """Whether the run's process tree has a live (non-zombie) process in this snapshot."""
    return any(not p.zombie and p.state != "Z" for p in snap.processes)


def session_gone(snap: Snapshot) -> bool:
    """No tmux session (or no tmux server at all) for the run."""
    return snap.session is None or not snap.session.exists or not snap.session.server_running


def run_gpus(snap: Snapshot, roles: dict[int, str] | None) -> list[int]:
    """The GPUs the run uses: the manifest's, else the configured roles', else every GPU seen."""
    if snap.run is not None and snap.run.manifest is not None and snap.run.manifest.gpus:
        return sorted(snap.run.manifest.gpus)
    if roles:
        return sorted(roles)
    return sorted(g.index for g in snap.gpus)


def gpu(snap: Snapshot, index: int) -> GpuSample | None:
    """The sample for GPU ``index`` in ``snap`` (``None`` when absent)."""
    for g in snap.gpus:
        if g.index == index:
            return g
    return None


def trailing(history: History, pred: Callable[[Snapshot], bool]) -> list[Snapshot]:
    """The longest run of newest snapshots that all satisfy ``pred`` (oldest first)."""
    out: list[Snapshot] = []
    for snap in reversed(history):
        if not pred(snap):
            break
        out.append(snap)
    out.reverse()
    return out


def role_label(gpus: Sequence[int], roles: dict[int, str] | None) -> str:
    """``drafter GPUs 5-7`` when every GPU shares a role, else ``GPUs 5-7``.

    >>> role_label([5, 6, 7], {5: "drafter", 6: "drafter", 7: "drafter"})
    'drafter GPUs 5-7'
    >>> role_label([3], None)
    'GPU 3'
    """
    noun = "GPU" if len(set(gpus)) == 1 else "GPUs"
    names = {(roles or {}).get(g) for g in gpus}
    prefix = f"{names.pop()} " if len(names) == 1 and None not in names else ""
    return f"{prefix}{noun} {fmt_gpus(gpus)}"


def fmt_num(value: float | None, unit: str = "") -> str:
    """A reading for evidence text: ``0 MiB``, ``100 %``, ``?`` when missing.

    >>> fmt_num(0.0, "MiB"), fmt_num(99.5, "%"), fmt_num(None, "W")
    ('0 MiB', '99.5 %', '?')
    """
    if value is None:
        return "?"
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{text} {unit}".rstrip()
