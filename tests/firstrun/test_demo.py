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

import pytest

from tests.helpers import wait_for

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
        subprocess.run(ORCH + ["sandbox", "down", "--dir", str(path / "sb")], timeout=60,
                       check=False, capture_output=True)  # fmt: skip


@pytest.mark.e2e
def test_demo_runs_the_whole_loop_and_leaves_nothing_behind(demo_dir: Path) -> None:
    start = time.monotonic()
    proc = subprocess.run(
        ORCH + ["demo", "--dir", str(demo_dir), "--watch", "3", "--json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )
    took = time.monotonic() - start
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out[out.rindex("\n{") :])

    # the findings, as printed and as data
    assert "ghost-utilization [GPU 3]" in out and "finding: " in out
    assert "finding: CRITICAL crashed" in out
    kinds = {f["kind"] for f in doc["findings"]}
    assert {"crashed", "ghost-utilization"} <= kinds
    # the verdict, printed and with its HTML report on disk
    assert doc["verdict"]["kind"] == "crashed"
    assert "exit status 137" in doc["verdict"]["summary"]
    assert "verdict crashed" in out
    report = Path(doc["report_html"])
    assert report.is_file() and "<html" in report.read_text()[:500].lower()
    assert f"HTML report: {report}" in out
    # every step reported with its duration; the live view printed plain lines
    assert [s["step"] for s in doc["steps"]] == [
        "check", "sandbox", "launch", "watch", "fault", "detect", "fault", "detect",
        "postmortem", "teardown",
    ]  # fmt: skip
    assert " ct200 running run=" in out
    assert doc["kept"] is False

    # nothing of its state dir is left running: sshd, tmux, agents, trainer, recorder
    wait_for(lambda: not processes_of(demo_dir), timeout_s=15, what="demo processes to exit")
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
