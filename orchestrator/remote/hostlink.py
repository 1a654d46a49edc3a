"""The operator's handle on a Proxmox host's observer (:mod:`orchestrator.agent.host`).

:class:`HostLink` runs ``agent host-observe`` (one document, for ``orch check``) or
``agent host-stream`` (one document per interval over ONE SSH channel, for ``watch`` and
``export``) on the host itself, not in a container. The agent goes to ``agent_dir`` on the
host (default ``/var/lib/orch``) by content hash, as into a container; its boot refuses to
run from a directory the SSH user does not own or that others may write (a planted bundle
would run as root on the host).

Which path a host's containers take (:func:`observe_path`): ``observe: container`` in
hosts.yaml, a host whose Python is older than 3.10 (learned once per process, when the
observer's boot says so) or the built-in ``local`` target keep the in-container agent;
every other host is observed from the host.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.inventory import ContainerConfig, HostConfig, Inventory
from orchestrator.errors import (
    AgentError,
    AgentProtocolError,
    CommandTimeout,
    OutputTooLarge,
    PythonTooOld,
    TransportError,
)
from orchestrator.remote import deploy
from orchestrator.remote.boot import HOST_BOOT, HOST_DIR_REFUSED
from orchestrator.remote.target import (
    MAX_DOC_BYTES,
    agent_argv,
    parse_answer,
    parse_document,
    read_reply,
    run_agent,
    too_large,
)
from orchestrator.transport.base import LineStream, Result, Transport
from orchestrator.wire.model import HostDocument
from orchestrator.wire.requests import HostObserveRequest, HostStreamRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ObservePath:
    """Where a container is observed from: ``host`` or ``container``, and why."""

    mode: str
    reason: str


_fallback: dict[HostConfig, str] = {}
_fallback_lock = threading.Lock()


def forced_to_containers(host: HostConfig, reason: str) -> None:
    """Remember (for this process) that ``host`` (as configured) cannot run the observer, and why."""
    with _fallback_lock:
        _fallback[host] = reason


def observe_path(inventory: Inventory, container: ContainerConfig) -> ObservePath:
    """Which path ``container`` takes now, and why (``orch doctor`` prints it).

    >>> from orchestrator.config.inventory import builtin_inventory
    >>> inv = builtin_inventory()
    >>> observe_path(inv, inv.container("local")).mode
    'container'
    """
    if container.is_local:
        return ObservePath("container", "local target: this machine, no Proxmox host")
    host = inventory.hosts[container.host]
    if host.observe == "container":
        return ObservePath("container", f"observe: container in hosts.yaml (host {host.name})")
    with _fallback_lock:
        why = _fallback.get(host)
    if why is not None:
        return ObservePath("container", why)
    how = "observe: host" if host.observe == "host" else "observe: auto"
    return ObservePath("host", f"{how}: one observer on {host.name} reads every container")


def host_groups(inventory: Inventory, names: Sequence[str]) -> dict[str, list[str]]:
    """The containers of ``names`` observed from their host, by host (in the order given)."""
    out: dict[str, list[str]] = {}
    for n in names:
        c = inventory.container(n)
        if observe_path(inventory, c).mode == "host":
            out.setdefault(c.host, []).append(n)
    return out


class HostStreamLost(Exception):
    """One host stream is over; the message says why."""


class HostLink:
    """One Proxmox host's observer, for the containers ``names`` of the inventory.

    Args:
        inventory: the loaded hosts.yaml.
        host: a key of ``inventory.hosts``.
        names: its containers to observe (hosts.yaml names).
        transport: use this transport to the host instead of the pooled one.
    """

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        names: Sequence[str],
        *,
        transport: Transport | None = None,
        bundle: deploy.Bundle | None = None,
    ) -> None:
        self.inventory = inventory
        self.host = inventory.hosts[host]
        self.names = list(names)
        self._transport = transport
        self._bundle = bundle
        self.resume: dict[str, tuple[str, int]] = {}
        self.cursor: str | None = None
        self.since: float | None = None
        self.gpu_deadline_s: float | None = None

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            from orchestrator.transport.connect import host_transport

            self._transport = host_transport(self.inventory, self.host.name)
        return self._transport

    def specs(self) -> str:
        """The ``--containers`` JSON: each container and where its log continues."""
        out = []
        for n in self.names:
            c = self.inventory.container(n)
            spec: dict[str, object] = {
                "name": n,
                "vmid": c.vmid,
                "workdir": c.workdir,
                "session": c.session,
            }
            if c.log_patterns or c.log_format:
                spec["log_patterns"] = c.agent_patterns()
            if n in self.resume:
                spec["run_id"], spec["offset"] = self.resume[n]
            out.append(spec)
        return json.dumps(out, separators=(",", ":"))

    def _request(
        self, cls: type[HostObserveRequest] = HostObserveRequest, **more: Any
    ) -> HostObserveRequest:
        """``host-observe`` (or ``cls``, with ``more`` fields) from where the last document ended."""
        return cls(
            self.specs(),
            host=self.host.name,
            state=f"{self.host.agent_dir.rstrip('/')}/.orch/containers.json",
            cursor=self.cursor or None,
            since=self.since,
            gpu_deadline_s=self.gpu_deadline_s,
            **more,
        )

    def remember(self, doc: HostDocument) -> None:
        """Continue where ``doc`` ended: each run's log offset, the kernel cursor."""
        for name, snap in doc.containers.items():
            if snap.run is not None:
                self.resume[name] = (snap.run.run_id, snap.run.log_offset)
        if doc.kernel_cursor:
            self.cursor = doc.kernel_cursor
        for e in doc.kernel_events:
            if e.at is not None and (self.since is None or e.at > self.since):
                self.since = e.at

    def _run(self, args: Sequence[str], timeout: float) -> Result:
        h = self.host
        res = run_agent(
            self.transport,
            h.agent_dir,
            h.host_python,
            args,
            bundle=self._bundle,
            timeout=timeout,
            host=True,
            boot=HOST_BOOT,
        )
        if res.exit_status == HOST_DIR_REFUSED:
            raise AgentError(
                f"{h.name}: {res.err.strip()[-300:]}; fix its owner and mode "
                f"(chown root; chmod go-w) or set agent_dir: in hosts.yaml"
            )
        return res

    def observe(self, timeout: float = 30.0) -> HostDocument:
        """One document now (``orch check``).

        Raises:
            AgentError: the observer could not run (the message says why; a host whose
                Python is too old is remembered: :func:`observe_path` then says container).
            AgentProtocolError: its answer is not a document. TransportError, CommandTimeout.
        """
        try:
            res = self._run(self._request().to_argv(), timeout)
        except AgentError as exc:
            self._note_old_python(exc)
            raise
        if not res.ok and not res.stdout.strip():
            raise AgentError(
                f"{self.host.name}: host observer failed (exit {res.exit_status}): "
                f"{res.err.strip()[-400:] or 'no output'}"
            )
        doc = read_reply(self.host.name, HostObserveRequest, parse_answer(self.host.name, res))
        self.remember(doc)
        return doc

    def _note_old_python(self, exc: AgentError) -> None:
        text = str(exc)
        if isinstance(exc, PythonTooOld) or "is too old" in text or "not found" in text:
            forced_to_containers(self.host, f"the host cannot run the observer: {text}")

    def open_stream(self, interval_s: float) -> LineStream:
        """Start ``agent host-stream`` on the host (deploying it when needed)."""
        h = self.host
        bundle = self._bundle or deploy.build_bundle()
        try:
            bundle_dir = deploy.ensure_agent(
                self.transport, h.agent_dir, h.host_python, bundle=bundle, host=True
            )
        except AgentError as exc:
            self._note_old_python(exc)
            raise
        req = self._request(HostStreamRequest, interval_s=interval_s)
        argv = agent_argv(h.host_python, bundle_dir, req.to_argv(), boot=HOST_BOOT)
        return self.transport.stream(argv, max_line_bytes=MAX_DOC_BYTES)

    def stream_once(
        self, interval_s: float, *, stall_s: float | None = None
    ) -> Iterator[HostDocument]:
        """Documents every ``interval_s`` over ONE channel, continuing each log and the kernel
        log where the previous connection stopped. A line that is not a document is skipped
        (logged). No line within ``stall_s`` (3 intervals + 20 s) ends the connection.

        Raises:
            HostStreamLost: always, when this connection is over (the reason is its message).
        """
        stall = stall_s if stall_s is not None else 3 * interval_s + 20.0
        reason = "host stream ended"
        stream: LineStream | None = None
        try:
            stream = self.open_stream(interval_s)
            while True:
                try:
                    line = stream.readline(timeout=stall)
                except OutputTooLarge:
                    log.warning("%s: %s", self.host.name, too_large())
                    continue
                if line is None:
                    tail = stream.stderr_tail.decode("utf-8", "replace").strip()[-300:]
                    reason = f"host observer ended (exit {stream.exit_status})" + (
                        f": {tail}" if tail else ""
                    )
                    if stream.exit_status == HOST_DIR_REFUSED:
                        reason += "; fix it or set agent_dir: in hosts.yaml"
                    break
                try:
                    doc = parse_host_document(self.host.name, parse_document(self.host.name, line))
                except AgentProtocolError as exc:
                    log.warning("%s: %s", self.host.name, exc)
                    continue
                self.remember(doc)
                yield doc
        except CommandTimeout:
            reason = f"no document from the host observer within {stall:.0f} s"
        except (TransportError, AgentError) as exc:
            reason = str(exc)
        finally:
            if stream is not None:
                stream.close()
        raise HostStreamLost(reason)


def parse_host_document(host: str, doc: Mapping[str, object]) -> HostDocument:
    """A :class:`HostDocument` from the observer's JSON; ``AgentProtocolError`` when it is not one.

    >>> parse_host_document("pve1", {"schema_version": 1, "host": "pve1", "taken_at": 5.0}).host
    'pve1'
    >>> parse_host_document("pve1", {"schema_version": 1, "host": "pve1"})
    Traceback (most recent call last):
    ...
    orchestrator.errors.AgentProtocolError: pve1: agent protocol error: HostDocument: HostDocument.__init__() missing 1 required positional argument: 'taken_at'
    """
    return read_reply(host, HostStreamRequest, dict(doc))
