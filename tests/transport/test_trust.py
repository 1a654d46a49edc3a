"""orch trust: scan a host key without auth, record it, refuse a changed one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.errors import HostKeyChanged
from orchestrator.sandbox.sshd import Sshd, start_sshd, stop_sshd
from orchestrator.transport import trust
from orchestrator.transport.ssh import SshTransport
from tests.transport.conftest import host_config


def ssh_keygen_fingerprint(sshd: Sshd) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", f"{sshd.host_key_path}.pub"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()[1]


def test_scan_record_then_connect(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "ssh" / "known_hosts"
    host = host_config(sshd, known_hosts=str(known))
    scanned = trust.scan(host)
    assert scanned.status == trust.UNKNOWN
    assert scanned.fingerprint == ssh_keygen_fingerprint(sshd)
    assert scanned.known_hosts_line == sshd.host_key_line
    trust.record(scanned)
    assert known.stat().st_mode & 0o777 == 0o600
    assert trust.scan(host).status == trust.KNOWN
    trust.record(trust.scan(host))  # already known: no second line
    assert known.read_text() == sshd.host_key_line + "\n"
    transport = SshTransport(host)
    try:
        assert transport.run(["true"]).ok
    finally:
        transport.close()


def test_changed_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    impostor = start_sshd(tmp_path / "impostor")
    try:
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{impostor.port} {sshd.host_key_line.split(' ', 1)[1]}\n")
        scanned = trust.scan(host_config(impostor, known_hosts=str(known)))
        assert (scanned.status, scanned.line) == (trust.CHANGED, 1)
        with pytest.raises(HostKeyChanged, match="man-in-the-middle"):
            trust.record(scanned)
        assert known.read_text().count("\n") == 1
    finally:
        stop_sshd(impostor)


def test_cli_trust_yes_json(sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import run

    known = tmp_path / "known_hosts"
    config = tmp_path / "hosts.yaml"
    config.write_text(
        "hosts:\n"
        f"  sb: {{address: 127.0.0.1, port: {sshd.port}, user: {sshd.user},"
        f" identity_file: {sshd.client_key_path}, known_hosts: {known}}}\n"
        "containers: {}\n"
    )
    assert run(["-c", str(config), "trust", "sb", "--yes", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["outcome"], doc["fingerprint"]) == ("added", ssh_keygen_fingerprint(sshd))
    assert run(["-c", str(config), "trust", "sb", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "known"
    assert run(["-c", str(config), "trust", "nope"]) == 2


def test_a_revoked_key_is_refused_with_a_clear_message(sshd: Sshd, tmp_path: Path) -> None:
    """OpenSSH (hostfile.c ``check_key_not_revoked``) refuses a key marked ``@revoked`` even
    when an unmarked line accepts it; so does orch, and orch trust will not record it."""
    from orchestrator.errors import HostKeyRevoked

    key = sshd.host_key_line.split(" ", 1)[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd.host_key_line}\n@revoked * {key}\n")
    host = host_config(sshd, known_hosts=str(known))
    transport = SshTransport(host)
    try:
        with pytest.raises(HostKeyRevoked, match="REVOKED .* line 2 of"):
            transport.run(["true"])
    finally:
        transport.close()
    with pytest.raises(HostKeyRevoked):
        trust.scan(host)
    # OpenSSH's own client agrees (the oracle)
    res = subprocess.run(
        [
            "ssh",
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-p",
            str(sshd.port),
            "-i",
            str(sshd.client_key_path),
            "root@127.0.0.1",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode != 0 and "REVOKED" in res.stderr, res.stderr


def test_a_cert_authority_line_is_not_a_host_key(sshd: Sshd, tmp_path: Path) -> None:
    """A ``@cert-authority`` line vouches for host certificates only (paramiko presents a
    plain key): it neither accepts the key nor makes it "changed"."""
    from orchestrator.errors import HostKeyUnknown

    key = sshd.host_key_line.split(" ", 1)[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority * {key}\n")
    scanned = trust.scan(host_config(sshd, known_hosts=str(known)))
    assert scanned.status == trust.UNKNOWN
    transport = SshTransport(host_config(sshd, known_hosts=str(known)))
    try:
        with pytest.raises(HostKeyUnknown):
            transport.run(["true"])
    finally:
        transport.close()
