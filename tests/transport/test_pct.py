"""PctTransport end to end: the real sshd of the sandbox and its pct stand-in (orchestrator/sandbox/bin/pct)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from orchestrator.errors import (
    CommandFailed,
    CommandTimeout,
    ContainerNotFound,
    ContainerNotRunning,
)
from orchestrator.transport.pct import BASE_ENV, DEADLINE_SLACK_S, KILL_GRACE_S, PctTransport
from tests.helpers import wait_for
from tests.transport.conftest import ECHO_ARGV, PY
from tests.transport.test_ssh import ARG_LISTS

PCT = Path(__file__).resolve().parents[2] / "orchestrator" / "sandbox" / "bin" / "pct"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not PCT.exists(), reason="pct stand-in (orchestrator/sandbox/bin/pct) missing"
    ),
]


@pytest.fixture(scope="module")
def inventory(sandbox: object) -> object:
    from orchestrator.config.inventory import load_inventory

    return load_inventory(sandbox.config_path)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def ct(inventory: object) -> Iterator[PctTransport]:
    from orchestrator.transport.connect import close_all, transport_for

    transport = transport_for(inventory, "ct200")  # type: ignore[arg-type]
    assert isinstance(transport, PctTransport)
    yield transport
    close_all()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=ARG_LISTS)
def test_argv_arrives_byte_for_byte_through_pct(ct: PctTransport, args: list[str]) -> None:
    res = ct.run([PY, "-c", ECHO_ARGV, *args], timeout=30)
    assert res.exit_status == 0, res.err
    assert [
        bytes.fromhex(h).decode("utf-8", "surrogateescape") for h in json.loads(res.out)
    ] == args


def test_double_dash_keeps_option_like_args_for_the_command(ct: PctTransport) -> None:
    assert ct.argv(["ls", "-la"])[:4] == ["pct", "exec", "200", "--"]
    assert ct.run(["echo", "--keep-env", "0", "-x"]).out == "--keep-env 0 -x\n"


def test_no_shell_and_no_login_profile(ct: PctTransport) -> None:
    assert ct.run(["echo", "$HOME", "`id`", ";", "*"]).out == "$HOME `id` ; *\n"


def _env(ct: PctTransport, **env: str) -> dict[str, str]:
    res = ct.run(["env"], env=env)
    assert res.ok, res.err
    return dict(line.split("=", 1) for line in res.out.splitlines())


def test_env_is_explicit_and_nothing_of_the_host_leaks(sandbox: object, ct: PctTransport) -> None:
    """pct forces PATH=/sbin:/bin:/usr/sbin:/usr/bin, then hands the host's environment to the
    command (--keep-env): orch replaces it with its own, under hosts.yaml's ``env``."""
    seen = _env(ct, ORCH_X="a 'b' $c")
    assert seen["ORCH_X"] == "a 'b' $c" and seen["LANG"] == "C.UTF-8"
    assert seen["PATH"].endswith(BASE_ENV["PATH"])  # process mode puts the container's bin first
    leaked = [k for k in seen if k.startswith(("SSH_", "XDG_", "ORCH_SANDBOX_STATE", "SSL_"))]
    assert not leaked, leaked
    if sandbox.isolation == "lxc":  # type: ignore[attr-defined]  # exactly what orch sends
        assert seen == {**BASE_ENV, "ORCH_X": "a 'b' $c"}
    over = PctTransport(ct.host, 200, env={"PATH": "/opt/venv/bin:/usr/bin:/bin", "LANG": "C"})
    seen = _env(over)
    assert seen["PATH"].endswith("/opt/venv/bin:/usr/bin:/bin") and seen["LANG"] == "C"


def test_tools_in_usr_local_bin_are_found(sandbox: object, ct: PctTransport) -> None:
    """pip installs torchrun & co. into /usr/local/bin, which pct's PATH lacks."""
    if sandbox.isolation != "lxc":  # type: ignore[attr-defined]
        pytest.skip("process mode has no /usr/local of its own")
    tool = sandbox.host_path("ct200", "/usr/local/bin/orch-fake-torchrun")  # type: ignore[attr-defined]
    tool.write_text('#!/bin/sh\necho torchrun "$@"\n')
    tool.chmod(0o755)
    try:
        assert ct.run(["orch-fake-torchrun", "--nproc"]).out == "torchrun --nproc\n"
        assert ct.run(["sh", "-c", "command -v orch-fake-torchrun"]).ok
    finally:
        tool.unlink()


def _in_container(sandbox: object, vmid: int, argv: list[str]) -> list[int]:
    """Host PIDs of the processes in the container whose argv is ``argv``."""
    found = []
    for pid in sandbox.container_pids(vmid):  # type: ignore[attr-defined]
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] == [
                a.encode() for a in argv
            ]:
                found.append(pid)
        except OSError:
            continue
    return found


def test_a_timed_out_command_is_gone_from_the_container_within_the_grace(
    sandbox: object, ct: PctTransport
) -> None:
    """Closing the channel (or killing pct exec) stops nothing in a real container: orch's
    deadline runs inside it, and takes the command's children and a SIGTERM-deaf one too."""
    script = "sleep 611 & trap '' TERM; sleep 612; wait"
    with pytest.raises(CommandTimeout):
        ct.run(["sh", "-c", script], timeout=1.0)
    timed_out = time.monotonic()
    grace = DEADLINE_SLACK_S + KILL_GRACE_S
    wait_for(
        lambda: (
            not _in_container(sandbox, 200, ["sleep", "611"])
            and not _in_container(sandbox, 200, ["sleep", "612"])
        ),
        grace + 5,
        what="the timed-out command and its child gone from ct200",
    )
    took = time.monotonic() - timed_out
    assert took < grace + 5, took


@pytest.mark.parametrize(("script", "status"), [("exit 0", 0), ("exit 7", 7), ("kill -9 $$", 137)])
def test_exit_codes_pass_through(ct: PctTransport, script: str, status: int) -> None:
    assert ct.run(["sh", "-c", script]).exit_status == status


def test_status_running(ct: PctTransport) -> None:
    assert ct.status() == "running"


def test_missing_container_is_container_not_found(ct: PctTransport) -> None:
    """pct dies with $! = ENOENT for a missing config: exit 2, recognised by its message."""
    assert ct.host.run(["pct", "exec", "999", "--", "true"]).exit_status == 2
    missing = PctTransport(ct.host, 999)
    with pytest.raises(ContainerNotFound, match="container 999 does not exist"):
        missing.run(["true"])
    with pytest.raises(ContainerNotFound):
        missing.status()
    with pytest.raises(ContainerNotFound):
        list(missing.stream(["true"]))


def test_stopped_container_is_container_not_running(sandbox: object, inventory: object) -> None:
    from orchestrator.sandbox import manager
    from orchestrator.transport.connect import transport_for

    ct = transport_for(inventory, "ct202")  # type: ignore[arg-type]
    assert isinstance(ct, PctTransport)
    manager.stop_container(sandbox.state_dir, "ct202")  # type: ignore[attr-defined]
    try:
        assert ct.status() == "stopped"
        with pytest.raises(ContainerNotRunning, match="container 202 is not running"):
            ct.run(["true"])
        with pytest.raises(ContainerNotRunning):
            ct.put(b"x", "/root/x")
        with pytest.raises(ContainerNotRunning):
            list(ct.stream(["true"]))
    finally:
        manager.start_container(sandbox.state_dir, "ct202")  # type: ignore[attr-defined]
    assert ct.run(["true"]).ok


def test_put_keeps_perms_is_atomic_and_cleans_the_host(sandbox: object, ct: PctTransport) -> None:
    workdir = Path(sandbox.container_workdir("ct200"))  # type: ignore[attr-defined]
    ct.run(["mkdir", "-p", str(workdir)])
    target = workdir / "it's a $script.sh"
    ct.put(b"#!/bin/sh\necho pushed\n", str(target), mode=0o755)
    assert ct.run([str(target)]).out == "pushed\n"
    assert ct.run(["stat", "-c", "%a", str(target)]).out == "755\n"
    assert not [p for p in sandbox.workdir("ct200").iterdir() if "orch-tmp" in p.name]  # type: ignore[attr-defined]
    leftovers = ct.host.run(["sh", "-c", "ls /tmp | grep -c '^orch-push-200-' || true"]).out
    assert leftovers.strip() == "0"
    # pct push exits 0 when the copy fails; its stderr is the error orch reports
    with pytest.raises(CommandFailed, match="failed to create file: .*No such file or directory"):
        ct.put(b"x", str(workdir / "no-such-dir" / "f"))


def test_parallel_pushes_to_one_container(sandbox: object, ct: PctTransport) -> None:
    inside = Path(sandbox.container_workdir("ct200"))  # type: ignore[attr-defined]
    workdir = Path(sandbox.workdir("ct200"))  # type: ignore[attr-defined]
    ct.run(["mkdir", "-p", str(inside)])
    errors: list[BaseException] = []

    def push(i: int) -> None:
        try:
            ct.put(f"{i}\n".encode(), str(inside / f"p{i}"), mode=0o600)
        except BaseException as exc:  # noqa: BLE001 - collected from the thread, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=push, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted((workdir / f"p{i}").read_text() for i in range(6)) == [f"{i}\n" for i in range(6)]


def test_stream_through_pct(ct: PctTransport) -> None:
    with ct.stream(["sh", "-c", "echo a; echo b; exit 5"]) as stream:
        assert list(stream) == ["a", "b"]
    assert stream.exit_status == 5


def test_one_pooled_connection_per_host(inventory: object, ct: PctTransport) -> None:
    from orchestrator.transport.connect import host_transport, transport_for

    other = transport_for(inventory, "ct201")  # type: ignore[arg-type]
    assert isinstance(other, PctTransport)
    assert other.host is ct.host is host_transport(inventory, "sandbox")  # type: ignore[arg-type]
    assert other.run(["true"]).ok and ct.run(["true"]).ok
    assert ct.host.connects == 1  # type: ignore[attr-defined]
