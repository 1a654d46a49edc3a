"""``orch watch`` in a real tmux pane against the sandbox: send-keys drive it, capture-pane reads it."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class Pane:
    """A tmux server of our own (``-L``) with one 80x24 pane running a command."""

    def __init__(self, command: list[str], cwd: str) -> None:
        self.sock = f"orch-views-{uuid.uuid4().hex[:8]}"
        line = shlex.join(command) + '; echo "EXITED rc=$?"; sleep 120'
        self.tmux("new-session", "-d", "-x", "80", "-y", "24", "-c", cwd, line)

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def row(self, name: str) -> str:
        """The dashboard line of target ``name`` ('' when not on screen)."""
        return next(
            (line for line in self.screen().splitlines() if re.search(rf"\b{name}\b\s", line)), ""
        )

    def wait(self, pred, timeout_s: float, what: str) -> str:
        try:

            def ready() -> str:
                screen = self.screen()
                return screen if pred(screen) else ""

            return wait_for(ready, timeout_s, 0.25, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- screen ---\n{self.screen()}") from None

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def pane_for(fleet):
    panes = []

    def start(*args: str) -> Pane:
        p = Pane(
            [sys.executable, "-m", "orchestrator.cli", "-c", fleet.config, "watch", *args],
            cwd=str(fleet.state_dir),
        )
        panes.append(p)
        return p

    yield start
    for p in panes:
        p.close()


def test_watch_dashboard_follows_ghost_crash_and_lost_host(fleet, pane_for):
    fleet.scenario("healthy")
    fleet.launch("ct200")
    pane = pane_for("--interval", "1")
    pane.wait(
        lambda s: " running " in pane.row("ct200") and " idle" in pane.row("ct201"),
        60,
        "ct200 running and ct201 idle",
    )
    assert all(len(line) <= 80 for line in pane.screen().splitlines())
    assert "tok/s" in pane.row("ct200")

    # the ghost GPU (seed 000): GPU 3 at 100 % with 0 MiB gets flagged with its playbook
    fleet.scenario("ghost")
    screen = pane.wait(lambda s: "ghost-utilization GPU 3" in s, 30, "the ghost GPU flagged")
    assert "ghost" in screen.split("ghost-utilization GPU 3", 1)[1].splitlines()[0].lower()
    fleet.scenario("healthy")
    pane.wait(lambda s: "ghost-utilization" not in s, 30, "the ghost finding to clear")

    # detail view by keys, and back
    pane.keys("Enter")
    pane.wait(
        lambda s: "GPU 3  target" in s and "GPU 7  drafter" in s and "step=" in s, 15, "detail view"
    )
    pane.keys("Escape")
    pane.wait(lambda s: "ct201" in s, 15, "back to the dashboard")

    # a killed trainer turns "crashed"
    fleet.kill_trainer("ct200")
    pane.wait(lambda s: " crashed " in pane.row("ct200"), 30, "ct200 crashed")
    fleet.launch("ct200")
    pane.wait(lambda s: " running " in pane.row("ct200"), 30, "ct200 running again")

    # a stopped sshd: unreachable since HH:MM:SS, never dead; back to running after restart
    fleet.stop_sshd()
    try:
        pane.wait(
            lambda s: (
                re.search(r"unreachable since \d\d:\d\d:\d\d", pane.row("ct200"))
                and "unreachable since" in pane.row("ct201")
            ),
            60,
            "both targets unreachable",
        )
        assert " dead " not in pane.screen() and " crashed " not in pane.screen()
    finally:
        fleet.start_sshd()
    pane.wait(
        lambda s: " running " in pane.row("ct200") and " idle" in pane.row("ct201"),
        90,
        "ct200 running again after sshd restarted",
    )

    # Ctrl-C leaves cleanly (exit 0, terminal restored: the shell's echo is on the normal screen)
    pane.keys("C-c")
    screen = pane.wait(lambda s: "EXITED rc=" in s, 15, "watch to exit")
    assert "EXITED rc=0" in screen
    assert "orch watch" not in screen  # the alternate screen is gone


def test_watch_one_target_opens_detail_and_q_quits(fleet, pane_for):
    fleet.scenario("healthy")
    fleet.launch("ct200")
    pane = pane_for("ct200", "--interval", "1")
    pane.wait(
        lambda s: "GPU 0  target" in s and "GPU 5  drafter" in s and "step=" in s, 60, "detail view"
    )
    assert "ct201" not in pane.screen()
    pane.keys("q")
    assert "EXITED rc=0" in pane.wait(lambda s: "EXITED rc=" in s, 15, "watch to exit on q")


@pytest.mark.parametrize("observe", ["host", "container"])
def test_watch_plain_prints_one_line_per_change(fleet, observe, tmp_path):
    """The same on both paths: one stream per host (default), or one agent per container."""
    fleet.scenario("healthy")
    fleet.launch("ct200")
    config = fleet.config_for(observe, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "-c", config, "watch", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        wait_for(
            lambda: (lines.append(proc.stdout.readline()), "ct200 running" in lines[-1])[1],
            60,
            what="a plain line for ct200",
        )
        fleet.kill_trainer("ct200")
        wait_for(
            lambda: (lines.append(proc.stdout.readline()), "ct200 crashed" in lines[-1])[1],
            30,
            what="a plain line saying crashed",
        )
        assert all(not line.startswith("\x1b") for line in lines)  # not a TTY: no screen control
    finally:
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


def test_watch_esc_leaves_the_detail_view_with_one_target(fleet, tmp_path):
    """An inventory of one container: Enter opens its detail view, Esc goes back (a one-row
    dashboard is still a dashboard)."""
    import yaml

    from tests.firstrun.tmuxpane import Pane as Tmux

    doc = yaml.safe_load(Path(fleet.config).read_text())
    doc["containers"] = {"ct200": doc["containers"]["ct200"]}
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(doc, sort_keys=False))
    one.chmod(0o600)
    fleet.scenario("healthy")
    fleet.launch("ct200")
    argv = [sys.executable, "-m", "orchestrator.cli", "-c", str(one), "watch", "--interval", "1"]
    pane = Tmux(argv, env={"TERM": "xterm-256color", "PYTHONPATH": os.getcwd()}, cwd=str(tmp_path))
    try:
        pane.wait_text("ct200")
        detail = "GPU 0  target"
        assert detail not in pane.text()
        pane._tmux("send-keys", "-t", "t", "Enter")
        pane.wait_text(detail)
        pane._tmux("send-keys", "-t", "t", "Escape")
        wait_for(
            lambda: detail not in pane._tmux("capture-pane", "-p", "-t", "t") or None,
            15,
            0.1,
            "Esc to leave the detail view",
        )
        pane._tmux("send-keys", "-t", "t", "q")
        assert pane.exit_status(timeout_s=15) == 0
    finally:
        pane.close()
