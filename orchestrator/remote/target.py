"""The operator's handle on a container (:class:`Target`) and a Proxmox host (:class:`Host`).

Every call deploys the agent bundle if needed (:func:`orchestrator.remote.deploy.ensure_agent`),
runs ``python3 -m orchestrator.agent <command>`` through the container's
transport and reads its JSON defensively: garbage, truncated JSON, a future
``schema_version`` or an oversized answer raise
:class:`~orchestrator.errors.AgentProtocolError`, never a crash, and no answer is
held in memory beyond ``MAX_DOC_BYTES``.

:meth:`Target.stream_once` iterates the snapshots of one long-lived agent, resuming the
log at the last offset so no line is lost or repeated; the monitor
(:mod:`orchestrator.monitor.observe`) reconnects it with the one reconnect policy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from orchestrator.config.inventory import Inventory
from orchestrator.errors import (
    AgentError,
    AgentProtocolError,
    AgentRefused,
    CommandTimeout,
    ContainerNotFound,
    ContainerNotRunning,
    OutputTooLarge,
    TransportError,
)
from orchestrator.remote import deploy
from orchestrator.remote.boot import BOOT as _BOOT
from orchestrator.remote.boot import BUNDLE_MISSING_EXIT, HOST_BOOT, HOST_DIR_REFUSED
from orchestrator.transport.base import LineStream, Result, Transport
from orchestrator.wire.answers import LaunchAnswer, LogAnswer
from orchestrator.wire.model import HostProbe, SchemaError, Snapshot
from orchestrator.wire.requests import (
    AgentRequest,
    FactsRequest,
    LaunchRequest,
    LogsRequest,
    ProbeRequest,
    SnapshotRequest,
    StreamRequest,
)

log = logging.getLogger(__name__)
A = TypeVar("A")

MAX_DOC_BYTES = 8 << 20


class StreamLost(Exception):
    """One agent stream is over; ``marker`` is the snapshot that records the gap (its reason
    is in ``marker.errors``)."""

    def __init__(self, marker: Snapshot) -> None:
        super().__init__("; ".join(marker.errors) or "agent stream ended")
        self.marker = marker


def parse_document(target: str, data: bytes | str, limit: int = MAX_DOC_BYTES) -> dict[str, Any]:
    """The one JSON object an agent command printed.

    Raises:
        AgentProtocolError: empty, oversized, truncated, not JSON or not an object.

    >>> parse_document("ct", b'{"a": 1}\\n')
    {'a': 1}
    >>> parse_document("ct", b'{"a": [1, 2')
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentProtocolError: ct: agent protocol error: truncated JSON (11 bytes)
    >>> parse_document("ct", b"Traceback (most recent call last):")
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentProtocolError: ct: agent protocol error: not JSON: 'Traceback (most recent call last):'
    """
    if len(data) > limit:
        raise AgentProtocolError(target, f"{too_large(limit)}: {len(data)} bytes")
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = text.strip()
    if not text:
        raise AgentProtocolError(target, "empty answer")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        if text[:1] in "{[" and (exc.pos >= len(text) - 1 or text[-1:] not in "}]"):
            raise AgentProtocolError(target, f"truncated JSON ({len(text)} bytes)") from None
        raise AgentProtocolError(target, f"not JSON: {text[:80]!r}") from None
    except RecursionError:
        raise AgentProtocolError(target, "JSON nested too deeply") from None
    if not isinstance(doc, dict):
        raise AgentProtocolError(target, f"expected a JSON object, got {type(doc).__name__}")
    return doc


def read_reply(target: str, request: type[AgentRequest[A]], doc: dict[str, Any]) -> A:
    """The answer of a ``request`` in the agent's JSON document ``doc`` (read once, by the
    request class's ``read``: unknown keys are ignored).

    Raises:
        AgentRefused: the agent said no (``{"ok": false, "error": KIND, "message": ...}``).
        AgentProtocolError: ``doc`` is not that answer (a field of the wrong type, a newer
            ``schema_version``).

    >>> from orchestrator.wire.requests import StopRequest
    >>> read_reply("ct", StopRequest, {"stopped": False, "run_id": "r", "state": "exited"}).state
    'exited'
    >>> read_reply("ct", StopRequest, {"stopped": "x"})
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentProtocolError: ct: agent protocol error: stopped: expected true/false, got 'x'
    >>> read_reply("ct", StopRequest, {"ok": False, "error": "no-run", "message": "no runs in /w"})
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentRefused: ct: stop: no runs in /w
    """
    if doc.get("ok") is False:
        raise AgentRefused(target, request.command, doc)
    try:
        return request.read(doc)
    except (SchemaError, TypeError, ValueError) as exc:
        raise AgentProtocolError(target, str(exc)[:300]) from None


def too_large(limit: int = MAX_DOC_BYTES) -> str:
    """The protocol-error detail of an answer cut at ``limit`` bytes by the transport.

    >>> too_large(), too_large(1000)
    ('answer larger than 8 MiB (orch stopped reading it)', 'answer larger than 1000 bytes (orch stopped reading it)')
    """
    size = f"{limit >> 20} MiB" if limit and limit % (1 << 20) == 0 else f"{limit} bytes"
    return f"answer larger than {size} (orch stopped reading it)"


def parse_answer(target: str, res: Result, limit: int = MAX_DOC_BYTES) -> dict[str, Any]:
    """:func:`parse_document` of an agent command's Result, run with ``max_output_bytes=limit``.

    >>> parse_answer("ct", Result(None, b"x" * 8, b"", truncated=True), limit=8)
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentProtocolError: ct: agent protocol error: answer larger than 8 bytes (orch stopped reading it)
    """
    if res.truncated:
        raise AgentProtocolError(target, too_large(limit))
    return parse_document(target, res.stdout, limit)


def parse_snapshot(target: str, data: bytes | str, limit: int = MAX_DOC_BYTES) -> Snapshot:
    """A :class:`Snapshot` from one agent line; ``AgentProtocolError`` when it is not one.

    >>> parse_snapshot("ct", '{"schema_version": 1, "target": "ct", "taken_at": 5.0}').taken_at
    5.0
    >>> parse_snapshot("ct", '{"schema_version": 7, "target": "ct", "taken_at": 5.0}')
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentProtocolError: ct: agent protocol error: schema_version 7 is newer than this orch understands (1); upgrade orch
    """
    return read_reply(target, StreamRequest, parse_document(target, data, limit))


def container_down(
    target: str, exc: ContainerNotRunning | ContainerNotFound, at: float
) -> Snapshot:
    """The snapshot of a container ``pct`` refused to enter: the host answered, so it is
    reachable; ``container_status`` is ``stopped`` (ContainerNotRunning) or ``missing``
    (ContainerNotFound); pct's message is the error. The ``container-stopped`` detector
    reports it: neither unreachable nor a dead run.

    >>> s = container_down("ct200", ContainerNotRunning("pve1", 200), 5.0)
    >>> s.reachable, s.container_status, s.errors[0][:36]
    (True, 'stopped', 'pve1: container 200 is not running; ')
    >>> container_down("ct201", ContainerNotFound("pve1", 201), 5.0).container_status
    'missing'
    """
    status = "stopped" if isinstance(exc, ContainerNotRunning) else "missing"
    return Snapshot(target, at, reachable=True, container_status=status, errors=(str(exc),))


_NEVER_RAN = ("No module named 'orchestrator", "SyntaxError: ", "Failed to exec")


def agent_never_ran(res: Result) -> bool:
    """True when a failed agent call failed before the agent itself ran.

    That is: no bundle (the boot's exit 97, or a missing module), no python
    (126/127), or a python too old to parse the agent. Then deploying and
    running again is safe even for commands that change state.

    >>> agent_never_ran(Result(exit_status=97, stdout=b"", stderr=b""))
    True
    >>> agent_never_ran(Result(exit_status=1, stdout=b"", stderr=b"ValueError: x"))
    False
    """
    if res.ok or res.stdout.strip():
        return False
    if res.exit_status in (BUNDLE_MISSING_EXIT, 126, 127):
        return True
    return any(s in res.err for s in _NEVER_RAN)


def run_agent(
    transport: Transport,
    workdir: str,
    python: str,
    args: Sequence[str],
    *,
    bundle: deploy.Bundle | None = None,
    timeout: float = 30.0,
    max_output_bytes: int | None = MAX_DOC_BYTES,
    stdin: bytes | None = None,
    host: bool = False,
    boot: str | None = None,
) -> Result:
    """Run one agent command from the bundle, deploying it only when needed.

    The first call of a process runs the agent straight away (its boot checks the
    bundle's marker) instead of first asking whether the bundle is there: one
    interpreter start and ``pct exec`` less per one-shot command. When the agent
    never ran (:func:`agent_never_ran`), :func:`deploy.ensure_agent` checks python
    and sends the bundle (raising its clear ``AgentError``), and the command runs
    once more. Raises TransportError/CommandTimeout from the transport. stdout is cut
    at ``max_output_bytes`` (``Result.truncated``; :func:`parse_answer` reports it).
    ``stdin`` goes to the agent (both times: a boot that exits 97 reads none of it); what
    must not show in ``ps`` travels there, never in ``args``. ``host``: ``transport`` reaches
    a Proxmox host (the probe), for the advice when its python is too old. ``boot`` replaces
    the interpreter's boot script (:data:`HOST_BOOT` checks more, and asks the resident
    observer first: :mod:`orchestrator.remote.boot`).
    """
    bundle = bundle or deploy.build_bundle()
    known = deploy.deployed(transport, workdir, python, bundle)
    bundle_dir = known or deploy.bundle_path(workdir, bundle)
    res = transport.run(
        agent_argv(python, bundle_dir, args, boot=boot),
        timeout=timeout,
        max_output_bytes=max_output_bytes,
        stdin=stdin,
    )
    if agent_never_ran(res):
        log.info(
            "%s: agent not ready in %s (exit %s); deploying",
            transport.name,
            bundle_dir,
            res.exit_status,
        )
        deploy.forget(transport, workdir)
        bundle_dir = deploy.ensure_agent(transport, workdir, python, bundle=bundle, host=host)
        res = transport.run(
            agent_argv(python, bundle_dir, args, boot=boot),
            timeout=timeout,
            max_output_bytes=max_output_bytes,
            stdin=stdin,
        )
    elif known is None and (res.ok or res.stdout.strip()):
        deploy.remember(transport, workdir, python, bundle)
    return res


def agent_argv(
    python: str, bundle_dir: str, args: Sequence[str], *, boot: str | None = None
) -> list[str]:
    """The argv that runs an agent command from ``bundle_dir``.

    ``-S`` (no site-packages) and the bundle first on ``sys.path``: the agent runs
    the bundle's own code, libtmux and pynvml, never copies that happen to sit in
    the container's site-packages or in the current directory (which ``-m`` would
    put first).

    >>> agent_argv("python3", "/w/.orch/agent-1", ["snapshot"])[:3]
    ['python3', '-S', '-c']
    >>> agent_argv("python3", "/w/.orch/agent-1", ["snapshot"])[4:]
    ['/w/.orch/agent-1', 'snapshot']
    """
    return [python, "-S", "-c", boot or _BOOT, bundle_dir, *args]


class Target:
    """One container of the inventory, seen through its agent.

    Args:
        inventory: the loaded hosts.yaml.
        name: the container's name (``local`` for this machine).
        transport: use this transport instead of ``transport_for(inventory, name)``.
        bundle: the agent bundle to deploy (default: :func:`deploy.build_bundle`).
    """

    def __init__(
        self,
        inventory: Inventory,
        name: str,
        *,
        transport: Transport | None = None,
        bundle: deploy.Bundle | None = None,
    ) -> None:
        self.inventory = inventory
        self.name = name
        self.container = inventory.container(name)
        self._transport = transport
        self._bundle = bundle
        self.gpu_source: str | None = None
        self.gpu_deadline_s: float | None = None  # None: the agent's default (2 s, or its env)
        self.run_id: str | None = None
        self.offset: int | None = None

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            from orchestrator.transport.connect import transport_for

            self._transport = transport_for(self.inventory, self.name)
        return self._transport

    def bundle_dir(self) -> str:
        """Deploy the agent if needed; its directory in the container."""
        return deploy.ensure_agent(
            self.transport, self.container.workdir, self.container.python, bundle=self._bundle
        )

    def _argv(self, bundle_dir: str, args: Sequence[str]) -> list[str]:
        return agent_argv(self.container.python, bundle_dir, args)

    def _observe_request(
        self,
        run_id: str | None,
        offset: int | None,
        cls: type[SnapshotRequest] = SnapshotRequest,
        **more: Any,
    ) -> SnapshotRequest:
        """What ``snapshot`` (or ``cls``, with ``more`` fields) observes: this container, its log
        from ``offset`` of ``run_id`` (``None``: the tail only)."""
        c = self.container
        patterns = c.agent_patterns() if c.log_patterns or c.log_format else None
        return cls(
            c.workdir,
            c.session,
            target=self.name,
            offset=offset,
            run_id=run_id if offset is not None and run_id else None,
            log_patterns=None if patterns is None else json.dumps(patterns),
            gpu_deadline_s=self.gpu_deadline_s,
            gpu_source=self.gpu_source or None,
            **more,
        )

    def agent(
        self, args: Sequence[str], timeout: float = 30.0, *, stdin: bytes | None = None
    ) -> dict[str, Any]:
        """Run one agent command (``stdin`` its input) and return its JSON document.

        A non-zero exit with a JSON document (the agent's own error report) is
        returned as data; one without is an :class:`AgentError` with stderr's tail.
        The bundle is sent when missing (also when it vanished): :func:`run_agent`.
        """
        c = self.container
        res = run_agent(
            self.transport,
            c.workdir,
            c.python,
            args,
            bundle=self._bundle,
            timeout=timeout,
            stdin=stdin,
        )
        if res.ok or res.stdout.strip():
            return parse_answer(self.name, res)
        tail = res.err.strip()[-400:] or "no output"
        raise AgentError(
            f"{self.name}: agent {args[0] if args else ''} failed (exit {res.exit_status}): {tail}"
        )

    def call(self, request: AgentRequest[A], timeout: float = 30.0) -> A:
        """Run one typed agent command (:mod:`orchestrator.wire.requests`); its answer.

        Raises:
            AgentRefused: the agent said no (its error document; ``kind`` says what).
            AgentProtocolError: the answer is not the request's answer type.
            AgentError, TransportError, CommandTimeout: as :meth:`agent`.
        """
        return read_reply(self.name, type(request), self.agent(request.to_argv(), timeout=timeout))

    def launch(self, request: LaunchRequest, env: dict[str, str], timeout: float) -> LaunchAnswer:
        """``launch``; the run's variables go over stdin into its 0600 env file (argv shows in ps)."""
        argv = dataclasses.replace(request, env_stdin=True).to_argv()
        doc = self.agent(argv, timeout=timeout, stdin=json.dumps({"env": env}).encode())
        return read_reply(self.name, LaunchRequest, doc)

    def follow(self, request: LogsRequest) -> Iterator[LogAnswer]:
        """``logs -f`` (``request.follow`` set here): one answer per chunk, the last with
        ``end``; closing the iterator ends the remote command. Raises as :meth:`call`."""
        argv = dataclasses.replace(request, follow=True).to_argv()
        with self.transport.stream(self._argv(self.bundle_dir(), argv)) as stream:
            for line in stream:
                yield read_reply(self.name, LogsRequest, parse_document(self.name, line))

    def facts(self, *, torch: bool = False, timeout: float = 90.0) -> dict[str, Any]:
        """Python, tmux, NVML driver + GPU inventory, free disk, sessions (torch when asked)."""
        req = FactsRequest(
            self.container.workdir,
            torch=torch,
            gpu_deadline_s=self.gpu_deadline_s,
            gpu_source=self.gpu_source or None,
        )
        return self.call(req, timeout=timeout)

    def snapshot(
        self, offset: int | None = None, *, run_id: str | None = None, timeout: float = 30.0
    ) -> Snapshot:
        """One observation. ``offset`` continues the log of ``run_id`` (``None``: tail only).

        A container pct says is stopped or missing gives :func:`container_down`'s snapshot.
        """
        try:
            snap = self._own(self.call(self._observe_request(run_id, offset), timeout=timeout))
        except (ContainerNotRunning, ContainerNotFound) as exc:
            return container_down(self.name, exc, time.time())
        self._remember(snap)
        return snap

    def _own(self, snap: Snapshot) -> Snapshot:
        """``snap`` with this container's vmid (host-side events are matched by it)."""
        vmid = self.container.vmid
        return snap if vmid is None or snap.vmid == vmid else dataclasses.replace(snap, vmid=vmid)

    def _remember(self, snap: Snapshot) -> None:
        if snap.run is not None:
            self.run_id, self.offset = snap.run.run_id, snap.run.log_offset

    def open_stream(self, interval_s: float) -> LineStream:
        """Start ``agent stream`` (resuming at the remembered offset); the raw line stream."""
        req = self._observe_request(self.run_id, self.offset, StreamRequest, interval_s=interval_s)
        argv = self._argv(self.bundle_dir(), req.to_argv())
        return self.transport.stream(argv, max_line_bytes=MAX_DOC_BYTES)

    def stream_once(
        self, interval_s: float | None = None, *, stall_s: float | None = None
    ) -> Iterator[Snapshot]:
        """Snapshots every ``interval_s`` (default: the container's ``poll_interval_s``) over ONE
        long-lived ``agent stream``, resuming the log at the remembered offset.

        A line that is not a snapshot yields a snapshot whose ``errors`` start with
        ``agent-protocol-error:`` and the stream goes on. No line within ``stall_s``
        (default 3 intervals + 20 s) counts as a dropped connection. Closing the iterator
        closes the remote agent. Reconnecting is the monitor's
        (:func:`orchestrator.monitor.observe.stream`, one policy for every caller).

        Raises:
            StreamLost: always, when this connection is over: its ``marker`` is the snapshot
                to record for the gap (``Snapshot.unreachable``, or :func:`container_down`
                while pct says the container is stopped or missing).
        """
        interval = interval_s if interval_s is not None else self.container.poll_interval_s
        stall = stall_s if stall_s is not None else 3 * interval + 20.0
        reason = "agent stream ended"
        down: Snapshot | None = None
        stream: LineStream | None = None
        try:
            stream = self.open_stream(interval)
            while True:
                try:
                    line = stream.readline(timeout=stall)
                except OutputTooLarge:  # the line was dropped; the stream goes on
                    yield Snapshot(
                        target=self.name,
                        taken_at=time.time(),
                        errors=(f"agent-protocol-error: {too_large()}",),
                    )
                    continue
                if line is None:
                    tail_text = stream.stderr_tail.decode("utf-8", "replace").strip()[-300:]
                    reason = f"agent stream ended (exit {stream.exit_status})" + (
                        f": {tail_text}" if tail_text else ""
                    )
                    break
                try:
                    snap = self._own(parse_snapshot(self.name, line))
                except AgentProtocolError as exc:
                    yield Snapshot(
                        target=self.name,
                        taken_at=time.time(),
                        errors=(f"agent-protocol-error: {exc.detail}",),
                    )
                    continue
                self._remember(snap)
                yield snap
        except CommandTimeout:
            reason = f"no snapshot from the agent within {stall:.0f} s"
        except (TransportError, AgentError) as exc:
            reason = str(exc)
        except (ContainerNotRunning, ContainerNotFound) as exc:
            reason, down = str(exc), container_down(self.name, exc, time.time())
        finally:
            if stream is not None:
                stream.close()
        raise StreamLost(down or Snapshot.unreachable(self.name, time.time(), reason))


class Host:
    """A Proxmox host of the inventory, probed with the agent's ``probe`` command.

    The bundle goes to ``<agent_dir>/.orch/`` on the host (hosts.yaml ``agent_dir``, default
    ``/var/lib/orch``; the boot refuses a directory others may write: :data:`HOST_BOOT`).
    """

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        *,
        transport: Transport | None = None,
        workdir: str | None = None,
        python: str | None = None,
    ) -> None:
        self.inventory = inventory
        self.name = host
        self._transport = transport
        cfg = inventory.hosts.get(host)
        self.workdir = workdir or (cfg.agent_dir if cfg else "/var/lib/orch")
        self.python = python or (cfg.host_python if cfg else "python3")

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            from orchestrator.transport.connect import host_transport

            self._transport = host_transport(self.inventory, self.name)
        return self._transport

    def vmids(self) -> list[int]:
        """The vmids of the inventory's containers on this host."""
        return sorted(
            {
                c.vmid
                for c in self.inventory.containers.values()
                if c.host == self.name and c.vmid is not None
            }
        )

    def probe(
        self, since: float | None = None, *, timeout: float = 60.0, previous_boot: bool = False
    ) -> HostProbe:
        """``pct status``, kernel events since ``since`` (Unix s; with ``previous_boot`` those of
        the boot before this one too), GPU processes -> container."""
        req = ProbeRequest(
            host=self.name, vmids=tuple(self.vmids()), since=since, previous_boot=previous_boot
        )
        res = run_agent(
            self.transport,
            self.workdir,
            self.python,
            req.to_argv(),
            timeout=timeout,
            host=True,
            boot=HOST_BOOT,
        )
        if res.exit_status == HOST_DIR_REFUSED:
            raise AgentError(f"{self.name}: {res.err.strip()[-300:]}")
        if not res.ok and not res.stdout.strip():
            raise AgentError(
                f"{self.name}: host probe failed (exit {res.exit_status}): "
                f"{res.err.strip()[-400:] or 'no output'}"
            )
        return read_reply(self.name, ProbeRequest, parse_answer(self.name, res))
