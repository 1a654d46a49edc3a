"""The resident host observer (orchestrator/agent/resident.py) and its client in the host boot
(orchestrator/remote/boot.py), with real processes: the boot as ``orch check`` runs it on a
host (``python3 -S -c HOST_BOOT <bundle_dir> host-observe ...``) from a deployed bundle.

What is checked: the second check is answered by the resident that the first one started,
with the one-shot's document, exit status and errors; a stale socket file, a killed resident
and a resident whose bundle went away fall back to the one-shot (and a new resident serves
the next check); another uid is refused (file mode, then ``SO_PEERCRED``); the resident exits
after its idle time; a new bundle gets its own resident; concurrent checks all get answers.
The observation through real sshd is in tests/agent/test_host_observer.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_for

VOLATILE = ("taken_at", "cost", "elapsed_ms", "served_by")
"""What differs between two observations of the same host: the clock, costs and who answered."""
SINCE = str(time.time() + 3600)
"""Every check's ``--since``: no kernel line is new, and the kernel cursor is the same."""


@pytest.fixture
def place(tmp_path: Path) -> Iterator[dict[str, object]]:
    """A host agent_dir with the checkout's bundle deployed; every resident started in it is
    killed afterwards (by the pid its lock file holds)."""
    from orchestrator.remote import deploy
    from orchestrator.transport.local import LocalTransport

    agent_dir = tmp_path / "agent"
    agent_dir.mkdir(mode=0o755)
    bundle_dir = deploy.ensure_agent(LocalTransport(), str(agent_dir), sys.executable, host=True)
    deploy.forget(LocalTransport(), str(agent_dir))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(tmp_path),
        "ORCH_TEST_RESIDENT": str(tmp_path),  # this test's residents are its own
    }
    info: dict[str, object] = {"agent_dir": agent_dir, "bundle": Path(bundle_dir), "env": env}
    try:
        yield info
    finally:
        for lock in agent_dir.glob(".orch/*/observer-*.lock"):
            pid = _pid(lock)
            if pid and _is_resident(pid):
                os.kill(pid, signal.SIGKILL)


def _argv(tmp: Path, *more: str) -> list[str]:
    return [
        "host-observe",
        "--containers",
        json.dumps([{"name": "ct9", "vmid": 9999, "workdir": "/nonexistent"}]),
        "--host",
        "h1",
        "--since",
        SINCE,
        "--state",
        str(tmp / "containers.json"),
        *more,
    ]


def check(place: dict, *more: str, env: dict | None = None, bundle: Path | None = None):
    """One check as the host runs it: (exit status, stdout, stderr)."""
    from orchestrator.remote.boot import HOST_BOOT

    b = bundle or place["bundle"]
    p = subprocess.run(
        [sys.executable, "-S", "-c", HOST_BOOT, str(b), *_argv(place["agent_dir"], *more)],
        capture_output=True,
        env=env or place["env"],
        cwd=place["agent_dir"],
        timeout=60,
    )
    return p.returncode, p.stdout, p.stderr


def doc_of(out: bytes) -> dict:
    return json.loads(out)


def stable(doc: object) -> object:
    """``doc`` without the :data:`VOLATILE` keys, at every depth."""
    if isinstance(doc, dict):
        return {k: stable(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [stable(v) for v in doc]
    return doc


def sock_name(place: dict, env: dict | None = None) -> str:
    from orchestrator.agent.resident import socket_name

    return socket_name(env or place["env"], str(place["agent_dir"]), sys.executable)


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket ``path``."""
    cwd = os.getcwd()
    os.chdir(path.parent)  # a unix socket's path is limited to 107 bytes
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path.name)
        return True
    except OSError:
        return False
    finally:
        os.chdir(cwd)


def _pid(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _is_resident(pid: int) -> bool:
    try:
        return b"orchestrator.agent.resident" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def resident_pid(place: dict, env: dict | None = None, bundle: Path | None = None) -> int | None:
    """The pid of the resident serving (``env``, ``bundle``), once it listens on its socket."""
    name = sock_name(place, env)
    b = bundle or place["bundle"]
    pid = _pid(b / (name[: -len(".sock")] + ".lock"))
    return pid if pid and _is_resident(pid) and listening(b / name) else None


def served(place: dict, **kw: object) -> str:
    rc, out, err = check(place, **kw)  # type: ignore[arg-type]
    assert rc == 0, err
    return str(doc_of(out)["served_by"])


def test_the_second_check_is_served_by_the_resident_with_the_same_answer(place) -> None:
    """The first check runs the one-shot and starts a resident (socket 0600, outliving that
    check's process); the next is answered by it: the same document, exit status and errors,
    bad arguments included (the agent's error document, argparse's usage)."""
    rc, out, err = check(place)
    assert (rc, doc_of(out)["served_by"]) == (0, "oneshot"), err
    pid = wait_for(lambda: resident_pid(place), 20, what="the resident's socket")
    sock = place["bundle"] / sock_name(place)
    assert (sock.stat().st_mode & 0o777, sock.stat().st_uid) == (0o600, os.geteuid())
    rc2, out2, err2 = check(place)
    assert (rc2, err2) == (0, err)
    assert doc_of(out2)["served_by"] == "resident"
    assert stable(doc_of(out2)) == stable(doc_of(out))
    assert doc_of(out2)["errors"], "the observation found nothing to say: a weak comparison"
    for bad in (("--containers", '[{"name": "x"}]'), ("--timeout", "soon")):
        by_resident = check(place, *bad)
        assert resident_pid(place) == pid  # still the same one
        os.kill(pid, signal.SIGSTOP)  # the client falls back after ACK_S: the one-shot's answer
        try:
            by_oneshot = check(place, *bad)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert by_resident == by_oneshot and by_resident[0] == 2, (by_resident, by_oneshot)
    assert b"invalid float value: 'soon'" in by_resident[2]


def test_a_stale_socket_file_falls_back_and_a_resident_takes_its_place(place) -> None:
    """A socket file nobody listens on (a resident that died without removing it) is a
    refused connection: the one-shot answers, and the resident it starts replaces the file.
    The file's name is :func:`socket_name`'s: the boot's client computes the same."""
    path = place["bundle"] / sock_name(place)
    cwd = os.getcwd()
    os.chdir(place["bundle"])  # a unix socket's path is limited to 107 bytes
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(cwd)
    assert not listening(path)
    assert served(place) == "oneshot"
    wait_for(lambda: resident_pid(place), 20, what="a resident")
    assert listening(path)
    assert served(place) == "resident"


def test_a_killed_resident_falls_back_and_is_restarted(place) -> None:
    served(place)
    first = wait_for(lambda: resident_pid(place), 20, what="the first resident")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not _is_resident(first), 10, what="the resident gone")
    assert served(place) == "oneshot"
    second = wait_for(lambda: resident_pid(place), 20, what="a new resident")
    assert second != first
    assert served(place) == "resident"


def test_the_resident_exits_after_its_idle_time(place) -> None:
    env = {**place["env"], "ORCH_RESIDENT_IDLE_S": "1"}
    served(place, env=env)
    pid = wait_for(lambda: resident_pid(place, env), 20, what="the resident")
    assert served(place, env=env) == "resident"
    wait_for(lambda: not _is_resident(pid), 15, what="the idle resident's exit")
    assert not (place["bundle"] / sock_name(place, env)).exists()
    assert served(place, env=env) == "oneshot"


def test_a_new_bundle_gets_a_new_resident_and_the_old_one_exits(place) -> None:
    """A bundle of other content is another directory: its own resident; the old resident
    exits when its directory is removed, and a check from that directory (redeployed) is
    served by the one-shot and a resident of its own again."""
    from orchestrator.remote import deploy
    from orchestrator.transport.local import LocalTransport

    old = place["bundle"]
    files = {**deploy.build_bundle().files, "orchestrator/agent/extra.txt": b"new\n"}
    new = Path(
        deploy.ensure_agent(
            LocalTransport(),
            str(place["agent_dir"]),
            sys.executable,
            bundle=deploy.make_bundle(files),
            host=True,
        )
    )
    assert new != old
    served(place)
    old_pid = wait_for(lambda: resident_pid(place), 20, what="the old bundle's resident")
    assert served(place, bundle=new) == "oneshot"
    new_pid = wait_for(lambda: resident_pid(place, bundle=new), 20, what="the new one's")
    assert new_pid != old_pid and served(place, bundle=new) == "resident"
    shutil.rmtree(old)
    wait_for(lambda: not _is_resident(old_pid), 15, what="the old resident's exit")
    assert _is_resident(new_pid)


def test_concurrent_checks_all_get_answers(place) -> None:
    """Each request is served by its own fork of the resident: four checks at once all get
    the resident's answer."""
    from orchestrator.remote.boot import HOST_BOOT

    served(place)
    wait_for(lambda: resident_pid(place), 20, what="the resident")
    argv = [sys.executable, "-S", "-c", HOST_BOOT, str(place["bundle"]), *_argv(place["agent_dir"])]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, env=place["env"], cwd=place["agent_dir"])
        for _ in range(4)
    ]
    got = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert [doc_of(o)["served_by"] for o in got] == ["resident"] * 4


PEER = r"""
import os, socket, sys
os.chdir(sys.argv[1])
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[2])
except OSError as exc:
    print("connect: %s" % type(exc).__name__); sys.exit(0)
req = b"host-observe"
try:
    s.sendall(b"%d\n" % len(req) + req)
except OSError:
    pass  # the resident may have answered and closed already
print("answer: %s" % s.recv(200).decode().strip())
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root, setpriv")
def test_a_peer_of_another_uid_is_refused(place) -> None:
    """``nobody`` cannot open the 0600 socket; let in by its mode, the resident's
    ``SO_PEERCRED`` check refuses it, and goes on serving its own user."""
    served(place)
    pid = wait_for(lambda: resident_pid(place), 20, what="the resident")
    tmp = place["agent_dir"].parent
    for p in (tmp, *tmp.parents):  # the temp directories up to /tmp: traversable
        if p == Path("/tmp") or p.stat().st_uid != os.geteuid():
            break
        p.chmod(p.stat().st_mode | 0o011)
    nobody = [
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "/usr/bin/python3",
        "-S",
        "-c",
        PEER,
        str(place["bundle"]),
        sock_name(place),
    ]

    def as_nobody() -> str:
        p = subprocess.run(nobody, capture_output=True, text=True, timeout=30)
        return p.stdout.strip() or p.stderr.strip()[-300:]

    assert as_nobody() == "connect: PermissionError"
    (place["bundle"] / sock_name(place)).chmod(0o666)
    uid = int(subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True).stdout)
    assert as_nobody() == f"answer: X peer uid {uid} is not the observer's {os.geteuid()}"
    assert resident_pid(place) == pid and served(place) == "resident"


@pytest.mark.parametrize(
    "answer",
    [b'+R 0 500 0\n{"cut', b"+garbage\n", b""],
    ids=["cut-short", "not-an-answer", "closed-unanswered"],
)
def test_a_resident_dying_mid_answer_falls_back_to_the_one_shot(place, answer) -> None:
    """A listener that acknowledges and then dies mid-answer, answers garbage or closes at once
    (a resident crashing while serving): the boot prints the one-shot's answer alone, no
    traceback, and starts a real resident for the next check."""
    import threading

    path = place["bundle"] / sock_name(place)
    cwd = os.getcwd()
    os.chdir(path.parent)  # a unix socket's path is limited to 107 bytes
    try:
        server = socket.socket(socket.AF_UNIX)
        server.bind(path.name)
    finally:
        os.chdir(cwd)
    server.listen(1)

    def serve_once() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    t = threading.Thread(target=serve_once, daemon=True)
    t.start()
    try:
        rc, out, err = check(place)
        t.join(10)
    finally:
        server.close()
    assert not t.is_alive(), "the boot never connected"
    assert (rc, err) == (0, b""), err
    assert doc_of(out)["served_by"] == "oneshot" and out.count(b"\n") == 1
    wait_for(lambda: resident_pid(place), 20, what="a real resident")
    assert served(place) == "resident"
