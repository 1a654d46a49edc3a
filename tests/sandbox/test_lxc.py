"""What only real LXC containers show: namespaces, Proxmox's cgroup layout, lxc-attach's
signals, NVML's host PIDs, two sandboxes side by side. Skipped in process mode."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.agent.procs import alive
from orchestrator.sandbox import lxc, manager
from orchestrator.sandbox.manager import run_pct
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ct(sandbox):  # type: ignore[no-untyped-def]
    if sandbox.isolation != "lxc":
        pytest.skip(f"the session sandbox runs in {sandbox.isolation} mode, not LXC")
    return sandbox


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def _find(sandbox, vmid: int, argv: list[str]) -> int:  # type: ignore[no-untyped-def]
    """Host PID of the process in container ``vmid`` whose argv is ``argv``."""
    return wait_for(
        lambda: next((p for p in sandbox.container_pids(vmid) if _cmdline(p) == argv), 0),
        15,
        what=f"{argv} in ct{vmid}",
    )


def test_init_has_two_pids_and_proxmoxs_cgroup(ct) -> None:  # type: ignore[no-untyped-def]
    init = ct.init_pid("ct200")
    status = Path(f"/proc/{init}/status").read_text()
    nspid = next(line for line in status.splitlines() if line.startswith("NSpid:")).split()[1:]
    assert nspid == [str(init), "1"]
    lines = Path(f"/proc/{init}/cgroup").read_text().splitlines()
    prefix = lxc.cgroup_prefix(ct.state_dir)
    assert lines and all(line.split(":", 2)[2] == f"/{prefix}/lxc/200/ns" for line in lines)
    assert os.readlink(f"/proc/{init}/ns/pid") != os.readlink("/proc/self/ns/pid")
    inside = "echo $$; hostname; tr '\\0' ' ' </proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'"
    out = run_pct(ct.state_dir, "exec", "200", "--", "sh", "-c", inside)
    pid, hostname, init_cmd, seen = out.stdout.splitlines()
    assert hostname == "ct200" and init_cmd.strip() == "/sbin/init"
    # its own PIDs: the host's processes are not there (sizes are no proof: a fresh host's
    # PIDs are small too)
    assert int(pid) != init and int(seen) < 50


def test_a_killed_pct_exec_leaves_its_command_running(ct) -> None:  # type: ignore[no-untyped-def]
    """lxc-attach without a pty forwards no signal: the command outlives pct (lxc attach.c)."""
    argv = ["sleep", "301"]
    proc = subprocess.Popen(
        [str(ct.state_dir / "bin" / "pct"), "exec", "200", "--", *argv],
        env={**os.environ, **ct.env(), "PATH": f"{ct.state_dir / 'bin'}:{os.environ['PATH']}"},
    )
    sleeper = _find(ct, 200, argv)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert alive(sleeper) and _cmdline(sleeper) == argv
    finally:
        os.kill(sleeper, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_non_root_gets_please_run_as_root(ct) -> None:  # type: ignore[no-untyped-def]
    """pve-common RESTEnvironment::setup_default_cli_env dies before any parsing."""
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if not setpriv or not os.access(python, os.X_OK):
        pytest.skip("needs setpriv and /usr/bin/python3 to run pct as nobody")
    out = subprocess.run(
        [
            setpriv,
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            python,
            "-E",
            "-S",
            str(REPO / "orchestrator" / "sandbox" / "bin" / "pct"),
            "status",
            "200",
        ],
        env={**ct.env(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode, out.stderr) == (255, "please run as root\n")


def test_nvml_in_a_container_reports_host_pids(ct, sandbox_scenario) -> None:  # type: ignore[no-untyped-def]
    """Host numbering (the bundled scenarios; drivers up to 535.104.05): inside CT 200 a GPU
    process shows its host PID, which is not the PID the container knows it by (the other
    numbering: tests/agent/test_nvml_pid_numbering.py)."""
    start = run_pct(
        ct.state_dir, "exec", "200", "--", "tmux", "new-session", "-d", "-s", "gpu", "sleep 303"
    )
    assert start.returncode == 0, start.stderr
    try:
        host = _find(ct, 200, ["sleep", "303"])
        inner = lxc.ns_pid_of(host)
        assert inner is not None and inner != host and ct.host_pid(200, inner) == host
        doc = manager.read_scenario(ct.state_dir)
        doc["devices"][0]["processes"] = [{"pid": host, "used_mib": 100}]
        sandbox_scenario({**doc, "name": "host-pid"})
        code = (
            "import os, pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0)\n"
            "print(*[p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)])"
        )
        out = run_pct(ct.state_dir, "exec", "200", "--", sys.executable, "-c", code)
        assert out.stdout.split() == [str(host)], out.stderr
        assert not ct.host_path(200, f"/proc/{host}").exists()  # no such PID inside
    finally:
        run_pct(ct.state_dir, "exec", "200", "--", "tmux", "kill-session", "-t", "gpu")


def test_usr_local_is_the_containers_own(ct) -> None:  # type: ignore[no-untyped-def]
    """/usr is an overlay on the host's: what ct200 installs in /usr/local stays in ct200."""
    tool = ct.host_path(200, "/usr/local/bin/orch-test-tool")
    tool.write_text("#!/bin/sh\necho from-ct200\n")
    tool.chmod(0o755)
    try:
        out = run_pct(ct.state_dir, "exec", "200", "--", "/usr/local/bin/orch-test-tool")
        assert out.stdout == "from-ct200\n"
        assert not ct.host_path(201, "/usr/local/bin/orch-test-tool").exists()
        assert not Path("/usr/local/bin/orch-test-tool").exists()
    finally:
        tool.unlink()


def test_the_operators_python_runs_in_the_container(ct) -> None:  # type: ignore[no-untyped-def]
    code = "import sys, pynvml; print(sys.prefix)"
    out = run_pct(ct.state_dir, "exec", "201", "--", sys.executable, "-c", code)
    assert (out.returncode, out.stdout.strip()) == (0, sys.prefix), out.stderr


def test_two_sandboxes_ct200_side_by_side(ct, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each sandbox has its lxcpath and its cgroup prefix: a second CT 200 runs beside the
    session's, and its ``down`` leaves no container, no cgroup and the first one running."""
    other = manager.up(tmp_path / "b", containers=1, gpus=1, isolation="lxc")
    try:
        a, b = ct.init_pid(200), other.init_pid(200)
        assert a and b and a != b
        cg_b = Path(f"/proc/{b}/cgroup").read_text()
        assert f"/{lxc.cgroup_prefix(other.state_dir)}/lxc/200/ns" in cg_b
        assert Path(f"/proc/{a}/cgroup").read_text() != cg_b
    finally:
        report = manager.down(other.state_dir)
    assert report["containers"] == ["ct200"] and "cgroups_left" not in report
    ls = subprocess.run(
        ["lxc-ls", "-P", str(other.state_dir / "lxc")], capture_output=True, text=True
    )
    assert ls.stdout.strip() == ""
    prefix = lxc.cgroup_prefix(other.state_dir)
    assert not [m for m in lxc.cgroup_mounts() if (m / prefix).exists()]
    assert not alive(b) and ct.init_pid(200) == a
