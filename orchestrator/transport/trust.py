"""``orch trust HOST``: fetch a host's SSH key (no auth), show its fingerprint, record it.

The key is compared with the host's known_hosts first: already known -> nothing to
do; a *different* key of the same type -> refused (:class:`HostKeyChanged`) until
the operator removes the old line by hand; unknown -> appended on confirmation as
``[address]:port keytype base64`` (file created 0600, its directory 0700).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.config.inventory import HostConfig
from orchestrator.errors import HostKeyChanged, HostKeyUnknown
from orchestrator.transport.known_hosts import check_host_key, fingerprint, known_entries
from orchestrator.transport.ssh import handshake, jump_transport, open_socket
from orchestrator.transport.ssh_config import Endpoint, resolve

KNOWN, UNKNOWN, CHANGED = "known", "unknown", "changed"


@dataclass(frozen=True, slots=True)
class ScannedKey:
    """What a host presented, and how it compares with known_hosts (``status``)."""

    host: str
    address: str
    port: int
    key_type: str
    key_base64: str
    fingerprint: str
    known_hosts: str
    known_name: str
    status: str  # known | unknown | changed
    line: int | None  # the known_hosts line of the old key when changed

    @property
    def known_hosts_line(self) -> str:
        return f"{self.known_name} {self.key_type} {self.key_base64}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def scan(host: HostConfig, *, ssh_config_path: Path | None = None) -> ScannedKey:
    """Connect to ``host`` (through its ProxyJump when set), read its host key, disconnect.

    No authentication happens. Raises HostUnreachable when the host cannot be reached.
    """
    return scan_endpoint(resolve(host, ssh_config_path))


def scan_endpoint(ep: Endpoint) -> ScannedKey:
    """:func:`scan` of a resolved endpoint (a jump hop's too: its earlier hops must be known,
    they are connected to and authenticated)."""
    jump = jump_transport(ep)
    try:
        transport = handshake(ep, open_socket(ep, jump))
        try:
            key = transport.get_remote_server_key()
        finally:
            transport.close()
    finally:
        if jump is not None:
            jump.close()
    status, line = KNOWN, None
    try:
        check_host_key(ep, key)
    except HostKeyChanged as exc:
        status, line = CHANGED, exc.line
    except HostKeyUnknown:
        status = UNKNOWN
    return ScannedKey(
        host=ep.name,
        address=ep.address,
        port=ep.port,
        key_type=key.get_name(),
        key_base64=key.get_base64(),
        fingerprint=fingerprint(key),
        known_hosts=str(ep.known_hosts),
        known_name=ep.known_name,
        status=status,
        line=line,
    )


def record(scanned: ScannedKey) -> Path:
    """Append ``scanned``'s key to its known_hosts (created 0600, parent 0700).

    Raises:
        HostKeyChanged: the file holds a different key of this type for the host (never
            overwritten: the operator removes the old line after checking why it changed).
    """
    path = Path(scanned.known_hosts)
    if scanned.status == CHANGED or any(
        t == scanned.key_type and b != scanned.key_base64
        for _, t, b in known_entries(path, scanned.known_name)
    ):
        raise HostKeyChanged(
            scanned.host,
            scanned.address,
            scanned.port,
            scanned.fingerprint,
            str(path),
            scanned.line,
        )
    if any(b == scanned.key_base64 for _, _, b in known_entries(path, scanned.known_name)):
        return path
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        with contextlib.suppress(OSError):
            if path.stat().st_size and not path.read_bytes().endswith(b"\n"):
                fh.write("\n")
        fh.write(scanned.known_hosts_line + "\n")
    return path
