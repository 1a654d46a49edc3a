"""``orch watch``'s detail view lists a run's GPU processes as nvitop does, driven in a real
tmux pane (200x50) against real LXC containers observed from the host: the run's trainer and a
process of a user only the container's /etc/passwd names each hold a GPU (host PIDs in the fake
driver, as NVML gives them on the host); the screen shows their PIDs inside the container,
their users and commands, and the ghost GPU's row highlighted (read with ``capture-pane -e``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.firstrun.tmuxpane import Pane
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.unprivileged]
ROOT = Path(__file__).resolve().parents[2]
TRAINEE = "trainee:x:1234:1234::/tmp:/bin/sh\n"
"""A user only the container's passwd names (the host's has no uid 1234 of that name)."""


def inside(info, name: str, argv0: bytes) -> tuple[int, int] | None:
    """(host PID, PID inside) of the container's process whose cmdline starts with ``argv0``."""
    for host in info.container_pids(name):
        try:
            if not Path(f"/proc/{host}/cmdline").read_bytes().startswith(argv0):
                continue
            status = Path(f"/proc/{host}/status").read_text()
        except OSError:
            continue
        return host, int(next(x for x in status.splitlines() if x.startswith("NSpid:")).split()[-1])
    return None


def _row(screen: str, gpu: int, pid: int) -> str:
    return next(
        (line for line in screen.splitlines() if re.match(rf"\s+{gpu}\s+{pid}\s", line)), ""
    )


def test_detail_view_lists_the_runs_gpu_processes(fleet) -> None:
    from orchestrator.sandbox import manager

    if fleet.info.isolation != "lxc":
        pytest.skip("PIDs inside a container take real containers (LXC)")
    fleet.scenario("healthy")
    fleet.launch("ct200")
    trainer = wait_for(
        lambda: inside(fleet.info, "ct200", b"bash\x00-c\x00i=0; while true"),
        30,
        what="the run's trainer in ct200",
    )
    passwd = fleet.info.host_path("ct200", "/etc/passwd")
    if TRAINEE not in passwd.read_text():
        with passwd.open("a") as fh:
            fh.write(TRAINEE)
    env = {
        **os.environ,
        **fleet.info.env(),
        "PATH": f"{fleet.info.state_dir / 'bin'}:{os.environ['PATH']}",
    }
    sleeper = subprocess.Popen(
        [
            str(fleet.info.state_dir / "bin" / "pct"),
            "exec",
            "200",
            "--",
            "setpriv",
            "--reuid=1234",
            "--regid=1234",
            "--clear-groups",
            "sleep",
            "600.8",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pane, other = None, None
    try:
        other = wait_for(
            lambda: inside(fleet.info, "ct200", b"sleep\x00600.8\x00"),
            30,
            what="trainee's sleep in ct200",
        )
        _name, doc = manager.load_scenario("healthy")
        doc["devices"][0]["processes"] = [{"pid": trainer[0], "used_mib": 117712}]
        doc["devices"][1]["processes"] = [{"pid": other[0], "used_mib": 2048}]
        doc["devices"][3].update(util_pct=100, mem_used_mib=0, processes=[])  # the ghost GPU
        manager.set_scenario(fleet.state_dir, {**doc, "name": "healthy-procs"})

        argv = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "-c",
            fleet.config,
            "watch",
            "--interval",
            "1",
        ]
        # the pane's own size (200x50), whatever COLUMNS/LINES this test process inherited:
        # rich prefers them to the terminal's
        size = {"COLUMNS": "200", "LINES": "50"}
        pane = Pane(
            argv, env={"TERM": "xterm-256color", "PYTHONPATH": str(ROOT), **size}, cwd=str(ROOT)
        )
        pane.wait_text("ct201", timeout_s=60)
        pane._tmux("send-keys", "-t", "t", "Down")
        pane.wait_text("▶ ct201")
        pane._tmux("send-keys", "-t", "t", "Up")
        pane.wait_text("▶ ct200")
        pane._tmux("send-keys", "-t", "t", "Enter")

        def table() -> str | None:
            s = pane._tmux("capture-pane", "-p", "-t", "t")
            return s if _row(s, 0, trainer[1]) and _row(s, 1, other[1]) else None

        shown = wait_for(table, 60, 0.25, "the process table of ct200")
        assert trainer[1] != trainer[0] and other[1] != other[0]  # the PIDs inside, not the host's
        uid = Path(f"/proc/{other[0]}/status").read_text().split("Uid:")[1].split()[0]
        assert uid in ("1234", "101234")  # privileged, or unprivileged: mapped back to 1234
        run = _row(shown, 0, trainer[1]).split(None, 4)
        assert run[2:4] == ["root", "115.0GiB"] and run[4].split(None, 1)[1].startswith(
            "bash -c i=0; while true; do"
        ), run
        theirs = _row(shown, 1, other[1]).split()
        assert theirs[2:4] == ["trainee", "2048MiB"] and theirs[-2:] == ["sleep", "600.8"], theirs
        assert re.search(r"GPU\s+PID\s+USER\s+GPU-MEM\s+%CPU\s+COMMAND", shown)
        assert "115.5GiB / 140.4GiB" in shown and "0B / 140.4GiB" in shown  # nvitop's sizes
        assert "NVIDIA H200  00000000:18:00.0" in shown, shown  # name and bus id

        # the ghost GPU's label is highlighted (bold white on red), a busy one's is not
        def coloured() -> str | None:
            c = pane._tmux("capture-pane", "-p", "-e", "-t", "t")
            return c if "busy, no memory" in c else None

        colours = wait_for(coloured, 30, 0.25, "the ghost row")
        ghost = next(line for line in colours.splitlines() if "GPU 3" in line)
        busy = next(line for line in colours.splitlines() if "GPU 0" in line)
        red_bg = r"\x1b\[(?:[0-9;]*;)?41(?:;[0-9;]*)?m(?:\x1b\[[0-9;]*m)*"  # SGR 41: red background
        assert re.search(red_bg + "GPU 3", ghost), repr(ghost)
        assert not re.search(red_bg + "GPU 0", busy), repr(busy)
        pane._tmux("send-keys", "-t", "t", "q")
        assert pane.exit_status(timeout_s=15) == 0
    finally:
        if pane is not None:
            pane.close()
        if other is not None:
            fleet.info.kill("ct200", other[1])
        sleeper.kill()
        sleeper.wait(10)
        fleet.scenario("healthy")
