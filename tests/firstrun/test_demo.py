"""``orch demo`` end to end as a new user runs it (a subprocess, stdin not a terminal), and the
"what is missing" answer on a machine without tmux or a compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import SANDBOX_ISOLATION, wait_for

ORCH = [sys.executable, "-c", "from orchestrator.cli import main; main()"]


def _mentions(pid: str, needle: bytes) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone, or not ours to read
        return False
    return needle in env or needle in cmd


def processes_of(state_dir: Path) -> list[str]:
    """PIDs whose environment or command line names ``state_dir`` (sshd, tmux, agents, trainer)."""
    needle = str(state_dir).encode()
    me = str(os.getpid())
    return [p for p in os.listdir("/proc") if p.isdigit() and p != me and _mentions(p, needle)]


@pytest.fixture
def demo_dir() -> Iterator[Path]:
    # Short and unique: tmux socket paths under it must stay below 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="odt-", dir="/tmp"))
    yield path / "sb"
    if processes_of(path):  # a failed test must not leave a sandbox running
        subprocess.run(
            ORCH + ["sandbox", "down", "--dir", str(path / "sb")],
            timeout=60,
            check=False,
            capture_output=True,
        )


@pytest.fixture
def cpu_hogs() -> Iterator[None]:
    """One busy loop per core for the test's duration: the demo must not need a quiet box."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def run_demo(demo_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(
        ORCH + ["demo", "--dir", str(demo_dir), "--watch", "3", "--json", *extra],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    return proc, time.monotonic() - start


def assert_whole_loop(proc: subprocess.CompletedProcess[str], demo_dir: Path) -> dict[str, Any]:
    """The demo's whole story on screen and in its JSON, and nothing of it left running."""
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out[out.rindex("\n{") :])
    assert "finding: CRITICAL ghost-utilization [GPU 3]" in out
    assert "finding: CRITICAL crashed" in out
    assert {"crashed", "ghost-utilization"} <= {f["kind"] for f in doc["findings"]}
    assert doc["verdict"]["kind"] == "crashed"
    assert "exit status 137" in doc["verdict"]["summary"]
    assert [s["step"] for s in doc["steps"]] == [
        "check",
        "sandbox",
        "launch",
        "watch",
        "fault",
        "detect",
        "fault",
        "detect",
        "postmortem",
        "teardown",
    ]
    # a live run when the ghost appears: the screen never says the run finished
    assert " ct200 running run=" in out and " ct200 finished " not in out
    wait_for(lambda: not processes_of(demo_dir), timeout_s=15, what="demo processes to exit")
    return doc


@pytest.mark.e2e
@pytest.mark.serial
def test_demo_with_an_instant_trainer_on_a_loaded_machine(demo_dir: Path, cpu_hogs: None) -> None:
    """Steps that take a millisecond, and every core busy: the run still lasts until the demo
    kills it, and each step waits for its state (the demo once raced a fast trainer)."""
    proc, _took = run_demo(demo_dir, "--trainer-config", "instant-cpu")
    assert_whole_loop(proc, demo_dir)


@pytest.mark.e2e
def test_demo_with_an_instant_trainer_on_a_quiet_machine(demo_dir: Path) -> None:
    proc, _took = run_demo(demo_dir, "--trainer-config", "instant-cpu")
    assert_whole_loop(proc, demo_dir)


@pytest.mark.e2e
def test_demo_ghost_only_stops_its_run_at_the_end(demo_dir: Path) -> None:
    """Without the kill the run trains until stopped: the demo stops it (recorded as a stop)."""
    proc, _took = run_demo(demo_dir, "--trainer-config", "instant-cpu", "--fault", "ghost")
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out[out.rindex("\n{") :])
    assert [s["step"] for s in doc["steps"]][-3:] == ["stop", "postmortem", "teardown"]
    assert "stopped on request" in out
    assert doc["verdict"]["kind"] == "stopped"
    wait_for(lambda: not processes_of(demo_dir), timeout_s=15, what="demo processes to exit")


def _kill_script(run_dir: Path) -> subprocess.CompletedProcess[str]:
    from orchestrator.firstrun.demo import _KILL_RUN

    return subprocess.run(
        [sys.executable, "-c", _KILL_RUN, str(run_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_kill_step_says_when_the_run_already_ended(tmp_path: Path) -> None:
    """The kill reads the run directory first: an exit status, or a process group that is gone,
    is "already ended" (exit 3), not a failure to kill."""
    from orchestrator.firstrun.demo import KILL_ENDED

    (tmp_path / "pgid").write_text("999999999\n")
    res = _kill_script(tmp_path)
    assert (res.returncode, "is gone" in res.stdout) == (KILL_ENDED, True), res
    (tmp_path / "exit_status").write_text("0\n")
    res = _kill_script(tmp_path)
    assert (res.returncode, res.stdout.strip()) == (KILL_ENDED, "exit status 0")


def test_the_kill_step_kills_the_recorded_process_group(tmp_path: Path) -> None:
    """SIGKILL goes to the whole group the wrapper recorded (the command and its tee)."""
    group = subprocess.Popen(["sh", "-c", "sleep 300 | cat"], start_new_session=True)
    try:
        (tmp_path / "pgid").write_text(f"{group.pid}\n")
        res = _kill_script(tmp_path)
        assert (res.returncode, res.stdout.strip()) == (0, str(group.pid)), res
        assert group.wait(timeout=10) == -9
    finally:
        group.kill()
        group.wait()


@pytest.mark.e2e
def test_demo_runs_the_whole_loop_and_leaves_nothing_behind(demo_dir: Path) -> None:
    """The README's first command as it stands (tiny-cpu trainer)."""
    proc, took = run_demo(demo_dir)
    doc = assert_whole_loop(proc, demo_dir)
    out = proc.stdout
    assert "verdict crashed" in out
    report = Path(doc["report_html"])
    assert report.is_file() and "<html" in report.read_text()[:500].lower()
    assert f"HTML report: {report}" in out
    assert doc["kept"] is False
    assert took < 150, f"the demo took {took:.0f} s"


def test_missing_tools_are_named_with_their_install_commands(tmp_path: Path) -> None:
    """PATH holds python3 only: tmux, ssh-keygen and cc are then missing (sshd is found by its
    absolute path, so it may or may not be reported); nothing is started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    state = tmp_path / "sb"
    proc = subprocess.run(
        ORCH + ["demo", "--dir", str(state)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(bin_dir), "COLUMNS": "200"},
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "orch demo needs what is missing here" in err
    assert "tmux: apt-get install -y tmux" in err
    assert "ssh-keygen: apt-get install -y openssh-client" in err
    assert "a C compiler (cc): apt-get install -y gcc" in err
    assert not state.exists()


@pytest.mark.e2e
def test_demo_refuses_a_directory_where_a_sandbox_runs(demo_dir: Path) -> None:
    """``orch demo --dir D`` with a sandbox already up in D: exit 2 naming D and the way out,
    and that sandbox is left exactly as it was (its sshd, its container)."""
    from orchestrator.sandbox import manager

    manager.up(demo_dir, containers=1, gpus=8, scenario="idle", isolation=SANDBOX_ISOLATION)
    try:
        before = manager.status(demo_dir)
        proc = subprocess.run(
            ORCH + ["demo", "--dir", str(demo_dir)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        after = manager.status(demo_dir)
    finally:
        manager.down(demo_dir)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{demo_dir}: a sandbox already runs there" in proc.stderr, proc.stderr
    assert f"orch sandbox down --dir {demo_dir}" in proc.stderr
    assert after["running"] and after["sshd_pid"] == before["sshd_pid"], after
    assert [c["status"] for c in after["containers"]] == ["running"], after["containers"]
