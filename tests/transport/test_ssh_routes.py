"""Routes to a real sshd on 127.0.0.1: a 2-hop ProxyJump chain through two more sshd
instances (each hop its own port, key and known_hosts line), a 10-hop chain, a ProxyCommand
(a Python stand-in for ``nc``), and the bad ones: an unknown hop key, a ProxyCommand that
exits at once, chains that never end."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.inventory import HostConfig
from orchestrator.errors import ConfigError, HostKeyUnknown, HostUnreachable
from orchestrator.sandbox.sshd import Sshd, start_sshd, stop_sshd
from orchestrator.transport.ssh import SshTransport
from orchestrator.transport.ssh_config import hops, resolve, route
from tests.helpers import wait_for

# stdin/stdout <-> TCP HOST PORT, what `nc HOST PORT` does for a ProxyCommand
NC = """
import os, select, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
while True:
    r, _, _ = select.select([0, s], [], [])
    if 0 in r:
        data = os.read(0, 65536)
        if not data:
            break
        s.sendall(data)
    if s in r:
        data = s.recv(65536)
        if not data:
            break
        os.write(1, data)
"""


def accepted(server: Sshd) -> int:
    return server.log_path.read_text(errors="replace").count("Accepted publickey")


@pytest.fixture()
def hop_sshds(tmp_path: Path) -> Iterator[tuple[Sshd, Sshd]]:
    one, two = start_sshd(tmp_path / "hop1"), start_sshd(tmp_path / "hop2")
    yield one, two
    stop_sshd(one)
    stop_sshd(two)


def _block(alias: str, server: Sshd, extra: str = "") -> str:
    return (
        f"Host {alias}\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
        f"  IdentityFile {server.client_key_path}\n{extra}"
    )


def _known(path: Path, *servers: Sshd) -> Path:
    path.write_text("".join(s.host_key_line + "\n" for s in servers))
    return path


def _target(known: Path, **over: object) -> HostConfig:
    fields: dict[str, object] = {
        "name": "target",
        "address": "target",
        "ssh_config": "target",
        "known_hosts": str(known),
        "connect_timeout_s": 5.0,
        "keepalive_s": 1.0,
    }
    fields.update(over)
    return HostConfig(**fields)  # type: ignore[arg-type]


def test_two_hop_chain_reaches_the_target_through_both(
    sshd: Sshd, hop_sshds: tuple[Sshd, Sshd], tmp_path: Path
) -> None:
    """target <- hop2 <- hop1: three logins, each on its own sshd, each key checked."""
    one, two = hop_sshds
    config = tmp_path / "ssh_config"
    config.write_text(
        _block("target", sshd, "  ProxyJump hop1,hop2\n")
        + _block("hop1", one)
        + _block("hop2", two)
    )
    known = _known(tmp_path / "known_hosts", sshd, one, two)
    before = (accepted(sshd), accepted(one), accepted(two))
    transport = SshTransport(_target(known), ssh_config_path=config)
    try:
        chain = hops(transport.ep)
        assert [(h.name, h.port) for h in chain] == [("hop1", one.port), ("hop2", two.port)]
        assert transport.run(["echo", "via two hops"]).out == "via two hops\n"
        wait_for(
            lambda: (
                (accepted(sshd), accepted(one), accepted(two))
                == (before[0] + 1, before[1] + 1, before[2] + 1)
                or None
            ),
            5,
            what="one login on each of target, hop1, hop2",
        )
    finally:
        transport.close()


def test_a_hop_with_an_unknown_key_is_refused_and_the_target_never_reached(
    sshd: Sshd, hop_sshds: tuple[Sshd, Sshd], tmp_path: Path
) -> None:
    one, two = hop_sshds
    config = tmp_path / "ssh_config"
    config.write_text(
        _block("target", sshd, "  ProxyJump hop1,hop2\n")
        + _block("hop1", one)
        + _block("hop2", two)
    )
    known = _known(tmp_path / "known_hosts", sshd, one)  # hop2's key is not recorded
    before = accepted(sshd)
    transport = SshTransport(_target(known), ssh_config_path=config, connect_attempts=1)
    try:
        with pytest.raises(HostKeyUnknown) as info:
            transport.run(["true"])
        assert info.value.host == "hop2" and info.value.port == two.port
        assert accepted(sshd) == before
    finally:
        transport.close()


def test_ten_hops_through_one_sshd(sshd: Sshd, tmp_path: Path) -> None:
    """A 10-hop chain (every hop this sshd under another alias): eleven logins, one command."""
    config = tmp_path / "ssh_config"
    names = [f"h{i}" for i in range(10)]
    config.write_text(
        _block("target", sshd, f"  ProxyJump {','.join(names)}\n")
        + "".join(_block(n, sshd) for n in names)
    )
    before = accepted(sshd)
    transport = SshTransport(_target(sshd.known_hosts_path), ssh_config_path=config)
    try:
        assert [h.name for h in hops(transport.ep)] == names
        assert transport.run(["echo", "deep"]).out == "deep\n"
        wait_for(lambda: accepted(sshd) - before == 11 or None, 10, what="eleven logins")
    finally:
        transport.close()


def test_proxycommand_carries_the_connection(sshd: Sshd, tmp_path: Path) -> None:
    script = tmp_path / "nc.py"
    script.write_text(NC)
    config = tmp_path / "ssh_config"
    config.write_text(_block("target", sshd, f"  ProxyCommand {sys.executable} {script} %h %p\n"))
    transport = SshTransport(_target(sshd.known_hosts_path), ssh_config_path=config)
    try:
        assert transport.ep.proxy_command == f"exec {sys.executable} {script} 127.0.0.1 {sshd.port}"
        assert route(transport.ep)["jump"] == []
        assert transport.run(["echo", "piped"]).out == "piped\n"
    finally:
        transport.close()


@pytest.mark.parametrize(
    "command",
    ["exit 3", "echo no route to gw >&2; exit 1", "sleep 0.2", "sleep 60"],
    ids=["exits", "exits-saying-why", "exits-after-reading", "hangs"],
)
def test_a_proxycommand_that_fails_is_one_clear_error(
    command: str, sshd: Sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One HostUnreachable within the connect timeout; paramiko's thread logs no traceback
    (only at debug); a command that never answers is killed."""
    caplog.set_level(logging.INFO)
    config = tmp_path / "ssh_config"
    config.write_text(_block("target", sshd, f"  ProxyCommand {command}\n"))
    transport = SshTransport(
        _target(sshd.known_hosts_path), ssh_config_path=config, connect_attempts=1
    )
    started = time.monotonic()
    try:
        with pytest.raises(HostUnreachable) as info:
            transport.run(["true"])
        assert "target" in str(info.value)
        assert time.monotonic() - started < 8  # bounded by connect_timeout_s (5 s), no hang
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        transport.close()


@pytest.mark.parametrize(
    "text",
    [
        "Host target\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n",
        "Host target\n  ProxyJump " + ",".join(f"j{i}" for i in range(17)) + "\n",
    ],
    ids=["jump-loop", "seventeen-hops"],
)
def test_chains_that_never_end_are_refused(text: str, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(text)
    with pytest.raises(ConfigError, match="more than 16 jump hosts"):
        resolve(_target(tmp_path / "known_hosts"), config)


def test_hosts_yaml_wins_over_the_ssh_config(tmp_path: Path) -> None:
    """address/port/user/proxy_jump set in hosts.yaml win; the alias fills the rest."""
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host target\n  HostName 10.0.0.1\n  Port 2200\n  User cfg\n  IdentityFile /k/cfg\n"
        "  ProxyJump cfgjump\nHost yjump\n  HostName 10.9.9.9\n  User ju\n"
    )
    host = _target(
        tmp_path / "known_hosts",
        port=2222,
        user="yaml",
        proxy_jump="yjump",
        explicit=frozenset({"port", "user", "proxy_jump"}),
    )
    got = route(resolve(host, config))
    assert (got["hostname"], got["port"], got["user"]) == ("10.0.0.1", 2222, "yaml")
    assert got["identity_files"] == ["/k/cfg"]
    assert got["jump"] == [{"hostname": "10.9.9.9", "port": 22, "user": "ju"}]


def test_a_proxy_jump_naming_an_inventory_host_is_that_host(tmp_path: Path) -> None:
    """What the pool connects through (connect.py reuses the inventory host's connection) is
    what ``orch hosts --ssh`` shows; a loop of inventory hosts is refused, not recursed."""
    config = tmp_path / "ssh_config"
    config.write_text("Host bastion\n  HostName 10.7.7.7\n  User fromconfig\n")
    bastion = HostConfig(name="bastion", address="192.0.2.1", port=2202, user="admin")
    pve1 = HostConfig(name="pve1", address="10.0.0.1", proxy_jump="bastion")
    peers = {"bastion": bastion, "pve1": pve1}
    got = route(resolve(pve1, config, peers=peers))
    assert got["jump"] == [{"hostname": "192.0.2.1", "port": 2202, "user": "admin"}]
    loop = {
        "a": HostConfig(name="a", address="10.0.0.1", proxy_jump="b"),
        "b": HostConfig(name="b", address="10.0.0.2", proxy_jump="a"),
    }
    with pytest.raises(ConfigError, match="more than 16 jump hosts"):
        resolve(loop["a"], config, peers=loop)


def test_the_pool_connects_through_an_inventory_jump_host(sshd: Sshd) -> None:
    from orchestrator.config.inventory import parse_inventory
    from orchestrator.transport.connect import close_all, host_transport

    common = (
        f"address: 127.0.0.1, port: {sshd.port}, user: {sshd.user}, "
        f"identity_file: {sshd.client_key_path}, known_hosts: {sshd.known_hosts_path}"
    )
    inventory = parse_inventory(
        f"hosts:\n  bastion: {{{common}}}\n  pve1: {{{common}, proxy_jump: bastion}}\n"
    )
    before = accepted(sshd)
    try:
        assert host_transport(inventory, "pve1").run(["echo", "pooled"]).out == "pooled\n"
        bastion = host_transport(inventory, "bastion")
        assert bastion.run(["true"]).ok and bastion.connects == 1  # type: ignore[attr-defined]
        wait_for(lambda: accepted(sshd) - before == 2 or None, 5, what="two logins")
    finally:
        close_all()


def test_orch_trust_records_each_jump_host_then_the_target(
    sshd: Sshd,
    hop_sshds: tuple[Sshd, Sshd],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An empty known_hosts: `orch trust` shows and records hop1, hop2 (reached through hop1)
    and the target in connection order; then a command goes through the chain."""
    import json

    from orchestrator.cli import run

    one, two = hop_sshds
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        _block("target", sshd, "  ProxyJump hop1,hop2\n")
        + _block("hop1", one)
        + _block("hop2", two)
    )
    known = tmp_path / "known"
    config = tmp_path / "hosts.yaml"
    config.write_text(f"hosts:\n  pve1: {{ssh_config: target, known_hosts: {known}}}\n")
    assert run(["-c", str(config), "trust", "pve1", "--yes", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["outcome"] == "added" and json.loads(out)["port"] == sshd.port
    assert err.index("jump host hop1") < err.index("jump host hop2") < err.index("pve1 (")
    lines = known.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == [f"[127.0.0.1]:{s.port}" for s in (one, two, sshd)]
    assert run(["-c", str(config), "trust", "pve1", "--json"]) == 0  # all known: no prompt
    assert json.loads(capsys.readouterr().out)["outcome"] == "known"
    transport = SshTransport(_target(known))
    try:
        assert transport.run(["echo", "trusted"]).out == "trusted\n"
    finally:
        transport.close()
