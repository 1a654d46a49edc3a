"""Fixtures for transport tests: a real OpenSSH sshd on 127.0.0.1 (orchestrator.sandbox.sshd)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.inventory import HostConfig
from orchestrator.sandbox.sshd import Sshd, start_sshd, stop_sshd
from orchestrator.transport.ssh import SshTransport

pytestmark = pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="needs OpenSSH sshd")


def host_config(sshd: Sshd, name: str = "sb", **over: object) -> HostConfig:
    """A hosts.yaml-like entry for ``sshd`` (its own client key and known_hosts)."""
    fields: dict[str, object] = {
        "name": name,
        "address": "127.0.0.1",
        "port": sshd.port,
        "user": sshd.user,
        "identity_file": str(sshd.client_key_path),
        "known_hosts": str(sshd.known_hosts_path),
        "connect_timeout_s": 5.0,
        "keepalive_s": 1.0,
    }
    fields.update(over)
    return HostConfig(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """One sshd for the whole session, in its own temp dir; stopped (with its sessions) after."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    stop_sshd(server)


@pytest.fixture()
def own_sshd(tmp_path: Path) -> Iterator[Sshd]:
    """An sshd for one test (tests that kill or restart it)."""
    server = start_sshd(tmp_path / "sshd")
    yield server
    stop_sshd(server)
    shutil.rmtree(tmp_path / "sshd", ignore_errors=True)


@pytest.fixture()
def ssh(sshd: Sshd) -> Iterator[SshTransport]:
    """A fresh SshTransport to the session sshd (its own pooled connection)."""
    transport = SshTransport(host_config(sshd))
    yield transport
    transport.close()


PY = sys.executable  # the same interpreter on the "remote" side: no PATH or shim surprises
ECHO_ARGV = "import os,sys,json; print(json.dumps([os.fsencode(a).hex() for a in sys.argv[1:]]))"
