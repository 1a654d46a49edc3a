"""The answers of the agent's run commands (``launch``, ``stop``, ``runs``, ``logs``,
``evidence``): frozen :class:`~orchestrator.wire.model.Wire` dataclasses, as ``Snapshot`` is.

The agent builds them and prints ``to_dict()``; the operator reads them back with
``from_dict`` (unknown keys ignored, missing ones defaulted), so both sides name each field
once. Standard library and ``model`` only: this module ships in the agent bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.wire.model import RunManifest, SessionState, Wire


@dataclass(frozen=True, slots=True)
class StopRequest(Wire):
    """A run's ``stop_requested`` file: when (Unix s) ``orch stop`` asked, its first signal,
    who asked, and the grace it gave (s)."""

    at: float
    signal: str | None = None
    by: str | None = None
    grace_s: float | None = None


RUN_PHASES = ("running", "exited", "vanished")
"""What a run directory says of its run (:func:`run_phase`)."""


def run_phase(exit_status: int | None, alive: bool) -> str:
    """``exited`` once the wrapper wrote an exit status; else ``running`` while the wrapper or
    the command lives; else ``vanished`` (no status, nothing alive: the silent death of seed 000).

    >>> run_phase(0, False), run_phase(None, True), run_phase(None, False)
    ('exited', 'running', 'vanished')
    """
    if exit_status is not None:
        return "exited"
    return "running" if alive else "vanished"


@dataclass(frozen=True, slots=True)
class RunStatus(Wire):
    """What one run directory says (the agent's ``runs --run-id``; also inside the other answers).

    ``state`` is :func:`run_phase`'s word; ``tmux`` the run's session when it was asked for,
    ``tmux_is_this_run`` whether that session's pane is this run's wrapper.
    """

    run_id: str
    run_dir: str
    state: str
    exit_status: int | None = None
    wrapper_alive: bool = False
    started: bool = False
    command_alive: bool = False
    command_pids: tuple[int, ...] = ()
    log_path: str | None = None
    log_exists: bool = False
    log_size_bytes: int | None = None
    log_tail: tuple[str, ...] = ()
    stop_requested: StopRequest | None = None
    tee_error: str | None = None
    tee_status: int | None = None
    started_at: float | None = None
    command: str | None = None
    session: str | None = None
    tmux: SessionState | None = None
    tmux_is_this_run: bool | None = None


@dataclass(frozen=True, slots=True)
class StopAnswer(Wire):
    """The agent's ``stop``: whether it had to stop anything, the signals sent, the end state."""

    stopped: bool
    run_id: str
    state: str
    exit_status: int | None = None
    signals: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    stop_requested: StopRequest | None = None


@dataclass(frozen=True, slots=True)
class LaunchAnswer(Wire):
    """The agent's ``launch``: the run it started, the run it replaced (``--force``), and the
    run's status after ``--settle`` seconds."""

    run_id: str
    run_dir: str
    session: str
    log_path: str
    manifest: RunManifest
    state: RunStatus
    history_limit: int
    replaced: StopAnswer | None = None
    ok: bool = True
    carried: tuple[str, ...] = ()
    """Checkpoint files hard-linked from the run named by ``--carry-from`` (a relaunch)."""
    carry_error: str | None = None


@dataclass(frozen=True, slots=True)
class RunsAnswer(Wire):
    """The agent's ``runs``: every run directory of the workdir, oldest first."""

    workdir: str
    current: str | None = None
    runs: tuple[RunStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class LogAnswer(Wire):
    """The agent's ``logs``: lines of a run's log and the byte ``offset`` to read on from.

    ``truncated``: the log shrank below the offset (rotated), reading began again at 0;
    ``end`` (``--follow``): the run is over and this is the last chunk, with its ``state``.
    """

    run_id: str
    lines: tuple[str, ...] = ()
    offset: int = 0
    size: int | None = None
    truncated: bool = False
    log_exists: bool | None = None
    end: bool = False
    state: RunStatus | None = None


@dataclass(frozen=True, slots=True)
class LogTail(Wire):
    """The end of a run's ``train.log`` as the evidence reads it (``mtime`` Unix s)."""

    path: str
    exists: bool = False
    size_bytes: int | None = None
    mtime: float | None = None
    tail: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PaneCapture(Wire):
    """The run pane's last screen and scrollback, or why there is none."""

    lines: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat(Wire):
    """The trainer's ``heartbeat`` file: its first 100 characters and its age (s)."""

    text: str
    age_s: float


@dataclass(frozen=True, slots=True)
class TeeReport(Wire):
    """What tee said on its stderr (``tee.err``) and its exit status once it ended."""

    error: str | None = None
    status: int | None = None


@dataclass(frozen=True, slots=True)
class EvidenceAnswer(Wire):
    """The agent's ``evidence``: everything a postmortem needs from one run directory, read
    with bounds (docs in :mod:`orchestrator.agent.evidence`). ``now`` is the container's clock
    (Unix s); ``manifest`` is the file as written (a mapping: the operator validates it).
    """

    now: float
    run_id: str
    run_dir: str
    state: RunStatus
    log: LogTail
    pane: PaneCapture = PaneCapture()
    current: str | None = None
    manifest: dict[str, Any] | None = None
    manifest_error: str | None = None
    exit_status: int | None = None
    exit_status_at: float | None = None
    session: str | None = None
    tmux_server_running: bool = False
    gpu_history: tuple[dict[str, Any], ...] = ()
    metrics: tuple[dict[str, Any], ...] = ()
    heartbeat: Heartbeat | None = None
    pgid: int | None = None
    wrapper_pid: int | None = None
    files: dict[str, int] = field(default_factory=dict)
    stop_requested: StopRequest | None = None
    tee: TeeReport = TeeReport()
    ok: bool = True
