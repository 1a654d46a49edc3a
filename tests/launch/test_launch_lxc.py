"""A run launched into a real LXC container sees what it would on Proxmox, minus pct's traps:
its own small PIDs, ``/usr/local/bin`` on PATH (pip's torchrun), nothing of the operator's
environment. Skipped in process mode (no namespaces, no /usr/local of its own)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.cli import run
from orchestrator.sandbox import control
from orchestrator.sandbox.info import vmid_of
from orchestrator.transport.pct import BASE_ENV
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.unprivileged]

SESSION = "lxc-e2e"
TOOL = "/usr/local/bin/orch-lxc-e2e-tool"  # where `pip install` puts torchrun & co.
CMD = 'echo "pid=$$"; echo "ppid=$PPID"; orch-lxc-e2e-tool; env | sed "s/^/env:/"; sleep 60'


@pytest.fixture
def lxc_sandbox(sandbox):  # type: ignore[no-untyped-def]
    if sandbox.isolation != "lxc":
        pytest.skip(f"the session sandbox runs in {sandbox.isolation} mode, not LXC")
    return sandbox


DIRTY = {
    "SSH_CONNECTION": "10.9.9.9 50000 10.9.9.1 22",
    "XDG_SESSION_ID": "42",
    "OPERATOR_ONLY": "from-the-operators-shell",
}
"""What an operator's shell had when it started (or last fed) the container's tmux server."""


def _dirty_tmux_server(sb) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    """Make the container's tmux server's global environment an operator's: start it from a
    shell with :data:`DIRTY` (or, when one runs already, set them globally, which is what a
    new pane inherits either way). Returns the undo."""
    vmid = str(vmid_of("ct200"))
    sets = [a for k, v in DIRTY.items() for a in (";", "set-environment", "-g", k, v)]
    shell = ["env", *(f"{k}={v}" for k, v in DIRTY.items())]
    res = control.run_pct(
        sb.state_dir,
        "exec",
        vmid,
        "--",
        *shell,
        "tmux",
        "new-session",
        "-A",
        "-d",
        "-s",
        "operator",
        "sleep 600",
        *sets,
    )
    assert res.returncode == 0, res.stderr

    def undo() -> None:
        unset = [a for k in DIRTY for a in (";", "set-environment", "-gu", k)]
        control.run_pct(
            sb.state_dir, "exec", vmid, "--", "tmux", "kill-session", "-t", "=operator", *unset
        )

    return undo


def test_a_run_sees_its_own_pids_usr_local_bin_and_no_operator_env(
    lxc_sandbox, sandbox_config, sandbox_scenario, capsys, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Even when the container's tmux server was started by an operator's shell with SSH_*,
    XDG_* and its own variables, the run sees none of them."""
    sb = lxc_sandbox
    sandbox_scenario("idle")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/operator-agent.sock")  # the operator's own
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    config = str(sandbox_config(SESSION))
    tool = sb.host_path("ct200", TOOL)
    tool.write_text("#!/bin/sh\necho tool-ran\n")
    tool.chmod(0o755)
    undo = _dirty_tmux_server(sb)
    try:
        code = run(
            [
                "-c",
                config,
                "launch",
                "ct200",
                "--cmd",
                CMD,
                "--name",
                "lxc",
                "--no-verify",
                "--json",
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err + out
        log = sb.host_path("ct200", json.loads(out)["log_path"])
        text = wait_for(
            lambda: "env:PATH=" in log.read_text() and log.read_text(),
            30,
            what="the run's output in its log",
        )
        pid = int(next(x for x in text.splitlines() if x.startswith("pid="))[4:])
        host = sb.host_pid("ct200", pid)  # the same shell, as the host numbers it
    finally:
        run(["-c", config, "stop", "ct200", "--grace", "3"])
        capsys.readouterr()
        undo()
        Path(tool).unlink()
    lines = text.splitlines()
    env = dict(x[4:].split("=", 1) for x in lines if x.startswith("env:") and "=" in x)
    assert "tool-ran" in lines, lines  # found by name on the PATH orch gave it
    assert env["PATH"] == BASE_ENV["PATH"] and env["HOME"] == "/root", env
    assert env["PATH"].startswith("/usr/local/sbin:/usr/local/bin:") and env["LANG"] == "C.UTF-8"
    leaked = sorted(
        k
        for k in env
        if k.startswith(("SSH_", "XDG_", "ORCH_SANDBOX", "LD_LIB")) or k in DIRTY or k == "TMUX"
    )
    assert not leaked, leaked
    # its PID is the container's own, not the one the host knows it by (host_pid maps it
    # through NSpid; comparing sizes would race a fresh host, whose PIDs are small too)
    assert host is not None and pid != host, (pid, host)
