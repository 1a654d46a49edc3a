"""The agent's commands as typed requests: one dataclass per command, ``to_argv()`` its argv,
``read()`` its answer.

These are the one place that names each flag of the agent's commands and its default: the
agent's argparse (:mod:`orchestrator.agent.__main__`, :mod:`orchestrator.agent.runs`,
:mod:`orchestrator.agent.evidence`) takes its defaults from here (:func:`default`), and the
operator side builds a request and hands it to :class:`orchestrator.remote.target.Target`
(the host's commands to ``Host`` and ``HostLink``); no caller assembles agent argv or decodes
an answer itself. Each request names its answer type (:attr:`AgentRequest.answer`):
``Target.call(req)`` returns one. Ships in the bundle with the rest of ``wire/``.

Times are seconds; ``None`` leaves a flag out (the agent's default applies).

>>> StopRequest("/w", run_id="r1", grace_s=5.0, by="orch stop by u@h").to_argv()
['stop', '--workdir', '/w', '--grace', '5.0', '--by', 'orch stop by u@h', '--run-id', 'r1']
>>> RunsRequest("/w").to_argv(), RunRequest("/w", run_id="r1", tail=30).to_argv()
(['runs', '--workdir', '/w', '--session', 'train'], ['runs', '--workdir', '/w', '--session', 'train', '--run-id', 'r1', '--tail', '30'])
>>> default(LaunchRequest, "settle_s"), default(EvidenceRequest, "log_lines")
(1.0, 200)
>>> StopRequest.read({"stopped": False, "run_id": "r", "state": "exited"}).state
'exited'
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Generic, TypeVar

from orchestrator.wire.answers import (
    EvidenceAnswer,
    LaunchAnswer,
    LogAnswer,
    RunsAnswer,
    RunStatus,
    StopAnswer,
)
from orchestrator.wire.model import HostDocument, HostProbe, Snapshot, check_schema

SESSION = "train"
"""The tmux session a run lives in when the inventory names none."""
GRACE_S = 60.0
"""How long ``stop`` (and ``launch --force``) waits before SIGKILL (s)."""
EXIT_LINE = "[orch] command exited with status"
"""How the wrapper's last log line starts (``... N at DATE``): written by ``agent/wrapper.py``, read
by ``detect/run.py``."""

A = TypeVar("A")


class AgentRequest(Generic[A]):
    """Any request here: :meth:`Target.call` runs what ``to_argv`` says and returns what
    :meth:`read` makes of the agent's document (an ``A``)."""

    __slots__ = ()
    command: ClassVar[str]
    """The agent's subcommand (the first word of :meth:`to_argv`)."""
    answer: ClassVar[type[Any]]
    """The answer's type (a :class:`~orchestrator.wire.model.Wire` class)."""
    versioned: ClassVar[bool] = False
    """The answer carries ``schema_version``; one newer than this orch's is refused."""

    def to_argv(self) -> list[str]:
        """The agent's argv, :attr:`command` first."""
        raise NotImplementedError

    @classmethod
    def read(cls, doc: dict[str, Any]) -> A:
        """The agent's JSON document as :attr:`answer` (unknown keys ignored).

        Raises:
            SchemaError, TypeError, ValueError: it is not one (the operator side turns them
                into ``AgentProtocolError``).
        """
        if cls.versioned:
            check_schema(doc)
        return cls.answer.from_dict(doc)  # type: ignore[no-any-return]


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
class LaunchRequest(AgentRequest[LaunchAnswer]):
    """``launch``: start ``cmd`` in tmux with the wrapper, tee and exit status.

    The run's variables never travel in argv (ps shows it): :meth:`Target.launch` sends them
    on stdin and adds ``--env-stdin``.
    """

    command = "launch"
    answer = LaunchAnswer

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
class StopRequest(AgentRequest[StopAnswer]):
    """``stop``: SIGINT, SIGTERM at half of ``grace_s``, SIGKILL at ``grace_s``."""

    command = "stop"
    answer = StopAnswer

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
class RunsRequest(AgentRequest[RunsAnswer]):
    """``runs``: every run of the workdir, oldest first."""

    command = "runs"
    answer = RunsAnswer
    workdir: str
    session: str = SESSION

    def to_argv(self) -> list[str]:
        return ["runs", "--workdir", self.workdir, "--session", self.session]


@dataclasses.dataclass(frozen=True, slots=True)
class RunRequest(AgentRequest[RunStatus]):
    """``runs --run-id`` (``None``: ``--current``): one run in detail, with ``tail`` log lines."""

    command = "runs"
    answer = RunStatus
    workdir: str
    session: str = SESSION
    run_id: str | None = None
    tail: int = 0

    def to_argv(self) -> list[str]:
        return [
            "runs",
            "--workdir",
            self.workdir,
            "--session",
            self.session,
            *(["--run-id", self.run_id] if self.run_id else ["--current"]),
            *_opt("--tail", self.tail or None),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class LogsRequest(AgentRequest[LogAnswer]):
    """``logs``: the last ``lines`` lines of a run's log, or (``follow``) one JSON line per chunk."""

    command = "logs"
    answer = LogAnswer

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
class EvidenceRequest(AgentRequest[EvidenceAnswer]):
    """``evidence``: a run's postmortem evidence, every read bounded by the counts here."""

    command = "evidence"
    answer = EvidenceAnswer

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


# --- observation: the in-container agent ------------------------------------------------------


def _gpu_argv(gpu_deadline_s: float | None, gpu_source: str | None) -> list[str]:
    return [*_opt("--gpu-deadline", gpu_deadline_s), *_opt("--gpu-source", gpu_source)]


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotRequest(AgentRequest[Snapshot]):
    """``snapshot``: one observation of the container (tmux, run, processes, GPUs, metrics).

    ``offset`` continues the log of ``run_id`` (``None``: the tail only); ``log_patterns`` is
    the JSON ``{metric: regex}`` of hosts.yaml; ``gpu_deadline_s`` ``None``: the agent's own
    (2 s, or ``$ORCH_AGENT_GPU_DEADLINE_S`` there).

    >>> SnapshotRequest("/w", target="ct", offset=10, run_id="r1").to_argv()
    ['snapshot', '--target', 'ct', '--workdir', '/w', '--session', 'train', '--offset', '10', '--run-id', 'r1']
    """

    command = "snapshot"
    answer = Snapshot
    versioned = True
    workdir: str
    session: str = SESSION
    target: str = "local"
    tail_lines: int = 8
    offset: int | None = None
    run_id: str | None = None
    log_patterns: str | None = None
    socket_name: str | None = None
    socket_path: str | None = None
    gpu_deadline_s: float | None = None
    gpu_source: str | None = None

    def to_argv(self) -> list[str]:
        return ["snapshot", *self._observe_argv()]

    def _observe_argv(self) -> list[str]:
        return [
            "--target",
            self.target,
            "--workdir",
            self.workdir,
            "--session",
            self.session,
            *_unless_default(self, "tail_lines", "--tail-lines"),
            *_gpu_argv(self.gpu_deadline_s, self.gpu_source),
            *_opt("--log-patterns", self.log_patterns),
            *_opt("--offset", self.offset),
            *_opt("--run-id", self.run_id),
            *_opt("--socket-name", self.socket_name),
            *_opt("--socket-path", self.socket_path),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class StreamRequest(SnapshotRequest):
    """``stream``: a :class:`SnapshotRequest`'s observation every ``interval_s`` on one line each,
    until the reader goes away (or ``count`` lines; 0: never). A line on stdin asks for one now,
    unless ``ignore_stdin``. ``read`` reads one line."""

    command = "stream"
    interval_s: float = 2.0
    count: int = 0
    ignore_stdin: bool = False

    def to_argv(self) -> list[str]:
        return [
            "stream",
            "--interval",
            str(self.interval_s),
            *self._observe_argv(),
            *_unless_default(self, "count", "--count"),
            *_on("--ignore-stdin", self.ignore_stdin),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class FactsRequest(AgentRequest[dict[str, Any]]):
    """``facts``: python, tmux, NVML driver and GPUs, free disk at ``workdir``, the sessions;
    with ``torch``, how long ``import torch`` and CUDA take (at most ``torch_timeout_s``).

    The answer stays the agent's mapping (``orch facts --json`` prints it as sent), its
    ``schema_version`` checked.

    >>> FactsRequest("/w", torch=True).to_argv()
    ['facts', '--workdir', '/w', '--torch']
    >>> FactsRequest.read({"schema_version": 1, "hostname": "ct"})["hostname"]
    'ct'
    """

    command = "facts"
    answer = dict
    versioned = True
    workdir: str
    torch: bool = False
    torch_timeout_s: float = 60.0
    socket_name: str | None = None
    socket_path: str | None = None
    gpu_deadline_s: float | None = None
    gpu_source: str | None = None

    def to_argv(self) -> list[str]:
        return [
            "facts",
            "--workdir",
            self.workdir,
            *_gpu_argv(self.gpu_deadline_s, self.gpu_source),
            *_on("--torch", self.torch),
            *_unless_default(self, "torch_timeout_s", "--torch-timeout"),
            *_opt("--socket-name", self.socket_name),
            *_opt("--socket-path", self.socket_path),
        ]

    @classmethod
    def read(cls, doc: dict[str, Any]) -> dict[str, Any]:
        check_schema(doc)
        return doc


# --- observation: the host's agent (Proxmox host, as root) --------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeRequest(AgentRequest[HostProbe]):
    """``probe`` on the host: ``pct status`` of ``vmids``, kernel events since ``since`` (Unix s;
    with ``previous_boot`` the boot before this one's too), GPU processes -> container.

    >>> ProbeRequest(host="pve1", vmids=(200, 201), since=5.0).to_argv()
    ['probe', '--host', 'pve1', '--vmid', '200', '--vmid', '201', '--since', '5.0']
    """

    command = "probe"
    answer = HostProbe
    versioned = True
    host: str = ""
    vmids: tuple[int, ...] = ()
    since: float | None = None
    timeout_s: float = 10.0
    proc_root: str | None = None
    previous_boot: bool = False
    gpu_deadline_s: float | None = None
    gpu_source: str | None = None

    def to_argv(self) -> list[str]:
        return [
            "probe",
            "--host",
            self.host,
            *[a for v in self.vmids for a in ("--vmid", str(v))],
            *_opt("--since", None if self.since is None else float(self.since)),
            *_on("--previous-boot", self.previous_boot),
            *_unless_default(self, "timeout_s", "--timeout"),
            *_opt("--proc-root", self.proc_root),
            *_gpu_argv(self.gpu_deadline_s, self.gpu_source),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class HostObserveRequest(AgentRequest[HostDocument]):
    """``host-observe``: one document for every container of ``containers`` (the JSON list of
    ``{name, vmid, workdir, session, log_patterns, run_id, offset}``), kernel lines after
    ``cursor`` (or since ``since``, Unix s); ``state`` keeps the containers' init PIDs.

    >>> HostObserveRequest("[]", host="pve1", state="/s", cursor="c1").to_argv()
    ['host-observe', '--host', 'pve1', '--containers', '[]', '--state', '/s', '--cursor', 'c1']
    """

    command = "host-observe"
    answer = HostDocument
    versioned = True
    containers: str
    host: str = ""
    since: float | None = None
    cursor: str | None = None
    timeout_s: float = 10.0
    state: str | None = None
    gpu_deadline_s: float | None = None
    gpu_source: str | None = None

    def to_argv(self) -> list[str]:
        return ["host-observe", *self._host_argv()]

    def _host_argv(self) -> list[str]:
        return [
            "--host",
            self.host,
            "--containers",
            self.containers,
            *_opt("--state", self.state),
            *_opt("--cursor", self.cursor),
            *_opt("--since", None if self.since is None else float(self.since)),
            *_unless_default(self, "timeout_s", "--timeout"),
            *_gpu_argv(self.gpu_deadline_s, self.gpu_source),
        ]


@dataclasses.dataclass(frozen=True, slots=True)
class HostStreamRequest(HostObserveRequest):
    """``host-stream``: a :class:`HostObserveRequest`'s document every ``interval_s`` over one
    channel (or ``count`` of them; 0: never); ``read`` reads one line."""

    command = "host-stream"
    interval_s: float = 2.0
    count: int = 0
    ignore_stdin: bool = False

    def to_argv(self) -> list[str]:
        return [
            "host-stream",
            *self._host_argv(),
            "--interval",
            str(self.interval_s),
            *_unless_default(self, "count", "--count"),
            *_on("--ignore-stdin", self.ignore_stdin),
        ]


REQUESTS: tuple[type[AgentRequest[Any]], ...] = (
    LaunchRequest,
    StopRequest,
    RunsRequest,
    RunRequest,
    LogsRequest,
    EvidenceRequest,
    SnapshotRequest,
    StreamRequest,
    FactsRequest,
    ProbeRequest,
    HostObserveRequest,
    HostStreamRequest,
)
"""Every request class (the protocol rule test holds each against the agent's parser)."""
