"""SshTransport against a real OpenSSH sshd on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import (
    AuthFailed,
    CommandFailed,
    CommandTimeout,
    HostKeyChanged,
    HostKeyUnknown,
    HostUnreachable,
)
from orchestrator.sandbox.sshd import Sshd, start_sshd, stop_sshd
from orchestrator.transport.ssh import SshTransport
from tests.helpers import wait_for
from tests.transport.conftest import ECHO_ARGV, PY, host_config

NASTY = [
    "",
    " ",
    "'",
    '"',
    "$HOME",
    "`id`",
    "$(id)",
    ";",
    "&&",
    "|",
    "\n",
    "a\nb",
    "\\",
    "*",
    "~",
    "-n",
    "--",
    "%s",
    "\t",
    "\r",
    "é",
    "日本",
    "😀",
    "'\"'\"'",
    "!",
    "#x",
]
ARG = st.one_of(
    st.sampled_from(NASTY),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
)

ARG_LISTS = st.lists(ARG, max_size=8)


def remote_argv(transport: SshTransport, args: list[str]) -> list[str]:
    res = transport.run([PY, "-c", ECHO_ARGV, *args], timeout=20)
    assert res.exit_status == 0, res.err
    return [bytes.fromhex(h).decode("utf-8", "surrogateescape") for h in json.loads(res.out)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=ARG_LISTS)
def test_argv_arrives_byte_for_byte(ssh: SshTransport, args: list[str]) -> None:
    assert remote_argv(ssh, args) == args


def test_env_values_arrive_literally(ssh: SshTransport) -> None:
    env = {"ORCH_A": "$(touch /tmp/never) `x` ; 'q' \n end", "ORCH_B": ""}
    res = ssh.run(
        [
            PY,
            "-c",
            "import os; print(repr(os.environ['ORCH_A'])); print(repr(os.environ['ORCH_B']))",
        ],
        env=env,
    )
    assert res.out.splitlines() == [repr(env["ORCH_A"]), repr("")]


def test_stdin_and_stderr(ssh: SshTransport) -> None:
    data = bytes(range(256)) * 4000
    res = ssh.run(["sh", "-c", "cat; echo oops >&2"], stdin=data)
    assert (res.exit_status, res.stdout, res.stderr) == (0, data, b"oops\n")


@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -9 $$", 137),
        ("kill -TERM $$", 143),
    ],
)
def test_exit_status(ssh: SshTransport, script: str, status: int) -> None:
    assert ssh.run(["sh", "-c", script]).exit_status == status


def test_missing_program_is_127(ssh: SshTransport) -> None:
    assert ssh.run(["/nonexistent/orch-prog"]).exit_status == 127


def test_large_output_on_both_channels_does_not_stall(ssh: SshTransport) -> None:
    size = 10_000_000
    script = f"head -c {size} /dev/zero; head -c 3000000 /dev/zero >&2; head -c {size} /dev/zero"
    started = time.monotonic()
    res = ssh.run(["sh", "-c", script], timeout=60)
    assert (len(res.stdout), len(res.stderr), res.exit_status) == (2 * size, 3_000_000, 0)
    assert time.monotonic() - started < 30


def test_timeout_raises_and_connection_stays_usable(ssh: SshTransport) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out after 0.5 s"):
        ssh.run(["sleep", "30"], timeout=0.5)
    assert time.monotonic() - started < 3
    assert ssh.run(["echo", "ok"]).out == "ok\n"
    assert ssh.connects == 1


def accepted(sshd: Sshd) -> int:
    return sshd.log_path.read_text(errors="replace").count("Accepted publickey")


def test_twenty_concurrent_commands_share_one_connection(sshd: Sshd, tmp_path: Path) -> None:
    """20 commands at once: all succeed over ONE TCP connection, at most 10 channels at a time."""
    before = accepted(sshd)
    transport = SshTransport(host_config(sshd))
    live = tmp_path / "live"
    live.mkdir()
    done = tmp_path / "done"
    done.mkdir()
    # Each command stays until it has seen another one live (or one already ended), so the
    # overlap is proven however slowly the interpreters start; it prints the most it saw.
    count = (
        "import os,sys,time; d,e=sys.argv[1],sys.argv[3]; p=os.path.join(d, sys.argv[2]);"
        " open(p,'w').close(); n=len(os.listdir(d)); end=time.monotonic()+60\n"
        "while n < 2 and not os.listdir(e) and time.monotonic() < end:\n"
        "    time.sleep(0.02); n=max(n, len(os.listdir(d)))\n"
        "time.sleep(0.1); n=max(n, len(os.listdir(d))); os.unlink(p);"
        " open(os.path.join(e, sys.argv[2]),'w').close(); print(n)"
    )
    results: list[int] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            res = transport.run([PY, "-c", count, str(live), str(i), str(done)], timeout=90)
            assert res.ok, res.err
            results.append(int(res.out))
        except BaseException as exc:  # noqa: BLE001 - collected from the thread, asserted below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not errors, errors
        assert len(results) == 20
        assert 2 <= max(results) <= 10
        assert transport.connects == 1
        assert wait_for(lambda: accepted(sshd) - before == 1 or None, 5, what="one Accepted line")
    finally:
        transport.close()


def test_unknown_host_key_refused(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    transport = SshTransport(host_config(sshd, known_hosts=str(empty)))
    with pytest.raises(HostKeyUnknown, match="orch trust sb") as info:
        transport.run(["true"])
    assert info.value.fingerprint.startswith("SHA256:")
    assert transport.connects == 0


def test_changed_host_key_refused(sshd: Sshd, tmp_path: Path) -> None:
    """A second sshd with another host key, checked against the first one's entry."""
    impostor = start_sshd(tmp_path / "impostor")
    try:
        known = tmp_path / "known_hosts"
        first_key = sshd.host_key_line.split(" ", 1)[1]
        known.write_text(f"# comment\n[127.0.0.1]:{impostor.port} {first_key}\n")
        transport = SshTransport(
            host_config(
                sshd,
                port=impostor.port,
                known_hosts=str(known),
                identity_file=str(impostor.client_key_path),
            )
        )
        with pytest.raises(HostKeyChanged) as info:
            transport.run(["true"])
        message = str(info.value)
        assert "man-in-the-middle" in message and f"line 2 of {known}" in message
        assert "Accepted" not in impostor.log_path.read_text()
    finally:
        stop_sshd(impostor)


def test_hashed_known_hosts_entry_accepted(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.host_key_line + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|")
    transport = SshTransport(host_config(sshd, known_hosts=str(known)))
    try:
        assert transport.run(["true"]).ok
    finally:
        transport.close()


def test_wrong_client_key_is_auth_failed(sshd: Sshd, tmp_path: Path) -> None:
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    transport = SshTransport(host_config(sshd, identity_file=str(key)))
    started = time.monotonic()
    with pytest.raises(AuthFailed, match=str(key)):
        transport.run(["true"])
    assert time.monotonic() - started < 5  # not retried


def test_connection_refused_is_unreachable(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from orchestrator.config.inventory import HostConfig

    transport = SshTransport(
        HostConfig(name="gone", address="127.0.0.1", port=port, known_hosts=str(tmp_path / "kh"))
    )
    with pytest.raises(HostUnreachable, match="gone: unreachable"):
        transport.run(["true"])


def test_sshd_killed_then_back_reconnects(own_sshd: Sshd) -> None:
    transport = SshTransport(host_config(own_sshd))
    try:
        assert transport.run(["echo", "1"]).out == "1\n"
        stop_sshd(own_sshd)
        with pytest.raises(HostUnreachable):
            transport.run(["echo", "2"])
        back = start_sshd(own_sshd.state_dir, port=own_sshd.port)
        try:
            assert transport.run(["echo", "3"]).out == "3\n"
            assert transport.connects == 2
        finally:
            stop_sshd(back)
    finally:
        transport.close()


def test_stream_lines_and_exit(ssh: SshTransport) -> None:
    script = "for i in 1 2 3; do echo line$i; sleep 0.05; done; printf tail; echo err >&2; exit 4"
    with ssh.stream(["sh", "-c", script]) as stream:
        lines = list(stream)
    assert lines == ["line1", "line2", "line3", "tail"]
    assert stream.exit_status == 4
    assert stream.stderr_tail == b"err\n"  # type: ignore[attr-defined]


def test_stream_readline_timeout_and_close_frees_the_slot(ssh: SshTransport) -> None:
    streams = [ssh.stream(["sh", "-c", "echo hi; sleep 60"]) for _ in range(10)]
    try:
        assert [s.readline(timeout=10) for s in streams] == ["hi"] * 10
        with pytest.raises(CommandTimeout):
            streams[0].readline(timeout=0.3)
    finally:
        for s in streams:
            s.close()
    assert ssh.run(["echo", "free"], timeout=10).out == "free\n"


def test_stream_ends_when_connection_drops(own_sshd: Sshd) -> None:
    transport = SshTransport(host_config(own_sshd))
    try:
        stream = transport.stream(["sh", "-c", "echo up; sleep 60"])
        assert stream.readline(timeout=10) == "up"
        stop_sshd(own_sshd)
        assert stream.readline(timeout=10) is None
        assert stream.exit_status is None and stream.dropped  # type: ignore[attr-defined]
    finally:
        transport.close()


def test_put_is_atomic_and_keeps_mode(ssh: SshTransport, tmp_path: Path) -> None:
    target = tmp_path / "it's $x.sh"
    ssh.put(b"#!/bin/sh\necho put\n", str(target), mode=0o750)
    assert target.read_bytes() == b"#!/bin/sh\necho put\n"
    assert target.stat().st_mode & 0o777 == 0o750
    assert ssh.run([str(target)]).out == "put\n"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    with pytest.raises(CommandFailed):
        ssh.put(b"x", str(tmp_path / "missing" / "f"))


def test_timeout_ends_the_remote_command(ssh: SshTransport) -> None:
    marker = "31.4159"
    with pytest.raises(CommandTimeout):
        ssh.run(["sleep", marker], timeout=0.5)

    def gone() -> bool:
        out = subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True).stdout
        return not out.strip()

    wait_for(gone, 10, what="the timed-out remote command to end")


def test_silent_peer_is_declared_dead_by_the_liveness_check(own_sshd: Sshd) -> None:
    """SIGSTOP the connection's sshd processes: TCP stays up, nothing answers (a partition)."""
    import os
    import signal

    from orchestrator.agent.procs import descendants

    transport = SshTransport(host_config(own_sshd, keepalive_s=0.5), dead_after_s=2.0)
    stopped = []
    try:
        assert transport.run(["true"]).ok
        stopped = descendants(own_sshd.pid)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises((HostUnreachable, CommandTimeout)):
            transport.run(["true"], timeout=20)
        assert time.monotonic() - started < 10
        wait_for(lambda: not transport.alive(), 5, what="the connection to be marked dead")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        transport.close()
    assert transport.run(["echo", "back"], timeout=20).out == "back\n"  # a new connection
    assert transport.connects == 2


def test_proxyjump_through_ssh_config_alias(sshd: Sshd, tmp_path: Path) -> None:
    """target -> ProxyJump jumphost (both this sshd): a direct-tcpip channel through the jump."""
    from orchestrator.config.inventory import HostConfig

    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host jumphost\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key_path}\n"
        f"Host target\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key_path}\n  ProxyJump jumphost\n"
    )
    before = accepted(sshd)
    host = HostConfig(
        name="target", address="target", ssh_config="target", known_hosts=str(sshd.known_hosts_path)
    )
    transport = SshTransport(host, ssh_config_path=config)
    try:
        assert transport.ep.port == sshd.port and transport.ep.proxy_jump == "jumphost"
        assert transport.run(["echo", "via jump"]).out == "via jump\n"
        assert transport._jump is not None and transport._jump.connects == 1
        wait_for(lambda: accepted(sshd) - before == 2 or None, 5, what="two logins (jump + target)")
    finally:
        transport.close()
        if transport._jump is not None:
            transport._jump.close()


def test_a_refused_open_on_a_live_connection_is_retried_not_dropped() -> None:
    """paramiko's one saved_exception per transport: under load a thread whose open was refused
    may see only SSHException("Unable to open channel."); on a live connection that is a refusal
    (retry), on a dead one the connection is gone (drop). The 20-command test above is the real
    case; this pins the classification."""
    import socket

    import paramiko

    from orchestrator.transport.ssh import _refused

    a, b = socket.socketpair()
    try:
        idle = paramiko.Transport(a)  # never started: not active
        assert _refused(paramiko.ChannelException(2, "Connect failed"), idle)
        assert not _refused(paramiko.SSHException("Unable to open channel."), idle)
        assert not _refused(paramiko.SSHException("Timeout opening channel."), idle)
    finally:
        a.close()
        b.close()
