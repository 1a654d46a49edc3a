"""Host keys: the known_hosts entries for a host (hashed ones too), OpenSSH fingerprints, and
the one check that accepts a key only when known_hosts holds exactly it (never AutoAddPolicy).

Read as OpenSSH reads it (openssh-portable ``hostfile.c``, V_9_7_P1-1395-g0ef0f5a83:
``check_markers``, ``check_hostkeys_by_key_or_type``, ``check_key_not_revoked``):

- a line may start with one marker: ``@cert-authority`` (the key signs host certificates) or
  ``@revoked`` (the key must never be accepted); two markers or an unknown one make the line
  invalid (``MRK_ERROR``: skipped);
- a plain host key (paramiko presents no certificate) is checked against the unmarked lines
  only: a ``@cert-authority`` line is never a host key, so it neither accepts a key nor makes
  it "changed";
- whatever those say, a key equal to a ``@revoked`` line of the host is refused
  (``HOST_REVOKED``);
- host patterns: comma-separated, ``*`` and ``?`` wildcards, ``!`` negation (a negated match
  rules the line out: ``match_hostname`` in ``match.c``), ``|1|`` hashed names.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import (
    HostKeyChanged,
    HostKeyRevoked,
    HostKeyUnknown,
)
from orchestrator.transport.ssh_config import Endpoint
from orchestrator.transport.sshlib import paramiko

CA_MARKER, REVOKE_MARKER = "@cert-authority", "@revoked"


@dataclass(frozen=True, slots=True)
class Entry:
    """One known_hosts line for a host: its number, marker (``""``, ``@cert-authority``,
    ``@revoked``), key type and base64 key."""

    line: int
    marker: str
    key_type: str
    key: str


def fingerprint(key: Any) -> str:
    """OpenSSH's ``SHA256:`` fingerprint of a paramiko key (base64 without padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _wildcard(pattern: str) -> re.Pattern[str]:
    """OpenSSH's ``match_pattern``: ``*`` and ``?`` only (``[`` is a literal: ``[host]:port``)."""
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    )


def host_matches(patterns: str, name: str) -> bool:
    """Whether a known_hosts host field names ``name`` (``match_hostname``: any positive
    pattern matches and no negated one does).

    >>> host_matches("pve1,10.0.0.1", "pve1"), host_matches("*.lab,!bad.lab", "bad.lab")
    (True, False)
    >>> host_matches("[127.0.0.1]:22?2", "[127.0.0.1]:2202"), host_matches("*", "x")
    (True, True)
    """
    hit = False
    for pattern in patterns.split(","):
        negate = pattern.startswith("!")
        pattern = pattern[1:] if negate else pattern
        if pattern.startswith("|1|"):
            parts = pattern.split("|")
            ok = len(parts) > 2 and paramiko.HostKeys.hash_host(name, parts[2]) == pattern
        else:
            ok = _wildcard(pattern).fullmatch(name.lower()) is not None
        if ok and negate:
            return False
        hit = hit or ok
    return hit


def parse_line(text: str) -> tuple[str, list[str]] | None:
    """(marker, the other fields) of one known_hosts line; ``None``: blank, a comment or
    invalid (two markers, an unknown one: OpenSSH's ``MRK_ERROR``).

    >>> parse_line("@revoked * ssh-ed25519 AAAA")
    ('@revoked', ['*', 'ssh-ed25519', 'AAAA'])
    >>> parse_line("@revoked @cert-authority * ssh-ed25519 AAAA") is None, parse_line("# x")
    (True, None)
    """
    fields = text.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = ""
    if fields[0].startswith("@"):
        marker, fields = fields[0], fields[1:]
        if marker not in (CA_MARKER, REVOKE_MARKER) or (fields and fields[0].startswith("@")):
            return None
    return (marker, fields) if len(fields) >= 3 else None


def host_entries(path: Path, name: str) -> list[Entry]:
    """Every known_hosts line for ``name``, with its marker."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for lineno, text in enumerate(lines, start=1):
        parsed = parse_line(text)
        if parsed is not None and host_matches(parsed[1][0], name):
            found.append(Entry(lineno, parsed[0], parsed[1][1], parsed[1][2]))
    return found


def known_entries(path: Path, name: str) -> list[tuple[int, str, str]]:
    """``(line number, key type, base64 key)`` of every unmarked known_hosts line matching
    ``name`` (its host keys; ``@revoked``/``@cert-authority`` lines are not)."""
    return [(e.line, e.key_type, e.key) for e in host_entries(path, name) if not e.marker]


def revoked_line(path: Path, name: str, key_b64: str) -> int | None:
    """The line that marks ``key_b64`` ``@revoked`` for ``name`` (``None``: not revoked)."""
    return next(
        (
            e.line
            for e in host_entries(path, name)
            if e.marker == REVOKE_MARKER and e.key == key_b64
        ),
        None,
    )


def check_host_key(ep: Endpoint, key: Any) -> None:
    """Accept ``key`` only when ``ep``'s known_hosts holds exactly it and does not revoke it.

    Raises:
        HostKeyRevoked: a ``@revoked`` line of the host holds this key (checked first).
        HostKeyUnknown: no entry of this key type for the host.
        HostKeyChanged: an entry of this key type holds a different key.
    """
    line = revoked_line(ep.known_hosts, ep.known_name, key.get_base64())
    if line is not None:
        raise HostKeyRevoked(
            ep.name, ep.address, ep.port, fingerprint(key), str(ep.known_hosts), line
        )
    entries = [e for e in known_entries(ep.known_hosts, ep.known_name) if e[1] == key.get_name()]
    if any(b64 == key.get_base64() for _, _, b64 in entries):
        return
    if entries:
        raise HostKeyChanged(
            ep.name, ep.address, ep.port, fingerprint(key), str(ep.known_hosts), entries[0][0]
        )
    raise HostKeyUnknown(ep.name, ep.address, ep.port, fingerprint(key))
