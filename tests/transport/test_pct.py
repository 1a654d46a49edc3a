"""PctTransport end to end: the real sshd of the sandbox and its pct stand-in (orchestrator/sandbox/bin/pct)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from orchestrator.errors import CommandFailed, ContainerNotFound, ContainerNotRunning
from orchestrator.transport.pct import PctTransport
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


def test_env_is_passed_explicitly(ct: PctTransport) -> None:
    res = ct.run(
        [PY, "-c", "import os; print(os.environ.get('ORCH_X'), os.environ['container'])"],
        env={"ORCH_X": "a 'b' $c"},
    )
    assert res.out == "a 'b' $c lxc\n"


@pytest.mark.parametrize(("script", "status"), [("exit 0", 0), ("exit 7", 7), ("kill -9 $$", 137)])
def test_exit_codes_pass_through(ct: PctTransport, script: str, status: int) -> None:
    assert ct.run(["sh", "-c", script]).exit_status == status


def test_status_running(ct: PctTransport) -> None:
    assert ct.status() == "running"


def test_missing_container_is_container_not_found(ct: PctTransport) -> None:
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
    workdir = Path(sandbox.workdir("ct200"))  # type: ignore[attr-defined]
    ct.run(["mkdir", "-p", str(workdir)])
    target = workdir / "it's a $script.sh"
    ct.put(b"#!/bin/sh\necho pushed\n", str(target), mode=0o755)
    assert ct.run([str(target)]).out == "pushed\n"
    assert ct.run(["stat", "-c", "%a", str(target)]).out == "755\n"
    assert not [p for p in workdir.iterdir() if "orch-tmp" in p.name]
    leftovers = ct.host.run(["sh", "-c", "ls /tmp | grep -c '^orch-push-200-' || true"]).out
    assert leftovers.strip() == "0"
    with pytest.raises(CommandFailed):
        ct.put(b"x", str(workdir / "no-such-dir" / "f"))


def test_parallel_pushes_to_one_container(sandbox: object, ct: PctTransport) -> None:
    workdir = Path(sandbox.workdir("ct200"))  # type: ignore[attr-defined]
    ct.run(["mkdir", "-p", str(workdir)])
    errors: list[BaseException] = []

    def push(i: int) -> None:
        try:
            ct.put(f"{i}\n".encode(), str(workdir / f"p{i}"), mode=0o600)
        except BaseException as exc:  # collected: asserted below
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
