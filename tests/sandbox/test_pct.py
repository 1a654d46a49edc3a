"""The pct stand-in against the session sandbox: real pct's forms, messages and exit codes.

Run locally with the sandbox sshd's environment (``run_pct``) and, marked e2e, through the real sshd.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.sandbox.manager import run_pct
from tests.helpers import wait_for


def pct(sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    return run_pct(sandbox.state_dir, *args)


def test_exec_passes_exit_status_and_signal(sandbox) -> None:
    assert pct(sandbox, "exec", "200", "--", "sh", "-c", "exit 7").returncode == 7
    assert pct(sandbox, "exec", "200", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15
    out = pct(sandbox, "exec", "200", "--", "printf", "%s|", "a b", "$HOME", "`x`", "")
    assert out.returncode == 0 and out.stdout == "a b|$HOME|`x`||"  # argv, no shell


def test_exec_messages(sandbox) -> None:
    cases = {
        ("exec", "200"): "missing command at /usr/share/perl5/PVE/CLI/pct.pm line 263.\n",
        (
            "exec",
            "299",
            "--",
            "true",
        ): "Configuration file 'nodes/sandbox/lxc/299.conf' does not exist\n",
    }
    for args, err in cases.items():
        out = pct(sandbox, *args)
        assert (out.returncode, out.stderr) == (255, err), args
    opt = pct(sandbox, "exec", "200", "ls", "-la")  # Getopt::Long eats -la without `--`
    assert opt.returncode == 255 and opt.stderr.startswith(
        "Unknown option: la\n400 unable to parse option"
    )
    missing = pct(sandbox, "exec", "200", "--", "no-such-program")
    assert missing.returncode == 127 and 'Failed to exec "no-such-program"' in missing.stderr


def test_exec_environment_and_cwd(sandbox) -> None:
    root = sandbox.container_root(200)
    out = pct(
        sandbox,
        "exec",
        "200",
        "--",
        "sh",
        "-c",
        'pwd; echo "$HOME|$TMUX_TMPDIR|$container|$ORCH_SANDBOX_VMID"; command -v nvidia-smi; '
        "command -v pct || echo no-pct",
    )
    lines = out.stdout.splitlines()
    assert lines[0] == str(root / "root")
    assert lines[1] == f"{root / 'root'}|{root / 'tmp'}|lxc|200"
    assert lines[2] == str(root / "usr" / "bin" / "nvidia-smi") and lines[3] == "no-pct"
    smi = pct(
        sandbox,
        "exec",
        "200",
        "--",
        "nvidia-smi",
        "--query-gpu=index,memory.used,utilization.gpu",
        "--format=csv,noheader",
    )
    assert smi.stdout.splitlines()[0] == "0, 118234 MiB, 98 %"
    clear = pct(sandbox, "exec", "200", "--keep-env", "0", "--", "env")
    assert "container=lxc" in clear.stdout.splitlines() and "HOME=" not in clear.stdout


def test_exec_child_is_in_the_container_cgroup_or_marked(sandbox) -> None:
    out = pct(
        sandbox,
        "exec",
        "201",
        "--",
        "sh",
        "-c",
        "cat /proc/self/cgroup; tr '\\0' '\\n' </proc/self/environ",
    )
    if sandbox.cgroup:
        assert any(line.startswith("0::/lxc/201/ns/") for line in out.stdout.splitlines())
    assert f"ORCH_SANDBOX_CT={sandbox.state_dir}:201" in out.stdout.splitlines()


def test_push_and_pull(sandbox, tmp_path: Path) -> None:
    src = tmp_path / "script.sh"
    src.write_text("#!/bin/sh\necho hi\n")
    src.chmod(0o755)
    root = sandbox.container_root(200)
    assert pct(sandbox, "push", "200", str(src), "/root/pushed.sh").returncode == 0
    mode = stat.S_IMODE((root / "root" / "pushed.sh").stat().st_mode)
    assert mode == 0o666 & ~_umask() and not mode & 0o111  # exec bit lost
    assert (
        pct(
            sandbox, "push", "200", str(src), str(root / "root" / "x.sh"), "--perms", "755"
        ).returncode
        == 0
    )
    assert stat.S_IMODE((root / "root" / "x.sh").stat().st_mode) == 0o755
    bad = pct(sandbox, "push", "200", str(src), "/root/no/such/dir/f")
    assert (bad.returncode, bad.stderr) == (
        255,
        "failed to create file: /root/no/such/dir/f: No such file or directory\n",
    )
    gone = pct(sandbox, "push", "200", str(tmp_path / "nope"), "/root/f")
    assert (gone.returncode, gone.stderr) == (
        255,
        f"failed to open {tmp_path / 'nope'} for reading\n",
    )
    assert (
        pct(sandbox, "push", "200", str(src), "/root/y", "--perms", "9z").stderr
        == "invalid mode: '09z'\n"
    )
    assert pct(sandbox, "pull", "200", "/root/pushed.sh", str(tmp_path / "back")).returncode == 0
    assert (tmp_path / "back").read_text() == src.read_text()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_status_list_stop_start(sandbox, tmp_path: Path) -> None:
    assert pct(sandbox, "status", "202").stdout == "status: running\n"
    listing = pct(sandbox, "list").stdout.splitlines()
    assert listing[0].split() == ["VMID", "Status", "Lock", "Name"]
    assert listing[1].split() == ["200", "running", "ct200"] and len(listing) == 4
    assert (pct(sandbox, "status", "abc").returncode, pct(sandbox, "status", "299").returncode) == (
        255,
        255,
    )
    # a tmux server and a process in ct202; stop kills both
    env = {**os.environ, "TMUX_TMPDIR": str(sandbox.container_root(202) / "tmp")}
    assert (
        pct(
            sandbox, "exec", "202", "--", "tmux", "new-session", "-d", "-s", "train", "sleep 600"
        ).returncode
        == 0
    )
    sock = sandbox.container_root(202) / "tmp" / f"tmux-{os.getuid()}" / "default"
    wait_for(sock.exists, 10, what="tmux socket of ct202")
    pids = _live_marked(f"{sandbox.state_dir}:202")
    assert len(pids) >= 2  # tmux server + sleep
    try:
        assert pct(sandbox, "stop", "202").returncode == 0
        assert pct(sandbox, "status", "202").stdout == "status: stopped\n"
        wait_for(
            lambda: not _live_marked(f"{sandbox.state_dir}:202"), 10, what="ct202 processes gone"
        )
        assert subprocess.run(["tmux", "ls"], env=env, capture_output=True).returncode != 0
        assert pct(sandbox, "exec", "202", "--", "true").stderr == "container '202' not running!\n"
        src = tmp_path / "f"
        src.write_text("x")
        assert (
            pct(sandbox, "push", "202", str(src), "/root/f").stderr
            == "can only push files to a running CT\n"
        )
        assert pct(sandbox, "pull", "202", "/root/f", str(tmp_path / "g")).stderr.startswith(
            "can only pull files from a running VM at "
        )
        assert pct(sandbox, "stop", "202").stderr == "CT 202 not running\n"
    finally:
        assert pct(sandbox, "start", "202").returncode == 0
    assert pct(sandbox, "status", "202").stdout == "status: running\n"


def _live_marked(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if (
                f"ORCH_SANDBOX_CT={marker}".encode() in (p / "environ").read_bytes().split(b"\0")
                and (p / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
            ):
                found.append(int(p.name))
        except OSError:
            continue
    return found


@pytest.mark.e2e
def test_through_the_real_sshd(sandbox) -> None:
    ssh = shutil.which("ssh")
    if not ssh:
        pytest.skip("ssh client not installed (apt-get install -y openssh-client)")
    base = [
        ssh,
        "-p",
        str(sandbox.port),
        "-i",
        str(sandbox.identity_file),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={sandbox.known_hosts_path}",
        "-o",
        "StrictHostKeyChecking=yes",
        "127.0.0.1",
    ]
    out = subprocess.run(
        [
            *base,
            "pct exec 200 -- sh -c 'nvidia-smi --query-gpu=index --format=csv,noheader "
            "| wc -l; exit 3'",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (out.returncode, out.stdout.strip()) == (3, "8")
    out = subprocess.run(
        [*base, "pct status 200; dmesg | head -1"], capture_output=True, text=True, timeout=30
    )
    assert out.stdout.startswith("status: running\n[") and "NVRM" in out.stdout
