"""The agent's run commands as typed requests: one dataclass per command, ``to_argv()`` its argv.

These are the one place that names each flag of ``launch``, ``stop``, ``runs``, ``logs`` and
``evidence`` and its default: the agent's argparse (:mod:`orchestrator.agent.runs`,
:mod:`orchestrator.agent.evidence`) takes its defaults from here (:func:`default`), and the
operator side builds a request and hands it to :class:`orchestrator.remote.target.Target`;
no caller assembles agent argv itself. Ships in the bundle with the rest of ``wire/``.

Times are seconds; ``None`` leaves a flag out (the agent's default applies).

>>> StopRequest("/w", run_id="r1", grace_s=5.0, by="orch stop by u@h").to_argv()
['stop', '--workdir', '/w', '--grace', '5.0', '--by', 'orch stop by u@h', '--run-id', 'r1']
>>> RunsRequest("/w", run_id="r1", tail=30).to_argv()
['runs', '--workdir', '/w', '--session', 'train', '--run-id', 'r1', '--tail', '30']
>>> default(LaunchRequest, "settle_s"), default(EvidenceRequest, "log_lines")
(1.0, 200)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

SESSION = "train"
"""The tmux session a run lives in when the inventory names none."""
GRACE_S = 60.0
"""How long ``stop`` (and ``launch --force``) waits before SIGKILL (s)."""
EXIT_LINE = "[orch] command exited with status"
"""How the wrapper's last log line starts (``... N at DATE``): written by ``agent/runs.py``, read
by ``detect/run.py``."""


class AgentRequest(Protocol):
    """Any request here: :meth:`Target.call` runs what ``to_argv`` says."""

    def to_argv(self) -> list[str]: ...


def default(cls: type, name: str) -> Any:
    """The default of field ``name`` of request class ``cls`` (what the agent's argparse uses).

    Raises:
        KeyError: ``cls`` has no such field.
    """
    return cls.__dataclass_fields__[name].default  # type: ignore[attr-defined]


def _opt(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _on(flag: str, value: bool) -> list[str]:
    return [flag] if value else []


def _unless_default(req: Any, name: str, flag: str) -> list[str]:
    """``[flag, value]`` unless field ``name`` of ``req`` holds its default (the agent's too)."""
    value = getattr(req, name)
    return [] if value == default(type(req), name) else [flag, str(value)]


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchRequest:
    """``launch``: start ``cmd`` in tmux with the wrapper, tee and exit status.

    The run's variables never travel in argv (ps shows it): :meth:`Target.launch` sends them
    on stdin and adds ``--env-stdin``.
    """

    workdir: str
    cmd: str
    session: str = SESSION
    run_id: str | None = None
    gpus: str = ""
    force: bool = False
    grace_s: float = GRACE_S
    settle_s: float = 1.0
    record_interval_s: float = 2.0
    no_recorder: bool = False
    orch_version: str | None = None
    target: str | None = None
    env_from: str | None = None
    carry_from: str | None = None
    env_stdin: bool = False

    def to_argv(self) -> list[str]:
        """The agent's argv, ``launch`` first; defaults of the agent's own are left out."""
        return [
            "launch",
            "--workdir",
            self.workdir,
            "--session",
            self.session,
            "--cmd",
            self.cmd,
            *_opt("--run-id", self.run_id),
            "--gpus",
            self.gpus,
            "--grace",
            str(self.grace_s),
            "--settle",
            str(self.settle_s),
            *_unless_default(self, "record_interval_s", "--record-interval"),
            *_on("--no-recorder", self.no_recorder),
            *_opt("--orch-version", self.orch_version),
            *_opt("--target", self.target),
            *_on("--force", self.force),
            *_opt("--carry-from", self.carry_from),
            *_opt("--env-from", self.env_from),
            *_on("--env-stdin", self.env_stdin),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class StopRequest:
    """``stop``: SIGINT, SIGTERM at half of ``grace_s``, SIGKILL at ``grace_s``."""

    workdir: str
    run_id: str | None = None
    grace_s: float = GRACE_S
    by: str | None = None

    def to_argv(self) -> list[str]:
        return [
            "stop",
            "--workdir",
            self.workdir,
            "--grace",
            str(self.grace_s),
            *_opt("--by", self.by),
            *_opt("--run-id", self.run_id),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class RunsRequest:
    """``runs``: every run, or one in detail (``run_id`` / ``current``) with ``tail`` log lines."""

    workdir: str
    session: str = SESSION
    run_id: str | None = None
    current: bool = False
    tail: int = 0

    def to_argv(self) -> list[str]:
        return [
            "runs",
            "--workdir",
            self.workdir,
            "--session",
            self.session,
            *_opt("--run-id", self.run_id),
            *_on("--current", self.current),
            *_opt("--tail", self.tail or None),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class LogsRequest:
    """``logs``: the last ``lines`` lines of a run's log, or (``follow``) one JSON line per chunk."""

    workdir: str
    run_id: str | None = None
    lines: int = 50
    offset: int | None = None
    max_bytes: int = 1 << 20
    follow: bool = False
    interval_s: float = 0.5

    def to_argv(self) -> list[str]:
        return [
            "logs",
            "--workdir",
            self.workdir,
            "-n",
            str(self.lines),
            *(["-f", "--interval", str(self.interval_s)] if self.follow else []),
            *_opt("--offset", self.offset),
            *_unless_default(self, "max_bytes", "--max-bytes"),
            *_opt("--run-id", self.run_id),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class EvidenceRequest:
    """``evidence``: a run's postmortem evidence, every read bounded by the counts here."""

    workdir: str
    session: str = SESSION
    run_id: str | None = None
    log_lines: int = 200
    pane_lines: int = 200
    gpu_samples: int = 720
    """Flight-recorder samples kept (24 min at the launcher's 2 s period)."""
    metric_records: int = 2000

    def to_argv(self) -> list[str]:
        return [
            "evidence",
            "--workdir",
            self.workdir,
            "--session",
            self.session,
            "--log-lines",
            str(self.log_lines),
            "--pane-lines",
            str(self.pane_lines),
            *_unless_default(self, "gpu_samples", "--gpu-samples"),
            *_unless_default(self, "metric_records", "--metric-records"),
            *_opt("--run-id", self.run_id),
        ]
