"""Host keys: the known_hosts entries for a host (hashed ones too), OpenSSH fingerprints, and
the one check that accepts a key only when known_hosts holds exactly it (never AutoAddPolicy).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import paramiko

from orchestrator.errors import (
    HostKeyChanged,
    HostKeyUnknown,
)
from orchestrator.transport.ssh_config import Endpoint


def fingerprint(key: Any) -> str:
    """OpenSSH's ``SHA256:`` fingerprint of a paramiko key (base64 without padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_entries(path: Path, name: str) -> list[tuple[int, str, str]]:
    """``(line number, key type, base64 key)`` of every known_hosts line matching ``name``.

    Hashed (``|1|``) entries are matched too; ``@revoked``/``@cert-authority`` lines are skipped.
    """
    found: list[tuple[int, str, str]] = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for lineno, line in enumerate(lines, start=1):
        fields = line.split()
        if len(fields) < 3 or line.lstrip().startswith(("#", "@")):
            continue
        for pattern in fields[0].split(","):
            if pattern.startswith("|1|"):
                salt = pattern.split("|")[2]
                hit = paramiko.HostKeys.hash_host(name, salt) == pattern
            else:
                hit = pattern == name
            if hit:
                found.append((lineno, fields[1], fields[2]))
                break
    return found


def check_host_key(ep: Endpoint, key: Any) -> None:
    """Accept ``key`` only when ``ep``'s known_hosts holds exactly it.

    Raises:
        HostKeyUnknown: no entry of this key type for the host.
        HostKeyChanged: an entry of this key type holds a different key.
    """
    entries = [e for e in known_entries(ep.known_hosts, ep.known_name) if e[1] == key.get_name()]
    if any(b64 == key.get_base64() for _, _, b64 in entries):
        return
    if entries:
        raise HostKeyChanged(
            ep.name, ep.address, ep.port, fingerprint(key), str(ep.known_hosts), entries[0][0]
        )
    raise HostKeyUnknown(ep.name, ep.address, ep.port, fingerprint(key))
